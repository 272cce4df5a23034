"""Chapter 01: the cells that show where the gradient went do what their prose says.

The cells are found by their tags and run here on their own, in a namespace that holds what the
chapter's earlier cells made, so each check can also be run on a case where it must fail.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import nbformat
import pytest
import torch
from torch import nn

import dpteach
from dpteach.course import story

ROOT = Path(__file__).resolve().parents[2]
CHAPTER = ROOT / "notebooks" / "01_the_bug.ipynb"
DEVICES = [torch.device("cpu")] * 2
TAGS = [
    "train-by-hand",
    "torch-dp",
    "sketch",
    "replica-grads",
    "sgd-skips",
    "culprit",
    "walk-ends",
    "edge-contrast",
    "clone-loop",
]


def _cell(tag: str):
    (cell,) = [c for c in nbformat.read(CHAPTER, as_version=4).cells if tag in c.metadata.get("tags", [])]
    return cell


def run_cell(tag: str, **names) -> str:
    """Run the tagged code cell with ``names`` in its namespace; what it prints."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(_cell(tag).source, {"torch": torch, "nn": nn, "dpteach": dpteach, **names})
    return out.getvalue()


def after_clone_backward():
    """The original model and slot 1's replicas after one clone-based forward and backward."""
    x, y = story.make_data()
    model = story.make_model()
    replicas = dpteach.replicate(model, DEVICES, strategy="clone")
    out = torch.cat([r(piece) for r, piece in zip(replicas, x.chunk(len(DEVICES)))])
    nn.functional.mse_loss(out, y).backward()
    return model, replicas


@pytest.mark.parametrize("tag", TAGS)
def test_each_cell_the_tests_read_carries_its_tag_once(tag):
    assert _cell(tag).source.strip()  # _cell unpacks exactly one cell


def test_the_deduction_names_the_three_moves_that_stay_the_same():
    text = _cell("culprit").source
    assert all(move in text for move in ("Scatter", "parallel_apply", "gather", "only replicate differs"))


def test_backward_s_walk_from_the_output_ends_in_the_replicas_and_never_in_the_model():
    x, y = story.make_data()
    model = story.make_model()
    replicas = dpteach.replicate(model, DEVICES, strategy="clone")
    out = torch.cat([r(piece) for r, piece in zip(replicas, x.chunk(len(DEVICES)))])
    nn.functional.mse_loss(out, y).backward()
    printed = run_cell("walk-ends", out=out, model=model, replicas=replicas)
    assert "ends in 8 leaves: 8 replica parameters, 0 of the model's" in printed
    rewired = dpteach.replicate(model, DEVICES, strategy="rewire")  # an edge back: the walk reaches the model
    out = torch.cat([r(piece) for r, piece in zip(rewired, x.chunk(len(DEVICES)))])
    with pytest.raises(AssertionError):
        run_cell("walk-ends", out=out, model=model, replicas=rewired)


def test_the_optimizers_skip_every_parameter_in_silence_after_the_clone_backward():
    model, _ = after_clone_backward()
    printed = run_cell("sgd-skips", model=model)
    assert "0 warnings, every weight unchanged: True" in printed


def test_the_optimizer_cell_fails_when_the_model_has_gradients():
    model = story.make_model()
    x, y = story.make_data()
    nn.functional.mse_loss(model(x), y).backward()  # one device: every .grad is filled
    with pytest.raises(AssertionError):
        run_cell("sgd-skips", model=model)  # SGD moves the weights, so "unchanged" is False


def test_the_edge_contrast_shows_the_fixes_nodes_beside_the_missing_edge():
    model, replicas = after_clone_backward()
    rows = run_cell("edge-contrast", model=model, replicas=replicas, devices=DEVICES).splitlines()
    found = {row.split()[0]: row.split()[1:] for row in rows[1:]}
    assert found["clone"][0] == "no:" and found["clone"][-1] == "None"  # a leaf: no grad_fn, no edge
    for strategy in ("broadcast", "rewire"):  # an edge, out of the node the strategy makes
        weight = dpteach.replicate(model, DEVICES, strategy=strategy)[1][0].weight
        assert found[strategy][0] == "yes," and found[strategy][-1] == type(weight.grad_fn).__name__
    assert found["broadcast"][-1] == "BroadcastBackward" and found["rewire"][-1] == "ReduceAddBackward"


