"""Chapter 11's page around the tasks: the demo shows one failing and one passing check, as the learner's own
checks show them; the Run All note and the folds sit where they belong; the summary gives no answer's code."""

from __future__ import annotations

from pathlib import Path

import nbformat

from dpteach import exercises

ROOT = Path(__file__).resolve().parents[2]
CELLS = {c.id: c for c in nbformat.read(ROOT / "notebooks" / "11_exercises.ipynb", as_version=4).cells}


def test_the_demo_shows_one_failing_and_one_passing_check_and_costs_no_try():
    shown: list = []
    exercises.forget_failures()
    exec(CELLS["ex11-05"].source, {"exercises": exercises, "display": shown.append})  # as the learner runs it
    failed, passed = shown  # each result displayed as the check cell shows it: its box, hints included
    assert not failed.passed and str(failed).startswith("Not yet: Task 1") and "✗" in str(failed)
    assert failed.hints and "Hint: (step 1 of" in str(failed)  # what a hint looks like
    assert passed.passed and str(passed).startswith("Correct! Task 1") and "✓" in str(passed)
    assert (
        exercises.check_clone_bug("clone").hints[0].startswith("(step 1 of")
    )  # the demo was no try of yours
    exercises.forget_failures()
    intro = " ".join(CELLS["ex11-01"].source.split())
    assert '`"clone"` strategy, then on the default `"broadcast"`, which passes' in intro


def test_the_run_all_note_names_the_tag_the_stubs_carry():
    note = " ".join(CELLS["ex11-table"].source.split())
    stubs = [c for c in CELLS.values() if "exercise-stub" in c.metadata.get("tags", [])]
    assert stubs and all("raises-exception" in c.metadata["tags"] for c in stubs)  # what the note relies on
    assert "`raises-exception` tag, which JupyterLab, Jupyter Notebook and VS Code read" in note
    assert "run the cells below it one by one" in note


def test_the_recorded_fold_sits_in_task_3_before_the_summary():
    fold = '<summary>Going deeper: what "recorded" means'
    assert fold in CELLS["ex11-broadcast_pair"].source and fold not in CELLS["ex11-summary"].source


def test_the_summary_gives_no_answer_away():
    summary = CELLS["ex11-summary"].source.split("To start a task over")[0]
    for code in ("`.to`", "clone()", "_buffers", "copy_", "ReduceAddCoalesced", "`zip`", "copy=True"):
        assert code not in summary, code
