"""Chapter 08's Task 6 (PR #20995, one copy instead of two) runs on CPU, and its check names each mistake.

``tests/exercises/test_exercises.py`` checks the stub and the worked answer like every task's; here, the
chapter's counting cell (a ``"meta"`` slot standing in for a second GPU) and the two wrong answers a
learner most likely writes.
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
from dpteach import exercises

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = nbformat.read(ROOT / "notebooks" / "08_real_gpus.ipynb", as_version=4)
CELLS = {tag: c for c in NOTEBOOK.cells for tag in c.metadata.get("tags", [])}


def run_count_cell(model, slot0):
    """Chapter 08's counting cell, run with ``model`` and slot 0 on ``slot0``; what it printed."""
    scope = {"torch": torch, "dpteach": dpteach, "model": model, "devices": [torch.device(slot0)]}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(CELLS["count-copies"].source, "<cell>", "exec"), scope)
    return out.getvalue()


def test_the_count_shows_two_copies_per_tensor_for_the_meta_slot():
    printed = run_count_cell(nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3)), "cpu")
    assert "7 tensors" in printed  # Linear's 2 parameters, BatchNorm's 2 parameters and 3 buffers
    assert 'slot 0 (cpu): 7 "clone" onto cpu\n' in printed  # slot 0: one clone each
    assert 'slot 1 (meta): 7 "clone" onto cpu, 7 "to" onto meta ' in printed  # slot 1: clone, then .to


def test_the_count_follows_the_model_off_the_cpu():
    """On a GPU machine the chapter's model is on cuda:0 = devices[0]: the cell must replicate from there,
    not from a hard-coded "cpu" (which failed replicate's first-slot check on every GPU). A model on
    "meta" with slot 0 on "meta" stands in for it here."""
    printed = run_count_cell(nn.Linear(4, 3).to("meta"), "meta")
    assert 'slot 0 (meta): 2 "clone" onto meta\n' in printed
    assert 'slot 1 (meta): 2 "clone" onto meta ' in printed  # the same device: a clone, no .to


def test_the_chapter_holds_task_6():
    roles = {c.metadata.get("dpteach", {}).get("role"): c.source for c in NOTEBOOK.cells}
    assert roles["stub"] == exercises.stub_source("one_copy")
    assert roles["check"] == exercises.check_source("one_copy") == "exercises.check_copy_once(copy_once)"
    assert exercises.TASKS["one_copy"].chapter == "08"


@pytest.mark.parametrize(
    "answer, phrase",
    [
        (
            lambda t, d: t.detach().clone().to(d),
            "from cpu to meta: 2 copies (clone, _to_copy)",
        ),  # before #20995
        (lambda t, d: t.detach().to(d), "from cpu to cpu: no copy was made"),  # .to onto its own device
        (lambda t, d: t.detach().clone(), "from cpu to meta: the copy is on cpu"),
        (  # the fix, comparing a device with a string: torch.device("cpu") != "cpu"
            lambda t, d: t.detach().to(d) if t.device != d else t.detach().clone(),
            "from cpu to cpu (given as the string 'cpu'): no copy was made",
        ),
    ],
    ids=["clone-then-to", "to-alone", "clone-alone", "device-against-string"],
)
def test_each_wrong_answer_gets_its_sentence(answer, phrase):
    result = exercises.check_copy_once(answer)
    assert not result.passed and phrase in str(result), str(result)


def test_a_clone_before_or_after_to_is_told_what_to_drop():
    """`.to(d).clone()` copies twice onto another device, as `.clone().to(d)` does, but its clone comes
    second: the hint must say what to change in either order, not "do not `clone()` first"."""
    from dpteach.exercises import _feedback

    for answer, listed in (
        (lambda t, d: t.detach().to(d).clone(), "_to_copy, clone"),
        (lambda t, d: t.detach().clone().to(d), "clone, _to_copy"),
    ):
        _feedback.forget_failures()
        first, second = (str(exercises.check_copy_once(answer)) for _ in range(2))
        _feedback.forget_failures()
        assert (
            f"from cpu to meta: 2 copies ({listed}) where one does; `_to_copy` is the copy `.to` makes"
            in first
        )
        assert "(step 1 of 2) one copy is enough" in first
        assert "a `clone()` before or after it is a second copy: drop the `clone()`" in second
        assert "its `copy` argument" in second and "first" not in second.split("Hint:")[1]


def test_the_string_hint_only_when_the_device_case_held():
    """`.to(d)` alone makes no copy on the tensor's own device, given a torch.device or a string: that is
    the "shared" mistake, not a string comparison, so the string hint must not be shown; the hint belongs
    to an answer that copies for torch.device("cpu") but not for "cpu"."""
    to_alone = str(exercises.check_copy_once(lambda t, d: t.to(d)))
    assert "hands back the tensor itself" in to_alone
    assert "torch.device(device)" not in to_alone, to_alone
    compares_string = str(exercises.check_copy_once(lambda t, d: t.to(d) if t.device != d else t.clone()))
    assert "torch.device(device)" in compares_string
    assert "hands back the tensor itself" not in compares_string, compares_string


def test_the_task_is_framed_in_python_first_and_its_cpp_history_is_folded():
    [intro] = [c for c in NOTEBOOK.cells if c.cell_type == "markdown" and "Task 6" in c.source]
    main, deeper = intro.source.split("<details>", 1)
    flat = " ".join(main.split())
    assert "`clone()`, then `.to(device)`, is copied twice onto another device" in flat
    assert "Cloneable" not in main and "#20" not in main  # C++ and the PRs: chapter 10's, folded here
    assert "Cloneable::clone(device)" in deeper and "PR #20995" in deeper and "PR #20910" in deeper
