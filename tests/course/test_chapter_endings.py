"""Every chapter ends once, in one order: summary, exercises, then the check ("Try it yourself").

After its ``## Summary`` a chapter may have one ``## Exercises`` section, then one ``## Try it
yourself`` section (an exercise's stub and check, or a widget to explore), and no other section;
none of the three appears before the summary. Chapter 11 is all exercises, ending with its summary.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = sorted(p for p in (ROOT / "notebooks").glob("[01][0-9]_*.ipynb") if not p.name.startswith("11_"))
ORDER = ("summary", "exercises", "try")


def _kind(heading: str) -> str:
    for kind, pattern in (
        ("summary", r"## Summary\b"),
        ("exercises", r"## Exercises\b"),
        ("try", r"## Try it yourself\b"),
    ):
        if re.match(pattern, heading):
            return kind
    return "other"


def sections(path: Path) -> list[tuple[int, str]]:
    """(cell index, kind) of every ``## `` heading of the chapter's markdown, in order."""
    nb = nbformat.read(path, as_version=4)
    return [
        (i, _kind(line))
        for i, c in enumerate(nb.cells)
        if c.cell_type == "markdown"
        for line in c.source.splitlines()
        if line.startswith("## ")
    ]


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.name for p in CHAPTERS])
def test_chapter_ends_with_summary_exercises_check(path):
    kinds = [k for _, k in sections(path)]
    assert kinds.count("summary") == 1, f"{path.name}: one summary, found {kinds.count('summary')}"
    tail = kinds[kinds.index("summary") :]
    assert "other" not in tail, f"{path.name}: a section after the summary: {tail}"
    assert all(kinds.count(k) <= 1 for k in ORDER), f"{path.name} ends twice: {tail}"
    assert tail == sorted(tail, key=ORDER.index), f"{path.name}: {tail}, not in the order {ORDER}"


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.name for p in CHAPTERS])
def test_exercise_cells_sit_in_the_try_it_section(path):
    nb = nbformat.read(path, as_version=4)
    heads = sections(path)
    for i, cell in enumerate(nb.cells):
        if cell.metadata.get("dpteach", {}).get("role") in ("stub", "check"):
            section = [kind for j, kind in heads if j < i][-1]
            assert section == "try", f"{path.name}, cell {i}: an exercise cell outside 'Try it yourself'"
