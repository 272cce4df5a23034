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
