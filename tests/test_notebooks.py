"""Every notebook of the course runs headless, top to bottom, as a learner's kernel runs it.

Also: notebooks are committed clean (no outputs) and every chapter starts with the same set-up cell.
Executed copies go to artifacts/notebooks/ for a reviewer to open.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat
import pytest

from dpteach._course import SETUP_CELL

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from run_notebook import execute  # noqa: E402

NOTEBOOKS = sorted((ROOT / "notebooks").rglob("*.ipynb"))
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
def test_notebook_executes(path, monkeypatch):
    monkeypatch.setenv("TQDM_DISABLE", "1")
    monkeypatch.delenv("MPLBACKEND", raising=False)  # conftest's Agg would reach the kernel and hide every figure
    nb, seconds = execute(path, timeout=600)  # raises CellExecutionError, with the cell, on any error
    out = ROOT / "artifacts" / "notebooks"
    out.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, out / path.name)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    tagged = [c for c in nb.cells if "raises-exception" in c.metadata.get("tags", [])]
    assert len(errors) == len(tagged)  # the only errors are the ones a cell is tagged to expect
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})]
    if "plt." in "".join(c.source for c in nb.cells if c.cell_type == "code"):
        assert images, "a chapter that plots shows its figures inline"
    print(f"{path.name}: {seconds:.1f} s")


TAUGHT = [p for p in CHAPTERS if "exercises" not in p.name]  # the exercises notebook is all exercise


@pytest.mark.parametrize("path", TAUGHT, ids=[p.name for p in TAUGHT])
def test_chapter_ends_with_summary_and_exercises(path):
    nb = nbformat.read(path, as_version=4)
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    headings = [h for h in re.findall(r"^## .*", text, re.M) if not h.startswith("## Try it yourself")]
    assert headings[-2:] == ["## Summary", "## Exercises"]  # every chapter ends this way (a try-it task may follow)
