"""Every notebook of the course runs headless, top to bottom, as a learner's kernel runs it.

Also: notebooks are committed clean (no outputs) and every chapter starts with the same set-up cell.
Each notebook is executed once per run and shared with the other tests that read it
(``tests/executed.py``); executed copies go to artifacts/notebooks/ for a reviewer to open.
JupyterLab's ``.ipynb_checkpoints`` copies are not course notebooks and are never collected.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from executed import course_notebooks, executed

from dpteach._course import SETUP_CELL

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = course_notebooks()
CHAPTERS = [p for p in NOTEBOOKS if p.parent.name == "notebooks"]
IDS = [str(p.relative_to(ROOT / "notebooks")) for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"strip outputs of {path.name}"


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.name for p in CHAPTERS])
def test_chapter_starts_with_the_setup_cell(path):
    nb = nbformat.read(path, as_version=4)
    first = next(c for c in nb.cells if c.cell_type == "code")
    assert first.source == SETUP_CELL  # on Colab it installs dpteach; elsewhere it does nothing


def test_chapter_numbers_are_unique():
    numbers = [p.name.split("_")[0] for p in CHAPTERS]
    assert len(numbers) == len(set(numbers))


@pytest.mark.notebook
@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_executes(path):
    nb, seconds, cached = executed(path)  # raises CellExecutionError, with the cell, on any error
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    tagged = [c for c in nb.cells if "raises-exception" in c.metadata.get("tags", [])]
    assert len(errors) == len(tagged)  # the only errors are the ones a cell is tagged to expect
    images = [
        o for c in nb.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})
    ]
    if "plt." in "".join(c.source for c in nb.cells if c.cell_type == "code"):
        assert images, "a chapter that plots shows its figures inline"
    print(
        f"{path.name}: {seconds:.1f} s"
        + (" (executed by an earlier run with the same sources)" if cached else "")
    )


def test_checkpoint_copies_are_not_course_notebooks(tmp_path):
    (tmp_path / "solutions" / ".ipynb_checkpoints").mkdir(parents=True)
    (tmp_path / ".ipynb_checkpoints").mkdir()
    for rel in (
        "01_a.ipynb",
        "solutions/s.ipynb",
        ".ipynb_checkpoints/01_a-checkpoint.ipynb",
        "solutions/.ipynb_checkpoints/s-checkpoint.ipynb",
    ):
        (tmp_path / rel).write_text("{}")
    assert [p.relative_to(tmp_path).as_posix() for p in course_notebooks(tmp_path)] == [
        "01_a.ipynb",
        "solutions/s.ipynb",
    ]


TAUGHT = [p for p in CHAPTERS if "exercises" not in p.name]  # the exercises notebook is all exercise


@pytest.mark.parametrize("path", TAUGHT, ids=[p.name for p in TAUGHT])
def test_chapter_ends_with_summary_and_exercises(path):
    nb = nbformat.read(path, as_version=4)
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    headings = [h for h in re.findall(r"^## .*", text, re.M) if not h.startswith("## Try it yourself")]
    assert headings[-2:] == [
        "## Summary",
        "## Exercises",
    ]  # every chapter ends this way (a try-it task may follow)


def test_an_executed_copy_is_reused_only_while_its_sources_stay_the_same(tmp_path, monkeypatch):
    import executed as cache

    (tmp_path / "dpteach").mkdir()
    (tmp_path / "scripts").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "dpteach" / "comm.py").write_text("x = 1\n")
    for runner in ("scripts/run_notebook.py", "scripts/peak_memory.py", "tests/executed.py"):
        (tmp_path / runner).write_text("# runner\n")
    nb = tmp_path / "01_a.ipynb"
    nb.write_text("{}")
    monkeypatch.setattr(cache, "ROOT", tmp_path)
    first = cache.source_key(nb)
    assert cache.source_key(nb) == first  # the same sources: the same key, the stored copy is read
    (tmp_path / "dpteach" / "comm.py").write_text("x = 2\n")
    after_library_edit = cache.source_key(nb)
    assert after_library_edit != first  # an edit to the library runs the chapter again
    nb.write_text('{"cells": []}')
    after_chapter_edit = cache.source_key(nb)
    assert after_chapter_edit not in (first, after_library_edit)  # so does an edit to the chapter
    monkeypatch.setenv("DPTEACH_EXAMPLE_SETTING", "1")
    assert cache.source_key(nb) != after_chapter_edit  # and a DPTEACH_* setting the kernel inherits
    setting = cache.source_key(nb)
    (tmp_path / "tests" / "executed.py").write_text("# another runner\n")
    assert cache.source_key(nb) != setting  # and an edit to the runner (what it samples, say)
