"""Chapters 00-03 follow the notebook conventions of the course.

* The Colab set-up cell is tagged ``remove-cell``; the chapter's key figure (a code cell with alt
  text) comes within its first five cells.
* Every open exercise of 00 and 01 has an answer to unfold (``<summary>Answer``) or a check cell
  (a call of ``dpteach.course.checks``); chapter 01 has a predict-then-check exercise.
* The small exercises' check cells of 02 and 03 call a ``checks`` helper and compute no answer in
  sight (no ``if``, no comparison with the truth in the cell).
* Chapter 03's stepper widget sits right under the "after" graph, not at the end.
* Executed, every cell whose output is a figure or widget carries ``mystnb.image.alt``.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
MINE = sorted(p for p in NOTEBOOKS.glob("0[0-3]_*.ipynb"))
FIGURE = ("image/png", "image/svg+xml", "application/vnd.jupyter.widget-view+json")


def _cells(path):
    return nbformat.read(path, as_version=4).cells


def _alt(cell) -> str:
    return cell.metadata.get("mystnb", {}).get("image", {}).get("alt", "")


def _exercise_cells(cells):
    start = next(i for i, c in enumerate(cells) if c.cell_type == "markdown" and "## Exercises" in c.source)
    end = next((i for i, c in enumerate(cells) if i > start and "## Try it yourself" in c.source), len(cells))
    return cells[start:end]


@pytest.mark.parametrize("path", MINE, ids=[p.name for p in MINE])
def test_setup_cell_removed_and_key_figure_early(path):
    cells = _cells(path)
    first_code = next(c for c in cells if c.cell_type == "code")
    assert "remove-cell" in first_code.metadata.get("tags", []), (
        f"{path.name}: tag the set-up cell remove-cell"
    )
    assert any(c.cell_type == "code" and _alt(c) for c in cells[:5]), (
        f"{path.name}: no key figure in cells 0-4"
    )
    assert "you will be able to" in cells[2].source, (
        f"{path.name}: open with what the learner will be able to do"
    )


@pytest.mark.parametrize("name", ["00_start_here.ipynb", "01_the_bug.ipynb"])
def test_every_open_exercise_has_an_answer_or_a_check(name):
    cells = _exercise_cells(_cells(NOTEBOOKS / name))
    text = "\n".join(c.source for c in cells if c.cell_type == "markdown")
    items = re.findall(r"^\d+\. ", text, flags=re.M)
    answered = len(re.findall(r"<summary>Answer\b", text))
    checked = sum(1 for c in cells if c.cell_type == "code" and "checks." in c.source)
    assert len(items) <= answered + checked, (
        f"{name}: {len(items)} exercises, {answered} answers, {checked} checks"
    )


def test_chapter_01_has_a_predict_then_check_exercise():
    cells = _exercise_cells(_cells(NOTEBOOKS / "01_the_bug.ipynb"))
    assert any("Predict, then check" in c.source for c in cells if c.cell_type == "markdown")
    assert any(
        "prediction = ..." in c.source and "checks." in c.source for c in cells if c.cell_type == "code"
    )


@pytest.mark.parametrize("name", ["02_reading_autograd_graphs.ipynb", "03_rewiring_gradient_edges.ipynb"])
def test_small_exercise_checks_sit_behind_a_helper(name):
    code = [c.source for c in _exercise_cells(_cells(NOTEBOOKS / name)) if c.cell_type == "code"]
    checking = [s for s in code if "checks." in s]
    assert len(checking) >= 2, f"{name}: the small exercises call no checks helper"
    for source in code:
        assert not re.search(r"^\s*(if|elif)\b", source, flags=re.M), (
            f"{name}: check logic in sight:\n{source}"
        )
        assert "Counter(" not in source, f"{name}: a cell counts the answer for the learner"


def test_chapter_03_stepper_sits_under_the_after_graph():
    cells = _cells(NOTEBOOKS / "03_rewiring_gradient_edges.ipynb")
    after = next(
        i for i, c in enumerate(cells) if c.cell_type == "code" and re.search(r"^after = ", c.source, re.M)
    )
    stepper = next(i for i, c in enumerate(cells) if "gradient_stepper(" in c.source)
    assert 0 < stepper - after <= 3, f"the stepper is cell {stepper}, the after graph cell {after}"


@pytest.mark.notebook
@pytest.mark.parametrize("path", MINE, ids=[p.name for p in MINE])
def test_every_figure_has_alt_text(path):
    from executed import executed

    nb, _, _ = executed(path)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        data = [o.get("data", {}) for o in cell.outputs]
        shows = any(k in d for d in data for k in FIGURE) or any(
            "<svg" in d.get("text/html", "") for d in data
        )
        if shows:
            assert _alt(cell), f"{path.name}, cell {i} ({cell.id}) draws a figure without mystnb alt text"
