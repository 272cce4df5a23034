"""One record per exercise, in its own file; every table about the exercises is derived from the records."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat

import dpteach
from dpteach import exercises
from dpteach.exercises import _build, _records

PACKAGE = Path(exercises.__file__).parent
ROOT = PACKAGE.parents[1]


def test_each_key_is_written_in_one_file_only():
    for key, _task in exercises.TASKS.items():
        if key in dpteach.STRATEGIES:
            continue  # "rewire" is a strategy's name too, written wherever that strategy is used
        holders = [p.name for p in PACKAGE.rglob("*.py") if re.search(rf"[\"']{key}[\"']", p.read_text())]
        assert holders == [f"{_records.module_of(key).__name__.rsplit('.', 1)[1]}.py"], (key, holders)


def test_the_records_are_complete_and_in_order():
    assert [t.number for t in exercises.TASKS.values()] == list(range(1, len(exercises.TASKS) + 1))
    for key, task in exercises.TASKS.items():
        assert task.names and task.writes and task.imports and task.intro.startswith(f"## Task {task.number}")
        assert callable(_records.check_of(key)) and getattr(exercises, task.check) is _records.check_of(key)
        assert callable(_records.module_of(key).try_answer)


def test_the_tables_come_from_the_records():
    table = _build.task_table()
    for task in exercises.TASKS.values():
        where = "— (new)" if task.chapter == "11" else task.chapter  # a task of chapter 11 only is new there
        assert f"| {task.number} · {task.title} | {task.writes} | {where} |" in table
        assert f"``{task.key}``" in exercises.__doc__ and f"``{task.check}(" in exercises.__doc__
    nb = nbformat.read(ROOT / "notebooks" / "11_exercises.ipynb", as_version=4)
    assert table in nb.cells[1].source + "".join(c.source for c in nb.cells if c.cell_type == "markdown")
    closing = _build.closing_line()  # "Tasks 1, 2, 3 and 5 ... close chapters ...; Task 4 is new."
    assert closing in "".join(c.source for c in nb.cells if c.cell_type == "markdown")
    closers = [t for t in exercises.TASKS.values() if t.chapter != "11"]
    assert ", ".join(t.chapter for t in closers[:-1]) + f" and {closers[-1].chapter}" in closing
