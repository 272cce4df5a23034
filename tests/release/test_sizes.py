"""Two wings stay within a size: dpteach/graph/ and dpteach/exercises/, counted in lines.

A folder's lines are counted as ``find DIR -type f -not -path '*__pycache__*' | xargs wc -l`` counts
them: the newlines of every file under it, whatever its kind, outside ``__pycache__``. A change that
needs more room cuts what is written twice first (the ``duplicates`` tool finds it); the core in
dpteach/ is imported, never copied.
"""

from __future__ import annotations

from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "dpteach"
LIMITS = {"graph": 2_150, "exercises": 2_250}


def lines(folder: Path) -> int:
    """The lines of every file under ``folder`` outside ``__pycache__``, as ``wc -l`` counts them (newlines)."""
    files = [p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    return sum(p.read_bytes().count(b"\n") for p in files)


def test_the_count_is_wc_l(tmp_path):
    (tmp_path / "a.py").write_text("one\ntwo\n")
    (tmp_path / "b.txt").write_text("three\nno newline at the end")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "a.pyc").write_bytes(b"\n" * 50)
    assert lines(tmp_path) == 3


@pytest.mark.parametrize("wing", sorted(LIMITS))
def test_the_wing_stays_within_its_lines(wing):
    n, limit = lines(PACKAGE / wing), LIMITS[wing]
    assert n <= limit, (
        f"dpteach/{wing}/ has {n} lines, limit {limit}: cut what is written twice or not needed "
        f"(`duplicates --repo dpteach/{wing}`) before adding more"
    )
