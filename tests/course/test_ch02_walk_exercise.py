"""Chapter 02: exercise 3 ("Walk it yourself") and its check, and the captions that count what the walk prints."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import nbformat
import pytest
import torch

from dpteach.course import checks

ROOT = Path(__file__).resolve().parents[2]
CHAPTER = ROOT / "notebooks" / "02_reading_autograd_graphs.ipynb"


def _by_id(cell_id: str):
    (cell,) = [c for c in nbformat.read(CHAPTER, as_version=4).cells if c.get("id") == cell_id]
    return cell


def _stub() -> dict:
    names = {"torch": torch, "checks": checks}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(_by_id("ex3-walk-stub").source, names)
    return names


@pytest.fixture(autouse=True)
def _fresh_ladder():
    checks.reset()
    yield
    checks.reset()


def test_the_answer_block_s_path_passes_and_ends_at_a():
    names = _stub()
    path = [
        int(i)
        for i in re.search(r"`path = \[([\d, ]+)\]`", _by_id("ex3-walk-worked").source).group(1).split(",")
    ]
    verdict = checks.walk_path(path, names["loss"], names["a"])
    assert (
        verdict.ok
        and verdict.message.endswith("as `walk` takes it.")
        and "AccumulateGrad (a)" in verdict.message
    )
    node = names["loss"].grad_fn
    for i in path:  # the check's verdict is what walking by hand gives
        node = node.next_functions[i][0]
    assert node.variable is names["a"]


def test_the_stub_as_given_asks_for_a_path_without_a_hint():
    names = _stub()
    assert names["path"] is ...
    assert "Set `path`" in checks.walk_path(names["path"], names["loss"], names["a"]).message


@pytest.mark.parametrize(
    "path, said",
    [
        ([0, 0], "of another leaf"),  # c's AccumulateGrad
        ([0, 1, 0, 0], "which is None"),  # z needs no gradient
        ([0, 1], "stops at TanhBackward0"),
        ([1], "has 1 entry"),
        ([0, 1, 0, 1, 0], "no next_functions"),
        ([], "stops at PowBackward0"),
    ],
)
def test_each_wrong_path_is_rejected_with_where_it_went(path, said):
    names = _stub()
    verdict = checks.walk_path(path, names["loss"], names["a"])
    assert not verdict.ok and said in verdict.message and "Hint 1 of 2" in verdict.message


def test_the_hints_climb_to_the_answer_only_on_the_third_try():
    names = _stub()
    tries = [checks.walk_path([0], names["loss"], names["a"]).message for _ in range(3)]
    assert "Hint 1 of 2" in tries[0] and "Hint 2 of 2" in tries[1] and "[0, 1, 0, 1]" not in tries[1]
    assert "The answer: path = [0, 1, 0, 1]" in tries[2]


def test_the_stub_has_no_check_logic_in_sight():
    assert not re.search(r"^\s*(if|elif|for|while)\b", _by_id("ex3-walk-stub").source, re.M)


def test_the_title_caption_counts_the_nodes_walk_prints():
    from dpteach import autograd_graph

    w, x, b = torch.tensor(2.0, requires_grad=True), torch.tensor(3.0), torch.tensor(1.0, requires_grad=True)
    h = w * x
    loss = (h + b) ** 2
    seen, todo = set(), [loss.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is not None and fn not in seen:
            seen.add(fn)
            todo += [n for n, _ in fn.next_functions]
    accumulators = sum(hasattr(fn, "variable") for fn in seen)
    assert len(seen) == 5 and accumulators == 2  # the caption's 5 nodes, 2 of them in the yellow boxes
    assert autograd_graph(loss, names={"w": w, "x": x, "b": b, "h": h}).title.startswith(
        "3 backward functions"
    )
    caption = _by_id("1b1356b6").source
    assert "`walk` printed 5 nodes" in caption and "2 are the `AccumulateGrad` nodes" in caption
    assert "label, not a node" in caption


def test_task_1_says_the_check_tries_a_meta_slot_and_it_does():
    from dpteach.exercises import task1_clone_bug

    assert "`[cpu, meta]`" in _by_id("021dd40a").source.split("<details>")[0]
    assert [d.type for d in task1_clone_bug.SECOND_DEVICE] == ["cpu", "meta"]
