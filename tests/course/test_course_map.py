"""Chapter 00's map lists every chapter there is, by its file, number and title, and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
ROW = re.compile(r"\b(\d\d) · \[([^\]]+)\]\(([^)]+\.ipynb)\)")  # "03 · [title](file.ipynb)", a list item


def _map_rows() -> list[tuple[str, str, str]]:
    nb = nbformat.read(NOTEBOOKS / "00_start_here.ipynb", as_version=4)
    (cell,) = [c for c in nb.cells if c.cell_type == "markdown" and c.source.startswith("## The map")]
    return ROW.findall(cell.source)


def _title(path: Path) -> str:
    nb = nbformat.read(path, as_version=4)
    heading = next(
        c.source.splitlines()[0] for c in nb.cells if c.cell_type == "markdown" and c.source.startswith("# ")
    )
    return heading.split("·", 1)[1].strip()


def test_the_map_lists_every_chapter_file_once():
    files = sorted(p.name for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    rows = _map_rows()
    assert [file for _, _, file in rows] == files  # every chapter, in order, and no file that is not there


def test_each_row_has_the_chapters_number_and_title():
    for number, name, file in _map_rows():
        assert file.startswith(f"{number}_"), (number, file)
        assert _title(NOTEBOOKS / file).lower().startswith(name.lower()), (name, _title(NOTEBOOKS / file))


HARDWARE = ("a CPU (laptop, Binder)", "one GPU (Colab)", "several GPUs")  # the README's three rows


def test_the_map_says_what_each_machine_gets_in_one_table():
    nb = nbformat.read(NOTEBOOKS / "00_start_here.ipynb", as_version=4)
    (cell,) = [c for c in nb.cells if c.cell_type == "markdown" and c.source.startswith("## The map")]
    rows = [line for line in cell.source.splitlines() if line.startswith("| ") and "---" not in line]
    assert [row.split(" | ")[0].lstrip("| ") for row in rows[1:]] == list(HARDWARE)  # header, then 3 rows
    elsewhere = "\n".join(c.source for c in nb.cells if c is not cell and c.cell_type == "markdown")
    assert not any(f"| {kind} |" in elsewhere for kind in HARDWARE)  # told once, in the map
