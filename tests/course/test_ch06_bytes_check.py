"""Chapter 06's Exercise 2 check, ``checks.model_copy_bytes``: the bytes of the model copies alone in one
step, ``(N - 1)·(P + B)`` under "broadcast". Each wrong count is matched to the slip that gives it; what is
asserted is the slip named (``CountVerdict.slips``), not its wording. Expected bytes are derived from the
model, never copied from a run.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpteach.course import checks
from dpteach.measure import costs


@pytest.fixture(autouse=True)
def _fresh():
    checks.reset()
    yield
    checks.reset()


def wide_model():
    """The chapter's model with hidden layers of 512, as Exercise 2's starter cell builds it."""
    return nn.Sequential(
        nn.Linear(64, 512), nn.BatchNorm1d(512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
    )


def sizes(model, x):
    P, B = costs.state_nbytes(model).values()
    gathered = 4 * x.shape[0] * 10  # 32 rows of 10 float32 outputs
    return P, B, gathered


def test_the_right_answer_is_the_model_copies_without_the_gather():
    model, x, slots = wide_model(), torch.randn(32, 64), ["cpu"] * 2
    P, B, gathered = sizes(model, x)
    assert (P, B) == (4 * 302_090, 2 * 512 * 4 + 8)  # Answer 2's sums
    verdict = checks.model_copy_bytes((2 - 1) * (P + B), model, x, slots)
    assert verdict.ok and "1,212,464 bytes" in verdict.message  # the figure the exercise promises
    assert f"{gathered:,}" in verdict.message  # the gather is said to come on top
    assert checks.model_copy_bytes(float(P + B), model, x, slots).ok  # 1212464.0 is a whole number
    for n in (3, 4):  # N - 1 model copies on any number of slots
        assert checks.model_copy_bytes((n - 1) * (P + B), model, x, ["cpu"] * n).ok
    assert checks.model_copy_bytes(2 * (P + B), model, x, slots, strategy="clone").ok  # N under "clone"


@pytest.mark.parametrize("n", [2, 4])
def test_each_slip_is_told_apart(n):
    model, x, slots = wide_model(), torch.randn(32, 64), ["cpu"] * n
    P, B, gathered = sizes(model, x)
    elements = sum(t.numel() for t in (*model.parameters(), *model.buffers()))
    k = n - 1  # model copies under "broadcast"
    said = {
        k * (P + B) + gathered: ("gather",),  # the gathered output counted in
        k * (P + B - 8): ("counter",),  # num_batches_tracked left out
        k * (P + B - 4): ("counter as 4 bytes",),  # the int64 counter taken for 4 bytes
        k * P: ("buffers",),  # every buffer left out
        n * (P + B): ("slot 0",),  # slot 0 counted: N copies instead of N - 1
        n * (P + B) + gathered: ("slot 0", "gather"),
        k * P + gathered: ("buffers", "gather"),
        k * elements: ("elements",),  # elements, not bytes
        12_345: (),  # no slip gives it
    }
    for guess, slips in said.items():
        checks.reset()
        verdict = checks.model_copy_bytes(guess, model, x, slots)
        assert not verdict.ok and verdict.slips == slips, (guess, verdict.slips)
        assert verdict.message.startswith("Not yet: ")  # every failure says what to change


def test_the_answer_comes_only_from_the_third_wrong_try_and_the_model_is_left_alone():
    model, x, slots = wide_model(), torch.randn(32, 64), ["cpu"] * 2
    P, B, gathered = sizes(model, x)
    truth = P + B
    before = {k: v.clone() for k, v in model.state_dict().items()}
    tries = [checks.model_copy_bytes(truth + gathered, model, x, slots) for _ in range(4)]
    assert [v.shows_answer for v in tries] == [False, False, True, True]
    assert not any(f"{truth:,}" in v.message for v in tries[:2])  # never before the third try
    assert all(f"{truth:,}" in v.message for v in tries[2:])
    assert tries[0].message != tries[1].message  # the hint climbs
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # BatchNorm's statistics
    assert all(p.grad is None for p in model.parameters())  # the check stepped a copy
    assert checks.model_copy_bytes(truth, model, x, slots).ok
    assert not checks.model_copy_bytes(truth + gathered, model, x, slots).shows_answer  # the ladder restarts


def test_an_answer_not_given_or_not_a_number_costs_no_try():
    model, x, slots = wide_model(), torch.randn(32, 64), ["cpu"] * 2
    assert "Set predicted" in checks.model_copy_bytes(..., model, x, slots).message
    for wrong_kind in ("1212464", True, 1.5):
        assert not checks.model_copy_bytes(wrong_kind, model, x, slots).ok
    first = checks.model_copy_bytes(1, model, x, slots)
    assert "Hint 1 of 2" in first.message  # the calls above climbed nothing


def test_the_exercise_checks_the_model_copies_and_answer_2_gives_them():
    """The starter cell calls the check; Answer 2 states (N - 1)(P + B) for 2 slots, the gather apart."""
    import re
    from pathlib import Path

    import nbformat

    notebook = Path(__file__).resolve().parents[2] / "notebooks" / "06_the_cost_of_copies.ipynb"
    cells = nbformat.read(notebook, as_version=4).cells
    stubs = [c.source for c in cells if "exercise-stub" in c.metadata.get("tags", [])]
    assert any("checks.model_copy_bytes(predicted, wide, x, devices" in s for s in stubs)
    text = "\n".join(c.source for c in cells if c.cell_type == "markdown")
    answer = " ".join(re.search(r"<summary>Answer 2</summary>(.*?)</details>", text, re.S)[1].split())
    P, B, gathered = sizes(wide_model(), torch.randn(32, 64))
    assert f"= {P + B:,} bytes" in answer and f"{gathered:,} bytes, comes on top" in answer
    assert f"{P + B + gathered:,} bytes in all" in answer
