"""Chapter 11's page around the tasks: the demo check shows a verdict's form without any task's hints,
and the summary says what each task taught without the code of its answer."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import nbformat

from dpteach import exercises

ROOT = Path(__file__).resolve().parents[2]
CELLS = {c.id: c for c in nbformat.read(ROOT / "notebooks" / "11_exercises.ipynb", as_version=4).cells}


def test_the_demo_shows_what_was_found_but_no_hint():
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):
        exec(CELLS["ex11-05"].source, {"exercises": exercises})  # the demo cell, as the learner runs it
    exercises.forget_failures()
    assert shown.getvalue().startswith("Not yet: Task 1") and "✗" in shown.getvalue(), shown.getvalue()
    assert "Hint" not in shown.getvalue() and "made it from" not in shown.getvalue()  # step 1 stays unseen


def test_the_summary_gives_no_answer_away():
    summary = CELLS["ex11-summary"].source.split("To start a task over")[0]
    for code in ("`.to`", "clone()", "_buffers", "copy_", "ReduceAddCoalesced", "`zip`", "copy=True"):
        assert code not in summary, code