def test_the_edge_contrast_fails_on_replicas_that_keep_the_edge():
    model = story.make_model()
    replicas = dpteach.replicate(model, DEVICES, strategy="rewire")
    with pytest.raises(AssertionError):
        run_cell("edge-contrast", model=model, replicas=replicas, devices=DEVICES)


def test_the_loop_listed_is_clone_py_s_parameter_loop_as_it_stands():
    """The page lists clone_module's lines as text: each must still be a line of the source, in order."""
    import inspect
    import re

    from dpteach.replicate import clone

    text = _cell("clone-loop").source
    (listing,) = re.findall(r"```python\n(.*?)```", text, re.S)
    listed = [line.strip() for line in listing.splitlines() if line.strip()]
    source = [line.strip() for line in inspect.getsource(clone.clone_module).splitlines()]
    at = [source.index(line) for line in listed]  # ValueError: a listed line is no longer in clone.py
    assert at == sorted(at)  # in the source's order: the listing leaves lines out, it never reorders them
    assert any("# BROKEN (#19540)" in line for line in listed) and listed[-1] == "setattr(replica, key, copy)"
    assert "_buffers" not in listing and "_is_replica" not in listing  # only what the page explains


def test_torch_s_own_data_parallel_trains_the_model():
    from torch._utils import _get_available_device_type

    assert "nn.DataParallel(model)" in _cell("torch-dp").source
    cells = nbformat.read(CHAPTER, as_version=4).cells
    at = {c.get("id"): i for i, c in enumerate(cells)}
    summary = next(i for i, c in enumerate(cells) if c.source.startswith("## Summary"))
    assert at["torch-dp-note"] + 1 == at["torch-dp"] < summary  # on the main path, before the exercises
    # without an accelerator torch's DataParallel keeps no device_ids, so forward runs the module itself:
    # the page says so for a machine without a GPU
    if _get_available_device_type() is None:
        assert nn.DataParallel(nn.Linear(2, 1)).device_ids == []


def test_one_step_report_reads_in_one_line_without_tensors():
    clone, rewire = (repr(story.one_step(s, DEVICES)) for s in ("clone", "rewire"))
    assert "tensor(" not in clone + rewire and "\n" not in clone + rewire
    assert "matches=False" in clone and "grad_is_none=['0.weight', '0.bias', '2.weight', '2.bias']" in clone
    assert "replicas=2" in clone and "largest_difference=n/a" in clone  # no gradient to compare
    assert "matches=True" in rewire and "grad_is_none=[]" in rewire
    assert float(rewire.split("largest_difference=")[1].split(",")[0]) < 1e-5  # float rounding only


def test_one_step_report_shows_the_largest_difference_of_a_wrong_gradient():
    ref = {"w": torch.zeros(3), "b": torch.zeros(1)}
    report = story.GradientReport("custom", {"w": torch.tensor([0.0, 2.0, 0.5]), "b": None}, ref, [])
    assert repr(report) == (
        "GradientReport(strategy='custom', matches=False, largest_difference=2.0e+00, "
        "grad_is_none=['b'], replicas=0)"
    )


def _pairs(model, replicas):
    return zip(model.parameters(), *(r.parameters() for r in replicas))


def _summed(model, replicas):
    for p, *copies in _pairs(model, replicas):
        p.grad = sum(c.grad.to(p.device) for c in copies)


def _mean(model, replicas):
    for p, *copies in _pairs(model, replicas):
        p.grad = sum(c.grad for c in copies) / len(copies)


def _replica(i):
    def only(model, replicas):
        for p, *copies in _pairs(model, replicas):
            p.grad = copies[i].grad.clone()

    return only


def _plus_equals(model, replicas):
    for p, *copies in _pairs(model, replicas):
        for c in copies:
            p.grad += c.grad


def _add_(model, replicas):
    for p, *copies in _pairs(model, replicas):
        for c in copies:
            p.grad.add_(c.grad)


def _from_zeros(model, replicas):
    for p, *copies in _pairs(model, replicas):
        p.grad = torch.zeros_like(p)
        for c in copies:
            p.grad += c.grad


def _doubled(model, replicas):
    for p, *copies in _pairs(model, replicas):
        p.grad = 2 * sum(c.grad for c in copies)


