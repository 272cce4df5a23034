"""graph_diff and compare_strategies: what PR #20910 changed in the graph, edge by edge."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpteach.data_parallel import step
from dpteach.graph import autograd_graph, compare_strategies, graph_diff

DEVICES = ["cpu", "cpu"]


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(2, 3), nn.Tanh(), nn.Linear(3, 1))


@pytest.fixture
def comparison():
    return compare_strategies(mlp(), torch.randn(4, 2), DEVICES)


def pairs(edges) -> set[tuple[str, str]]:
    return {(e.src, e.dst) for e in edges}


NAMES = [
    "0.weight",
    "0.bias",
    "2.weight",
    "2.bias",
]  # mlp()'s parameters, written out: not read off the graph under test
DEAD_ENDS = {
    (slot, n) for slot in range(len(DEVICES)) for n in NAMES
}  # under clone, every replica copy of every one


def slots_and_names(params) -> set[tuple[int, str]]:
    return {(p.slot, p.name) for p in params}


def test_clone_to_rewire_adds_the_reduce_add_edges_and_removes_nothing(comparison):
    assert [p.name for p in comparison["clone"].originals] == NAMES
    diff = comparison.diff("clone", "rewire")
    into = {(f"replica{s}.{n}", f"ReduceAddBackward[{n}]") for s in range(len(DEVICES)) for n in NAMES}
    out_of = {(f"ReduceAddBackward[{n}]", f"original.{n}") for n in NAMES}
    # the fix adds one edge from every copy into its ReduceAdd node, and one from each node to its original
    assert pairs(diff.added) == into | out_of
    # and takes no edge away
    assert diff.removed == ()
    # every dead end of clone is gone, every original is reached now
    assert slots_and_names(diff.fixed) == DEAD_ENDS and diff.new_dead_ends == ()
    assert [p.name for p in diff.newly_reached] == NAMES and diff.newly_unreached == ()


def test_diff_backwards_swaps_added_and_removed(comparison):
    forth, back = comparison.diff("rewire", "broadcast"), comparison.diff("broadcast", "rewire")
    # what one direction adds, the other removes
    assert pairs(forth.added) == pairs(back.removed) and pairs(forth.removed) == pairs(back.added)
    # rewire -> broadcast swaps per-parameter ReduceAdd nodes for one Broadcast node
    assert {e.dst for e in forth.added if e.src.startswith("replica")} == {"BroadcastBackward_1"}
    assert all(e.dst.startswith("ReduceAddBackward[") for e in forth.removed if e.src.startswith("replica"))


def test_a_graph_against_itself_is_empty(comparison):
    diff = graph_diff(comparison["rewire"], comparison["rewire"])
    # nothing added, removed, fixed or broken
    assert (diff.added, diff.removed, diff.fixed, diff.new_dead_ends) == ((), (), (), ())


def test_diff_drawing_marks_what_changed(comparison):
    dot = comparison.diff("clone", "rewire").dot
    # added edges are drawn thick green, and the former dead ends get their purple border
    assert "penwidth=3" in dot and "#2e7d32" in dot and "no longer\na dead end" in dot
    # and the picture's legend explains both
    assert "edge added" in dot and "was a dead end, is not any more" in dot


def test_rewire_then_break_it_again():
    model = mlp()
    done = step(model, torch.randn(4, 2), DEVICES, strategy="rewire", backward=False)
    loss, replicas = done.loss, done.replicas
    after = autograd_graph(loss, module=model, replicas=replicas)
    done = step(model, torch.randn(4, 2), DEVICES, strategy="clone", backward=False)
    loss, replicas = done.loss, done.replicas
    before = autograd_graph(loss, module=model, replicas=replicas)
    diff = graph_diff(after, before)
    # going back to clone makes every copy a dead end again, and nothing is reached
    assert (
        slots_and_names(diff.new_dead_ends) == DEAD_ENDS and [p.name for p in diff.newly_unreached] == NAMES
    )
    # and the edges the fix added (copy -> ReduceAdd, ReduceAdd -> original) are the ones removed
    into = {(f"replica{s}.{n}", f"ReduceAddBackward[{n}]") for s in range(len(DEVICES)) for n in NAMES}
    out_of = {(f"ReduceAddBackward[{n}]", f"original.{n}") for n in NAMES}
    assert diff.added == () and pairs(diff.removed) == into | out_of


def test_diff_needs_two_graphs(comparison):
    with pytest.raises(TypeError, match="AutogradGraph"):
        graph_diff(comparison["clone"], "rewire")
