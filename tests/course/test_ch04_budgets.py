"""Chapters 04, 05, 07 and 10 read straight: word budgets, folded asides, short cells, the key result early.

Main-path words are the whitespace-separated tokens of the markdown cells with their
``<details>`` blocks removed (HTML tags, table pipes and code in backticks count).
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
DETAILS = re.compile(r"<details>.*?</details>", re.S)
# chapter -> (main-path word target, the tag of the cell that shows its key picture or result)
CHAPTERS = {
    "04_the_python_way": (1537, "payoff-plot"),
    "05_buffers_and_batchnorm": (1330, "running-mean-plot"),
    "07_double_backward": (1500, "penalty-graph"),
    "10_the_cpp_original": (1275, "key-result"),
}


def cells(name):
    return nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4).cells


def main_path_words(name) -> int:
    return sum(len(DETAILS.sub("", c.source).split()) for c in cells(name) if c.cell_type == "markdown")


@pytest.mark.parametrize("name", CHAPTERS)
def test_main_path_fits_its_word_target(name):
    words, target = main_path_words(name), CHAPTERS[name][0]
    assert words <= target, f"{name}: {words} main-path words, target {target}: fold an aside into <details>"


@pytest.mark.parametrize("name", CHAPTERS)
def test_every_going_deeper_block_is_short_and_folded(name):
    for i, c in enumerate(cells(name)):
        if c.cell_type != "markdown":
            continue
        assert c.source.count("<details>") == c.source.count("</details>"), (
            f"{name} cell {i}: unclosed <details>"
        )
        for block in DETAILS.findall(c.source):
            assert len(block.split()) <= 400, (
                f"{name} cell {i}: a <details> block of {len(block.split())} words"
            )


@pytest.mark.parametrize("name", CHAPTERS)
def test_no_code_cell_over_25_lines(name):
    for i, c in enumerate(cells(name)):
        stub = "raises-exception" in c.metadata.get("tags", [])  # an exercise stub may be longer
        if c.cell_type == "code" and not stub:
            assert len(c.source.splitlines()) <= 25, f"{name} cell {i}: {len(c.source.splitlines())} lines"


@pytest.mark.parametrize("name", CHAPTERS)
def test_key_picture_within_the_first_five_cells(name):
    tags = [c.metadata.get("tags", []) for c in cells(name)]
    where = [i for i, t in enumerate(tags) if CHAPTERS[name][1] in t]
    assert where and where[0] < 5, (
        f"{name}: the cell tagged {CHAPTERS[name][1]!r} is at {where}, not in cells 0-4"
    )


@pytest.mark.parametrize("name", CHAPTERS)
def test_the_chapter_says_what_the_learner_will_be_able_to_do(name):
    opening = " ".join(c.source for c in cells(name)[:3] if c.cell_type == "markdown")
    assert "By the end of this chapter you can" in opening or "By its end you can" in opening


def exercise_section(name):
    """The cells from the ``## Exercises`` heading to the ``## Try it yourself`` one (or the end)."""
    chapter = cells(name)
    start = next(
        i for i, c in enumerate(chapter) if c.cell_type == "markdown" and c.source.startswith("## Exercises")
    )
    end = next((i for i, c in enumerate(chapter) if c.source.startswith("## Try it yourself")), len(chapter))
    return chapter[start:end]


@pytest.mark.parametrize("name", CHAPTERS)
def test_every_exercise_list_has_hints_and_a_worked_answer(name):
    """Hints: a "Hints" block, or a check cell per exercise, whose wrong tries bring the hints (chapter 07).
    Worked answers: one "Answer" block for the list, or an "Answer N" block for every exercise N."""
    section = exercise_section(name)
    text = "\n".join(c.source for c in section if c.cell_type == "markdown")
    numbers = re.findall(r"^(\d+)\. ", DETAILS.sub("", text), re.M)
    checks = [c for c in section if c.cell_type == "code" and re.search(r"^checks\.\w+\(", c.source, re.M)]
    assert numbers, name
    assert "<summary>Hints" in text or len(checks) >= len(numbers), name
    each = all(f"<summary>Answer {n}</summary>" in text for n in numbers)
    assert "<summary>Answer</summary>" in text or each, name


@pytest.mark.parametrize("name", CHAPTERS)
def test_figures_have_alt_text(name):
    for i, c in enumerate(cells(name)):
        draws = c.cell_type == "code" and re.search(r"autograd_graph\(|plt\.subplots|\.draw\(", c.source)
        if draws and (
            "display(" in c.source
            or c.source.rstrip().splitlines()[-1].startswith(("dpteach.", "graph", "penalty_graph.", "fig"))
        ):
            assert c.metadata.get("mystnb", {}).get("image", {}).get("alt"), (
                f"{name} cell {i}: a figure without alt text"
            )