@pytest.mark.parametrize(
    "add, problem",
    [
        (_mean, "mean"),
        (_replica(0), "one replica"),
        (_replica(1), "one replica"),
        (_plus_equals, "grad None"),
        (_add_, "grad None"),
        (lambda model, replicas: None, "never moved"),
        (_doubled, "not the sum"),  # wrong, but no mistake the check can name
    ],
    ids=["mean", "replica 0", "replica 1", "+=", "add_", "nothing", "doubled"],
)
def test_exercise_3_check_names_the_mistake_it_finds(add, problem):
    from dpteach.course import checks

    checks.reset()
    verdict = checks.summed_by_hand(add, DEVICES, steps=3)
    assert not verdict.ok and verdict.problem == problem


def test_exercise_3_hints_follow_the_mistake_found_not_a_shared_count():
    from dpteach.course import checks

    checks.reset()
    first = checks.summed_by_hand(_plus_equals, DEVICES, steps=2)  # one mistake ...
    then = checks.summed_by_hand(_mean, DEVICES, steps=2)  # ... then another
    assert first.problem == "grad None" and then.problem == "mean"
    assert "Hint 1 of 2" in first.message and "Hint 1 of 2" in then.message  # each mistake starts its ladder
    assert "mean over its own shard" in then.message  # the mean's first hint, not the zip hint
    again = checks.summed_by_hand(_mean, DEVICES, steps=2)
    assert "Hint 2 of 2" in again.message and "Drop the division" in again.message  # the same mistake climbs
    assert "3 tries so far" in again.message  # the tries of the exercise still count together
    assert checks.summed_by_hand(_summed, DEVICES, steps=2).ok
    assert "Hint 1 of 2" in checks.summed_by_hand(_mean, DEVICES, steps=2).message  # a right answer resets
    checks.reset()


def test_exercise_3_check_says_which_replica_was_kept():
    from dpteach.course import checks

    assert "replica 1's" in checks.summed_by_hand(_replica(1), DEVICES, steps=2).message
    checks.reset()


@pytest.mark.parametrize("add", [_summed, _from_zeros], ids=["sum", "sum from zeros"])
def test_exercise_3_check_passes_the_sum_however_it_is_written(add):
    from dpteach.course import checks

    assert checks.summed_by_hand(add, DEVICES, steps=5).ok


def test_exercise_checks_offer_the_answer_only_from_the_third_try_and_show_it_when_asked():
    from dpteach.course import checks

    checks.reset()
    tries = [checks.one_slot(False, 2, DEVICES).message for _ in range(3)]
    assert all("learns" in t and "copies" in t and "Hint" in t for t in tries)  # what to change, a hint
    assert "Hint 1 of 2" in tries[0] and "Hint 2 of 2" in tries[1]
    assert not any("learns = True, copies = 0" in t for t in tries)  # never the answer unasked
    assert "Answer block" in tries[2] and "show_answer=True" in tries[2] and "Answer block" not in tries[1]
    assert "learns = True, copies = 0" in checks.one_slot(..., ..., DEVICES, show_answer=True).message
    assert checks.one_slot(True, 0, DEVICES).ok
    for _ in range(3):
        last = checks.summed_by_hand(lambda m, r: None, DEVICES, steps=2).message
    assert "show_answer=True" in last and "p.grad = sum" not in last
    assert "p.grad = sum" in checks.summed_by_hand(..., DEVICES, show_answer=True).message
    checks.reset()


def test_exercise_1_check_names_what_to_change():
    from dpteach.course import checks

    checks.reset()
    assert "Change `copies`" in checks.one_slot(True, 1, DEVICES).message  # one slot: replicate makes none
    assert "Change `learns`." in checks.one_slot(False, 0, DEVICES).message
    assert "whole number" in checks.one_slot(True, "none", DEVICES).message
    checks.reset()


def test_exercise_1_hints_follow_the_field_that_is_wrong():
    from dpteach.course import checks

    checks.reset()
    copies = checks.one_slot(True, 1, DEVICES)  # `learns` right, `copies` wrong
    assert copies.problem == "copies" and "Hint 1 of 2" in copies.message
    assert "import inspect; print(inspect.getsource(" in copies.message and "losses[0]" not in copies.message
    learns = checks.one_slot(False, 0, DEVICES)  # now only `learns` wrong: its own ladder starts
    assert learns.problem == "learns" and "Hint 1 of 2" in learns.message and "losses[0]" in learns.message
    again = checks.one_slot(True, 1, DEVICES)  # the same wrong field climbs its ladder
    assert "Hint 2 of 2" in again.message and "not the chapter's sketch" in again.message
    assert checks.one_slot(True, 0, DEVICES).ok
    assert "Hint 1 of 2" in checks.one_slot(True, 1, DEVICES).message  # a right answer resets the ladders
    checks.reset()
