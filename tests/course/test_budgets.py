"""Word and size budgets of the chapters 00-12, measured as below.

* Main-path words: the whitespace-separated tokens of a chapter's markdown cells after every
  ``<details>...</details>`` block is cut out. HTML tags, table pipes and code in backticks count
  as words. At most 2,000 per chapter, 1,500 for chapters 06 and 08, 18,000 for 00-12 together.
* Each Going-deeper block (``<details>...</details>``) holds at most 400 words, counted the same way.
* No code cell over 25 lines, exercise stubs aside. A cell is an exercise stub when its metadata
  says so: the Tasks' stubs carry ``{"dpteach": {"role": "stub"}}`` (written by dpteach.exercises),
  any other stub a learner completes carries the cell tag ``exercise-stub`` in ``metadata.tags``.
* Chapter 09's step-time section holds at most 300 words. It is found by the cell tag ``step-time``
  on the markdown cell that holds its heading; the section runs from that heading to the next
  heading of the same or a higher level (``#``/``##``), across cells, ``<details>`` blocks cut out.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
CHAPTERS = sorted(p for p in NOTEBOOKS.glob("[01][0-9]_*.ipynb") if int(p.name[:2]) <= 12)
DETAILS = re.compile(r"<details\b.*?</details>", re.S | re.I)
CHAPTER_LIMIT, SHORT_LIMIT, SHORT_CHAPTERS = 2_000, 1_500, ("06", "08")
TOTAL_LIMIT, BLOCK_LIMIT, CODE_LINES, STEP_TIME_LIMIT = 18_000, 400, 25, 300


def _cells(path: Path):
    return nbformat.read(path, as_version=4).cells


def words(markdown: str) -> int:
    """Main-path words of one markdown text: its tokens once the <details> blocks are cut out."""
    return len(DETAILS.sub(" ", markdown).split())


def main_path_words(path: Path) -> int:
    return sum(words(c.source) for c in _cells(path) if c.cell_type == "markdown")


def is_stub(cell) -> bool:
    return cell.metadata.get("dpteach", {}).get("role") == "stub" or "exercise-stub" in cell.metadata.get(
        "tags", []
    )


def test_the_counting_rule():
    text = (
        "one `two three` | four |\n<details><summary>Going deeper: x</summary>\nnot counted\n</details> five"
    )
    assert words(text) == 7  # backticked code and table pipes count; the block does not
    assert DETAILS.findall("<details>a</details> b <details>c d</details>") == [
        "<details>a</details>",
        "<details>c d</details>",
    ]


def test_the_chapters_are_00_to_12():
    assert [p.name[:2] for p in CHAPTERS] == [f"{n:02d}" for n in range(13)]


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.name for p in CHAPTERS])
def test_main_path_within_the_chapter_budget(path):
    limit = SHORT_LIMIT if path.name[:2] in SHORT_CHAPTERS else CHAPTER_LIMIT
    n = main_path_words(path)
    assert n <= limit, f"{path.name}: {n} main-path words, budget {limit}: fold asides into Going deeper"


def test_main_path_of_the_whole_course_within_budget():
    per = {p.name[:2]: main_path_words(p) for p in CHAPTERS}
    assert sum(per.values()) <= TOTAL_LIMIT, f"{sum(per.values())} main-path words in 00-12: {per}"


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.name for p in CHAPTERS])
def test_each_going_deeper_block_within_budget(path):
    for i, cell in enumerate(_cells(path)):
        if cell.cell_type != "markdown":
            continue
        for block in DETAILS.findall(cell.source):
            n = len(block.split())
            assert n <= BLOCK_LIMIT, (
                f"{path.name}, cell {i}: a <details> block of {n} words (at most {BLOCK_LIMIT})"
            )


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.name for p in CHAPTERS])
def test_no_code_cell_over_25_lines(path):
    long = [
        (i, len(c.source.splitlines()))
        for i, c in enumerate(_cells(path))
        if c.cell_type == "code" and not is_stub(c) and len(c.source.splitlines()) > CODE_LINES
    ]
    assert not long, f"{path.name}: code cells (index, lines) over {CODE_LINES} lines: {long}"


def _heading_level(line: str) -> int:
    m = re.match(r"(#+)\s", line)
    return len(m.group(1)) if m else 0


def step_time_words(path: Path) -> int:
    """Words of the section whose heading sits in the markdown cell tagged ``step-time``."""
    cells = _cells(path)
    start = next(
        (
            i
            for i, c in enumerate(cells)
            if c.cell_type == "markdown" and "step-time" in c.metadata.get("tags", [])
        ),
        None,
    )
    assert start is not None, f"{path.name}: no markdown cell tagged 'step-time' on the step-time heading"
    lines = DETAILS.sub(" ", cells[start].source).splitlines()
    first = next(j for j, line in enumerate(lines) if _heading_level(line))
    level, text = _heading_level(lines[first]), []
    for i, cell in enumerate(cells[start:], start):
        if cell.cell_type != "markdown":
            continue
        for j, line in enumerate(DETAILS.sub(" ", cell.source).splitlines()):
            if i == start and j < first:
                continue
            if (i, j) != (start, first) and 0 < _heading_level(line) <= level:
                return len(" ".join(text).split())
            text.append(line)
    return len(" ".join(text).split())


def test_chapter_09_step_time_section_within_budget():
    (path,) = [p for p in CHAPTERS if p.name.startswith("09_")]
    n = step_time_words(path)
    assert n <= STEP_TIME_LIMIT, (
        f"{path.name}: the step-time section has {n} words (at most {STEP_TIME_LIMIT})"
    )
