"""Chapter 03: the facts its prose states about ReduceAdd's node and a rewired replica."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import dpteach
from dpteach import autograd_graph
from dpteach.course import story
from dpteach.replicate import ReduceAdd

CPU2 = ["cpu", "cpu"]


def loss_of(model, replicas):
    """Chapter 03's forward: scatter, one replica per slot, gather, the MSE loss."""
    x, y = story.make_data()
    outputs = dpteach.parallel_apply(replicas, [(p,) for p in dpteach.scatter(x, CPU2)], devices=CPU2)
    return nn.functional.mse_loss(dpteach.gather(outputs, "cpu"), y)


class SpyReduceAdd(ReduceAdd):
    """ReduceAdd that keeps the ctx its forward was handed."""

    seen: list = []

    @staticmethod
    def forward(ctx, original, *copies):
        SpyReduceAdd.seen.append(ctx)
        return ReduceAdd.forward(ctx, original, *copies)


def test_ctx_is_the_backward_node_named_after_the_class():
    model = story.make_model()
    copies = [replica[0].weight.detach() for replica in dpteach.replicate(model, CPU2, strategy="clone")]
    outputs = SpyReduceAdd.apply(model[0].weight, *copies)
    ctx = SpyReduceAdd.seen[-1]
    assert all(out.grad_fn is ctx for out in outputs)  # the fold: ctx is the node itself
    assert type(ctx).__name__ == "SpyReduceAddBackward"  # the class plus "Backward"


def test_apply_records_no_node_without_grad_mode_or_an_input_that_requires_grad():
    model = story.make_model()
    copies = [replica[0].weight.detach() for replica in dpteach.replicate(model, CPU2, strategy="clone")]
    with torch.no_grad():
        assert all(out.grad_fn is None for out in ReduceAdd.apply(model[0].weight, *copies))
    frozen = model[0].weight.detach()
    assert all(out.grad_fn is None for out in ReduceAdd.apply(frozen, *copies))


def test_a_rewired_replica_lists_no_parameters_and_an_optimizer_refuses_it():
    model = story.make_model()
    replica = dpteach.replicate(model, CPU2, strategy="rewire")[1]
    assert list(replica.parameters()) == []
    with pytest.raises(ValueError, match="empty parameter list"):
        torch.optim.SGD(replica.parameters(), lr=0.1)
    assert list(replica.state_dict()) == [] and list(model.buffers()) == []  # empty: no buffers either


def test_the_table_counts_the_replica_copies_accumulate_grad_nodes():
    model = story.make_model()
    counts = []
    for strategy in ("clone", "rewire"):
        replicas = dpteach.replicate(model, CPU2, strategy=strategy)
        graph = autograd_graph(loss_of(model, replicas), module=model, replicas=replicas)
        counts.append(sum(n.kind == "replica" and n.leaf for n in graph.nodes.values()))
    assert counts == [2 * 4, 0]  # clone: every copy on both slots is a leaf; rewire: none is


def test_grad_fn_is_read_only_and_a_rewired_copy_shares_the_clones_storage():
    """The fold on the C++ fix: Python cannot assign .grad_fn, so "rewire" hands the replica the
    node's output, a new tensor on the clone's storage."""
    with pytest.raises(AttributeError):
        torch.zeros(2).grad_fn = None
    model = story.make_model()
    replicas = dpteach.replicate(model, CPU2, strategy="clone")
    leaves = [replica[0]._parameters["weight"] for replica in replicas]
    outputs = ReduceAdd.apply(model[0].weight, *[leaf.detach() for leaf in leaves])
    assert all(out is not leaf and out.data_ptr() == leaf.data_ptr() for out, leaf in zip(outputs, leaves))


def test_the_fix_keeps_every_replica_box_and_adds_only_edges_out_of_them():
    """ "What the fix changed": the pictures keep one box per replica parameter and the edge into it;
    what is new is box -> ReduceAddBackward, one per replica parameter, and ReduceAddBackward ->
    original, one per parameter."""
    model = story.make_model()
    graphs = []
    for strategy in ("clone", "rewire"):
        replicas = dpteach.replicate(model, CPU2, strategy=strategy)
        graphs.append(autograd_graph(loss_of(model, replicas), module=model, replicas=replicas))
    before, after = graphs
    boxes = {i for i, n in before.nodes.items() if n.kind == "replica"}
    assert len(boxes) == 2 * 4 and {i for i, n in after.nodes.items() if n.kind == "replica"} == boxes
    diff = dpteach.graph_diff(before, after)
    assert not diff.removed  # the edge into each box stays
    out_of_boxes = [e for e in diff.added if e.src in boxes]
    into_originals = [e for e in diff.added if e.src not in boxes]
    assert len(out_of_boxes) == 8 and all(after.nodes[e.dst].op == "ReduceAddBackward" for e in out_of_boxes)
    assert len(into_originals) == 4
    assert all(
        after.nodes[e.src].op == "ReduceAddBackward" and after.nodes[e.dst].kind == "original"
        for e in into_originals
    )


def test_broadcast_makes_every_copy_in_one_node_whose_backward_sums_per_parameter():
    """ "Rewire beside broadcast": one Broadcast call makes every copy, so one BroadcastBackward node has
    all of them as outputs, its edges lead to the originals, and its backward sums per parameter."""
    model = story.make_model()
    replicas = dpteach.replicate(model, CPU2, strategy="broadcast")
    tensors = [t for r in replicas for t in (r[0].weight, r[0].bias, r[2].weight, r[2].bias)]
    nodes = {t.grad_fn for t in tensors}
    assert len(nodes) == 1 and type(next(iter(nodes))).__name__ == "BroadcastBackward"
    assert [fn.variable for fn, _ in next(iter(nodes)).next_functions] == list(model.parameters())
    loss = loss_of(model, replicas)
    received = torch.autograd.grad(loss, tensors, retain_graph=True)
    loss.backward()
    for k, original in enumerate(model.parameters()):
        assert torch.allclose(original.grad, received[k] + received[4 + k])  # per parameter, over the slots
