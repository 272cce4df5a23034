"""Every exercise of chapters 00-06 has a worked answer to unfold, a ``<details><summary>Answer``
block: its own, after the exercise and before the next one, one named after it (``Answer 3``,
chapter 06), or a numbered entry of one block that answers the chapter's exercises together
(chapters 04 and 05). A check cell is no answer: it gives
the answer, or says where it is, only from the third failed try.

The exercises are the numbered items (``1. `` or ``**1. ``) of the section from ``## Exercises`` to
``## Try it yourself``, outside ``<details>`` blocks; the Try-it tasks have their worked solutions in
``notebooks/solutions/``.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
CHAPTERS = sorted(p for p in NOTEBOOKS.glob("0[0-6]_*.ipynb"))
DETAILS = re.compile(r"<details\b.*?</details>", re.S)
ANSWER = re.compile(r"<details>\s*<summary>Answer ?(\d*)[^<]*</summary>(.*?)</details>", re.S)
ITEM = re.compile(r"^(?:\*\*)?(\d+)\. ", re.M)


def exercise_text(path: Path) -> str:
    """The markdown of the chapter's exercise section, cells joined in order."""
    cells = nbformat.read(path, as_version=4).cells
    start = next(i for i, c in enumerate(cells) if c.cell_type == "markdown" and "## Exercises" in c.source)
    end = next((i for i, c in enumerate(cells) if i > start and "## Try it yourself" in c.source), len(cells))
    return "\n".join(c.source for c in cells[start:end] if c.cell_type == "markdown")


def unanswered(text: str) -> list[str]:
    """The exercise numbers in ``text`` that no Answer block answers."""
    blanked = DETAILS.sub(lambda m: " " * len(m.group()), text)  # same offsets, items outside blocks only
    items = [(m.group(1), m.start()) for m in ITEM.finditer(blanked)]
    answers = [(m.start(), m.group(1), m.group(2)) for m in ANSWER.finditer(text)]
    missing = []
    for k, (number, start) in enumerate(items):
        end = items[k + 1][1] if k + 1 < len(items) else len(text)
        own = any(start < at < end or named == number for at, named, _ in answers)
        combined = any(re.search(rf"^\s*{number}\. ", body, re.M) for _, _, body in answers)
        if not (own or combined):
            missing.append(number)
    return missing


def test_the_rule_finds_a_missing_answer():
    text = "## Exercises\n\n1. one\n\n<details><summary>Answer</summary>\n\nyes\n</details>\n\n2. two\n"
    assert unanswered(text) == ["2"]
    combined = "1. one\n2. two\n<details><summary>Answer</summary>\n\n1. a\n2. b\n</details>"
    assert unanswered(combined) == []
    named = "1. one\n2. two\n<details><summary>Answer 2</summary>\n\nb\n</details>"
    assert unanswered(named) == ["1"]
    hints_only = "1. one\n<details><summary>Hints</summary>\n\n1. a\n</details>"
    assert unanswered(hints_only) == ["1"]


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.name for p in CHAPTERS])
def test_every_exercise_has_a_worked_answer(path):
    text = exercise_text(path)
    assert ITEM.search(DETAILS.sub(" ", text)), f"{path.name}: no numbered exercises found"
    assert not unanswered(text), f"{path.name}: exercises {unanswered(text)} have no Answer block"
