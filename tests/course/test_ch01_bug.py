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


def test_the_clone_step_leaves_the_model_without_gradients_and_every_replica_with_one():
    printed = run_cell("replica-grads", **_sketch_names())
    assert "model     0.weight.grad: None" in printed and printed.count("norm") == len(DEVICES)


def test_the_replica_cell_fails_when_the_replicas_pass_the_gradient_on():
    with pytest.raises(AssertionError):
        run_cell("replica-grads", **_sketch_names("rewire"))  # an edge back: the model gets its .grad


def _sketch_names(strategy="clone"):
    """What the replica cell needs: the sketch from the page, bent to make ``strategy``'s replicas."""
    sketch = {"torch": torch, "dpteach": dpteach}
    exec(_cell("sketch").source, sketch)
    x, y = story.make_data()

    def data_parallel(model, x, devices, _):
        return sketch["data_parallel"](model, x, devices, strategy)

    return {"story": story, "devices": DEVICES, "xb": x, "yb": y, "data_parallel": data_parallel}


def test_the_exercise_check_accepts_the_sum_and_names_each_wrong_factor():
    from dpteach.course import checks

    checks.reset()
    assert checks.replica_sum(1, DEVICES).ok  # the replicas' gradients add up to one device's
    mean = checks.replica_sum(0.5, DEVICES)
    assert mean.problem == "factor mean" and "Change `prediction`" in mean.message
    assert checks.replica_sum(2, DEVICES).problem == "factor slots"
    assert checks.replica_sum(3, DEVICES).problem == "factor"
    checks.reset()


def test_the_exercise_hints_name_the_idea_first_and_the_answer_only_when_asked():
    from dpteach.course import checks

    checks.reset()
    tries = [checks.replica_sum(0.5, DEVICES).message for _ in range(3)]
    assert "Hint 1 of 2" in tries[0] and "one mean over all 256 rows" in tries[0]  # the idea, no code
    assert "Hint 2 of 2" in tries[1] and "own piece" in tries[1]
    assert not any("prediction = 1" in t for t in tries)  # never the answer unasked
    assert "Answer block" in tries[2] and "show_answer=True" in tries[2] and "Answer block" not in tries[1]
    assert "prediction = 1" in checks.replica_sum(..., DEVICES, show_answer=True).message
    assert checks.replica_sum(1, DEVICES).ok
    assert "Hint 1 of 2" in checks.replica_sum(2, DEVICES).message  # a right answer resets the ladder
    checks.reset()


def test_the_exercise_check_asks_for_a_number_without_spending_a_hint():
    from dpteach.course import checks

    checks.reset()
    assert "Set `prediction`" in checks.replica_sum(..., DEVICES).message
    assert "is a number" in checks.replica_sum("one", DEVICES).message
    assert "Hint 1 of 2" in checks.replica_sum(0.5, DEVICES).message  # neither of the two cost a try
    checks.reset()
