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


def test_task_1_says_fix_the_bug_whose_line_the_stub_prints():
    assert CELLS["ex11-clone_bug"].source.startswith("## Task 1 · Fix the bug")
    assert "# BROKEN" in CELLS["ex11-07"].source  # the broken line is on the page: nothing to find


def test_the_demo_counts_no_long_run_of_repeats():
    shown: list = []
    exec(CELLS["ex11-05"].source, {"exercises": exercises, "display": shown.append})
    assert not any(char.isdigit() for m in shown[0].messages for char in m.split("(the same problem in")[-1])


FINALE = [c for c in CELLS.values() if "finale" in c.metadata.get("tags", [])]
SOLVED = nbformat.read(ROOT / "notebooks" / "solutions" / "11_exercises_solutions.ipynb", as_version=4)


def _finale(answers: dict) -> str:
    """Run the finale's cells, as the learner does, on ``answers`` (the names the stub cells define)."""
    import contextlib
    import io

    import torch
    from torch import nn

    import dpteach

    namespace = {"torch": torch, "nn": nn, "dpteach": dpteach, "exercises": exercises, **answers}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for cell in FINALE:
            exec(cell.source, namespace)
    return out.getvalue()


def _answers(module, **swapped) -> dict:
    names = ("MyBroadcast", "MyReduceAddCoalesced", "scatter", "gather", "copy_once")
    return {name: swapped.get(name, getattr(module, name)) for name in names}


def test_the_finale_sits_before_the_summary_and_the_solutions_run_the_same_cells():
    order = list(CELLS)
    assert [c.id for c in FINALE] == ["ex11-finale-plug", "ex11-finale-train"]
    assert order.index("ex11-23") < order.index("ex11-finale") < order.index("ex11-finale-plug")
    assert order.index("ex11-finale-train") < order.index("ex11-summary")
    solved = [c.source for c in SOLVED.cells if "finale" in c.metadata.get("tags", [])]
    assert solved == [c.source for c in FINALE]


def test_the_finale_trains_with_the_worked_answers_exactly_as_dpteach_does():
    from dpteach.exercises import solutions

    said = _finale(_answers(solutions))
    losses = [[float(v.rstrip(",")) for v in line.split() if v[0].isdigit() and "." in v]
              for line in said.splitlines() if line.startswith("step ")]  # fmt: skip
    assert len(losses) == 5 and all(yours == ours for yours, ours in losses), said  # dpteach's own numbers
    assert losses[-1][0] < 0.75 * losses[0][0], said  # the loss goes down
    assert said.rstrip().endswith("learns exactly as dpteach's does."), said


def test_the_finale_waits_for_every_task_it_uses_and_costs_no_try():
    from dpteach.exercises import solutions, stubs

    exercises.forget_failures()
    said = _finale(_answers(stubs))
    assert said.startswith("Not yet: Task 3, Task 4, Task 6 must pass first") and "step 0" not in said
    broken = _answers(solutions, copy_once=lambda tensor, device: tensor.detach().clone().to(device))
    said = _finale(broken)  # two copies onto another device: Task 6's check fails, so nothing trains
    assert said.startswith("Not yet: Task 6 must pass first") and "step 0" not in said, said
    assert (
        exercises.check_copy_once(broken["copy_once"]).hints[0].startswith("(step 1 of")
    )  # no try was spent
    exercises.forget_failures()
