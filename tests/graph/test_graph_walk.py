"""The one graph walker (dpteach/graph/walk.py): the live grad_fns it hands back; auto-collapse."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import dpteach
from dpteach.data_parallel import step
from dpteach.graph.autograd import walked_graph
from dpteach.graph.view import collapse, make_view

STRATEGIES = list(dpteach.STRATEGIES)  # history order, from the one registry


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(2, 3), nn.Tanh(), nn.Linear(3, 1))


def convnet() -> nn.Module:  # modules three deep, and BatchNorm: collapse has depths to pick from
    def block(c: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU())

    return nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.Sequential(block(4), block(4)), nn.Flatten(), nn.Linear(4 * 6 * 6, 2)
    )


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_handles_are_the_live_grad_fns_behind_the_nodes(strategy):
    model = mlp()
    done = step(model, torch.randn(4, 2), ["cpu", "cpu"], strategy=strategy, backward=False)
    loss, replicas = done.loss, done.replicas
    g, handles = walked_graph(loss, model, replicas, handles=True)
    # every backward function and every leaf has its grad_fn; outputs and non-leaf named tensors do not
    want = {n.id for n in g.nodes.values() if n.reached and (n.kind in ("op", "join") or n.leaf)}
    assert set(handles.fns) == want
    for nid, fn in handles.fns.items():
        n = g.nodes[nid]
        if n.leaf:  # a leaf's handle is the AccumulateGrad that writes its .grad: of that very tensor
            assert type(fn).__name__ == "AccumulateGrad" and fn.variable.shape == n.shape
        else:
            assert type(fn).__name__ == n.op
    assert handles.fns[g.children("output")[0]] is loss.grad_fn  # the first node is the loss's own grad_fn
    for nid, entries in handles.entries.items():
        # the entries, duplicates dropped, are the node's edges in order
        assert list(dict.fromkeys(child for _, child in entries)) == g.children(nid), nid
        if nid in handles.fns:  # and each entry index points at a real next_functions entry
            fns = handles.fns[nid].next_functions
            assert all(i < len(fns) and fns[i][0] is not None for i, _ in entries), nid


def test_no_handles_unless_asked():
    model = mlp()
    g, handles = walked_graph(model(torch.randn(3, 2)).sum(), model)
    assert handles is None and "output" in g.nodes


def test_auto_collapse_picks_the_finest_depth_that_fits():
    model = convnet()
    done = step(model, torch.randn(4, 1, 8, 8), ["cpu", "cpu"], strategy="rewire", backward=False)
    loss, replicas = done.loss, done.replicas
    g, _ = walked_graph(loss, model, replicas)
    nodes, edges = g._drawn_parts()
    sizes = {d: len(collapse(nodes, edges, d)[0]) for d in range(1, 5)}
    assert sizes[1] < sizes[3] < len(nodes)  # collapsing merges, and merges less the deeper it goes
    view = make_view(nodes, edges, "t", None, sizes[2])
    assert len(view.nodes) == sizes[2] and "depth 2" in view.notes[0]


@pytest.mark.parametrize("slots", [1, 2])
def test_the_loss_and_gather_sit_in_no_replica_box_even_with_one_slot(slots):
    # with one slot every op above the replica reaches slot 0's parameters alone; the gather is still
    # where the replicas' outputs meet, so it and the loss above it belong to no slot
    model = mlp()
    done = step(model, torch.randn(4, 2), ["cpu"] * slots, strategy="rewire", backward=False)
    g, _ = walked_graph(done.loss, model, done.replicas)
    (gather,) = [n.id for n in g.nodes.values() if n.op == "GatherBackward"]
    above = g.path("output", gather)  # the output, the loss's node, the gather
    assert len(above) >= 3 and all(g.nodes[i].slot is None for i in above), [g.nodes[i] for i in above]
    inside = [n for n in g.nodes.values() if n.op in ("AddmmBackward0", "TanhBackward0")]
    assert inside and all(n.slot is not None for n in inside)  # the replicas' own ops keep their box
