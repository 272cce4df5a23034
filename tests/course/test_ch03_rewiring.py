"""Chapter 03: the facts its prose states about ReduceAdd's node and a rewired replica."""

from __future__ import annotations

from pathlib import Path

import nbformat
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


def test_apply_makes_the_node_before_forward_even_when_no_output_gets_it():
    """The fold on custom Functions: ``apply`` creates the node (``ctx``) first; grad mode and
    ``requires_grad`` decide only whether the outputs get it as their ``grad_fn``."""
    model = story.make_model()
    copies = [replica[0].weight.detach() for replica in dpteach.replicate(model, CPU2, strategy="clone")]
    made = len(SpyReduceAdd.seen)
    with torch.no_grad():
        outputs = SpyReduceAdd.apply(model[0].weight, *copies)
    assert len(SpyReduceAdd.seen) == made + 1  # forward was handed a fresh ctx ...
    assert type(SpyReduceAdd.seen[-1]).__name__ == "SpyReduceAddBackward"  # ... the node's own class
    assert all(out.grad_fn is None for out in outputs)  # ... that no output carries


DATA_PARALLEL_H = (
    Path(torch.__file__).parent / "include/torch/csrc/api/include/torch/nn/parallel/data_parallel.h"
)


def test_the_cpp_fix_gives_each_node_its_edge_before_set_history_and_rewires_grad_buffers_too():
    """The fold on the C++ fix, against the installed header: the node's edge to the original comes
    from set_next_edges(collect_next_edges(...)), then set_history makes each copy its output; grad-
    requiring buffers get the same, and the function recurses into the children."""
    source = DATA_PARALLEL_H.read_text()
    body = source[source.index("void replicate_grad_edges(") :]
    body = body[: body.index("\nnamespace parallel")]
    edge = body.index("grad_fn->set_next_edges(autograd::collect_next_edges(*parameter));")
    assert edge < body.index("autograd::set_history(replicas[i]->parameters_[parameter.key()], grad_fn);")
    buffers = body.index("if (buffer.value().requires_grad())")
    assert body.index("grad_fn->set_next_edges(autograd::collect_next_edges(*buffer));") > buffers
    assert "autograd::set_history(replicas[i]->buffers_[buffer.key()], grad_fn);" in body
    assert "replicate_grad_edges(*child, child_replicas, devices);" in body
    fold = next(c.source for c in _chapter_cells() if c.id == "c03-cpp-fold")
    assert "set_next_edges(autograd::collect_next_edges(*parameter))" in fold and "buffer" in fold


def test_rewire_gives_a_buffer_that_requires_grad_its_node_and_leaves_the_others():
    """As in C++ (and the summary): one node per buffer that requires grad, none for other buffers."""

    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 1)
            self.register_buffer("scale", torch.ones(1, requires_grad=True))
            self.register_buffer("count", torch.zeros(1))

        def forward(self, x):
            return self.lin(x) * self.scale

    model = Scaled()
    replicas = dpteach.replicate(model, CPU2, strategy="rewire")
    assert [type(r.scale.grad_fn).__name__ for r in replicas] == ["ReduceAddBackward"] * 2
    assert all(r.count.grad_fn is None for r in replicas)
    x = torch.randn(4, 2)
    outputs = dpteach.parallel_apply(replicas, [(p,) for p in dpteach.scatter(x, CPU2)], devices=CPU2)
    dpteach.gather(outputs, "cpu").sum().backward()
    assert torch.allclose(model.scale.grad, model.lin(x).sum().detach())  # the sum over both slots


def _chapter_cells():
    chapter = Path(__file__).resolve().parents[2] / "notebooks" / "03_rewiring_gradient_edges.ipynb"
    return nbformat.read(chapter, as_version=4).cells
