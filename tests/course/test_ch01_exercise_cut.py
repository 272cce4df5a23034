"""Chapter 01: the figures added to the bug's story, and exercise 2 ("Find the cut") with its check.

The check must accept a ``find_cut`` that computes the names from a step, and reject one that returns
a literal, a constant or a guess; the Answer block's code must pass it.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
import torch
from torch import nn

import dpteach
from dpteach.course import checks, story

ROOT = Path(__file__).resolve().parents[2]
CHAPTER = ROOT / "notebooks" / "01_the_bug.ipynb"
DEVICES = [torch.device("cpu")] * 2


def _cells():
    return nbformat.read(CHAPTER, as_version=4).cells


def _by_id(cell_id: str):
    (cell,) = [c for c in _cells() if c.get("id") == cell_id]
    return cell


def _names():
    x, y = story.make_data()
    return {"torch": torch, "nn": nn, "dpteach": dpteach, "story": story, "checks": checks,
            "devices": DEVICES, "xb": x, "yb": y}  # fmt: skip


def _answer_find_cut():
    """The Answer block's find_cut, defined in the chapter's names."""
    (code,) = re.findall(r"```python\n(.*?)```", _by_id("ex-cut-worked").source, re.S)
    names = _names()
    exec(code, names)
    return names["find_cut"]


@pytest.fixture(autouse=True)
def _fresh_ladder():
    checks.reset()
    yield
    checks.reset()


def test_the_answer_block_passes_the_check():
    assert checks.cut_edges(_answer_find_cut(), DEVICES).ok


def test_the_stub_as_given_is_not_an_answer_and_costs_no_hint():
    names = _names()
    source = _by_id("ex-cut-stub").source
    exec(
        source.replace(
            "checks.cut_edges(find_cut, devices)", "verdict = checks.cut_edges(find_cut, devices)"
        ),
        names,
    )
    assert not names["verdict"].ok and names["verdict"].problem == "not a set"
    assert "under the suspect the loss falls" in source


def test_a_literal_answer_is_rejected_even_when_it_fits_one_suspect():
    find_cut = _answer_find_cut()
    suspect = checks.suspect_replicate()
    literal = find_cut(suspect)  # right for this suspect, written in as a constant
    assert literal and literal < {"0.weight", "0.bias", "2.weight", "2.bias"}
    verdict = checks.cut_edges(lambda strategy: literal, DEVICES)
    assert not verdict.ok and verdict.problem == "wrong" and "Compute the names" in verdict.message


@pytest.mark.parametrize("constant", [set(), {"0.weight", "0.bias", "2.weight", "2.bias"}])
def test_a_constant_answer_is_rejected(constant):
    verdict = checks.cut_edges(lambda strategy: constant, DEVICES)
    assert not verdict.ok and "Hint 1 of 3" in verdict.message


def test_the_hints_climb_and_the_answer_waits_for_the_third_try():
    tries = [
        checks.cut_edges(lambda s: {"0.bias"} if s == "clone" else set(), DEVICES).message for _ in range(3)
    ]
    assert "Hint 1 of 3" in tries[0] and "Hint 2 of 3" in tries[1] and "Hint 3 of 3" in tries[2]
    assert "Answer block" in tries[2] and "Answer block" not in tries[1]
    assert "p.grad is None" in checks.cut_edges(None, DEVICES, show_answer=True).message


def test_names_that_are_no_parameters_and_errors_say_what_to_change():
    assert "not a name of the course model" in checks.cut_edges(lambda s: {"0.w"}, DEVICES).message
    assert "raised ZeroDivisionError" in checks.cut_edges(lambda s: 1 / 0, DEVICES).message
    assert "one slot" == checks.cut_edges(_answer_find_cut(), DEVICES[:1]).problem


def test_every_suspect_looks_right_cuts_what_the_step_finds_and_still_learns():
    find_cut = _answer_find_cut()
    x, _ = story.make_data()
    for cut in checks._CUTS:
        suspect = checks._make_suspect(cut)
        model = story.make_model()
        torch.testing.assert_close(dpteach.DataParallel(model, DEVICES, strategy=suspect)(x), model(x))
        assert find_cut(suspect) == set(cut)  # the step's truth is the suspect's hidden cut
        assert story.train(strategy=suspect, devices=DEVICES).learned  # the loss falls: it looks right


def test_the_answer_block_s_edge_to_line_finds_the_same_names():
    names = _names()
    cell = next(c.source for c in _cells() if "def edge_to" in c.source)
    exec("def edge_to" + cell.split("def edge_to", 1)[1].split("\n\n\n")[0], names)
    line = re.search(r"`not (edge_to\(.*?\))`", _by_id("ex-cut-worked").source).group(1)
    edge_to = names["edge_to"]
    for cut in checks._CUTS[:4] + checks._CUTS[-2:]:
        model = story.make_model()
        replicas = checks._make_suspect(cut)(model, DEVICES)
        found = {name for name, p in model.named_parameters()
                 if not eval(line, {"edge_to": edge_to, "replicas": replicas, "name": name, "p": p})}  # fmt: skip
        assert found == set(cut)


def test_a_negative_count_and_a_low_count_say_what_to_change():
    negative = checks.accumulators_reached(-8, DEVICES)
    assert (
        negative.problem == "negative" and "below zero" in negative.message and "Hint" not in negative.message
    )
    low = checks.accumulators_reached(5, DEVICES)
    assert low.problem == "too few" and "make `prediction` larger" in low.message
    high = checks.accumulators_reached(9, DEVICES)
    assert high.problem == "too many" and "make `prediction` smaller" in high.message


def test_the_opening_figure_draws_the_fixed_run_beside_the_broken_one():
    cell = next(c for c in _cells() if "loss-curves" in c.metadata.get("tags", []))
    assert 'strategy="broadcast"' in cell.source and "broadcast" in cell.metadata["mystnb"]["image"]["alt"]
    assert story.train(strategy="broadcast", devices=DEVICES).learned
    assert not story.train(strategy="clone", devices=DEVICES).learned


def test_the_drawn_edges_show_the_dead_end_under_clone_and_none_under_broadcast(monkeypatch):
    from dpteach.course import plots

    shown = []
    monkeypatch.setattr(plots, "side_by_side", lambda *graphs: shown.extend(graphs))
    cell = next(c for c in _cells() if "edge-drawn" in c.metadata.get("tags", []))
    names = {**_names(), "model": story.make_model()}
    exec(cell.source, names)
    clone, broadcast = shown
    assert len(clone.dead_ends) == 1 and len(clone.unreached) == 4
    assert not broadcast.dead_ends and not broadcast.unreached
    cells = _cells()
    at = [c.get("id") for c in cells]
    assert at.index("edge-read") + 1 == at.index("edge-drawn")  # drawn where the text describes it


def test_the_three_strategy_comparison_and_the_ddp_aside_left_the_main_path():
    main = re.sub(r"<details\b.*?</details>", " ", _by_id("9f3e9713").source, flags=re.S)
    assert "DDP" not in main and "div_factor_" in _by_id("9f3e9713").source
    assert '"rewire"' not in _by_id("53417873").source and '"broadcast"' not in _by_id("53417873").source
