"""Chapter 09's ordinary DDP script: the cell writes it, and torchrun runs it on 2 CPU ranks.

The chapter shows the script a learner would write (init the process group, wrap in DDP, a
DistributedSampler, the loop, destroy the group), and the next cell runs it under torchrun from the
notebook, through a small ``torchrun`` function that exercise 4 uses again (Colab has no terminal).
Here both cells run as the learner runs them, so the chapter never shows a script that does not train,
and exercise 4's failing call is run as worded.
"""

from __future__ import annotations

import contextlib
import io
import re
import tempfile
from pathlib import Path

import nbformat
import pytest

CHAPTER = Path(__file__).resolve().parents[2] / "notebooks" / "09_beyond_one_process.ipynb"

pytestmark = pytest.mark.slow  # torchrun and two ranks, each importing torch


def script_cell():
    cells = nbformat.read(CHAPTER, as_version=4).cells
    return next(c for c in cells if "ddp-script" in c.metadata.get("tags", []))


def test_the_script_shows_every_step_of_an_ordinary_ddp_program():
    source = script_cell().source
    for step in (
        'dist.init_process_group("gloo")',
        "DDP(torch.nn.Sequential(",
        "DistributedSampler(data)",
        "sampler.set_epoch(epoch)",
        "loss.backward()",
        "dist.destroy_process_group()",
    ):
        assert step in source, step
    assert len(source.splitlines()) <= 25


def run_cell():
    cells = nbformat.read(CHAPTER, as_version=4).cells
    return next(c for c in cells if "torchrun-run" in c.metadata.get("tags", []))


def test_the_chapter_runs_the_script_under_torchrun_right_after_writing_it():
    cells = nbformat.read(CHAPTER, as_version=4).cells
    at = cells.index(script_cell())
    assert cells[at + 1].id == run_cell().id  # written, then run: torchrun is on the main path
    source = run_cell().source
    assert "torchrun(" in source and len(source.splitlines()) <= 25
    # the plumbing lives in the library, where help(torchrun) reads it: torchrun's module, bounded
    import inspect

    from dpteach.distributed import script

    helper = inspect.getsource(script.torchrun)
    assert '"torch.distributed.run"' in helper and "timeout=timeout" in helper
    # the prose after it reads what it printed: each rank's loss is its own last batch's
    after = " ".join(cells[at + 2].source.split())
    assert "loss of its own last 32 rows" in after and "ranks' numbers differ" in after


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """The script cell and the run cell, executed as a learner runs them, and what they printed."""
    folder = tmp_path_factory.mktemp("ddp_script")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tempfile, "tempdir", str(folder))  # the cell writes into gettempdir()
        mp.chdir(folder)
        scope: dict = {}
        exec(script_cell().source, scope)
        assert scope["script"].parent == folder and scope["script"].exists()
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(run_cell().source, scope)
        yield scope, printed.getvalue()


def test_torchrun_runs_the_written_script_on_two_cpu_ranks(ran):
    _, printed = ran
    lines = printed.strip().splitlines()
    found = [re.fullmatch(r"rank (\d), epoch (\d): loss ([0-9.]+)", line) for line in lines]
    # nothing but the ranks' lines (a failed job would print torchrun's report after them) ...
    assert all(found), printed[-3000:]
    # ... every rank trained every epoch, each printing a finite loss, its lines grouped by rank
    assert [(int(m[1]), int(m[2])) for m in found] == [(r, e) for r in range(2) for e in range(3)]
    assert all(float(m[3]) < 1.0 for m in found)


def test_exercise_4s_three_processes_fail_as_its_answer_says(ran):
    """Exercise 4, in a notebook: the cell's ``torchrun`` function with the exercise's arguments on 3
    processes returns exit status 1 and prints train.py's refusal and torchrun's ChildFailedError."""
    scope, _ = ran
    cells = nbformat.read(CHAPTER, as_version=4).cells
    exercises = next(c for c in cells if c.cell_type == "markdown" and c.source.startswith("## Exercises"))
    text = " ".join(exercises.source.split("4. **torchrun yourself.**")[1].split("5. **")[0].split())
    call = re.search(r"`(torchrun\(\"--nproc-per-node\", \"2\", [^`]+\))`", text)[1]
    assert '`"--global-batch", "64"`' in text and "on 3 processes" in text
    three = call.replace('"2"', '"3"', 1).replace("--steps", "--global-batch").replace('"20"', '"64"')
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        status = eval(three, scope)
    assert status == 1, printed.getvalue()[-3000:]
    assert "--global-batch 64 must be a multiple of the world size 3" in printed.getvalue()
    assert "ChildFailedError" in printed.getvalue()
    answer = " ".join(exercises.source.split("Answer 4")[1].split())
    assert "must be a multiple of the world size 3" in answer and "returns the exit status, 1" in answer
