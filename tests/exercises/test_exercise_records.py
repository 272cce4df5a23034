"""One registry: an exercise is a ``taskN_*.py`` (record, check, ``try_answer``) and its objects in stubs/solutions.

The registry finds the task modules by their file names; the package exports each check from the
record; chapter 11's table (a cell tagged ``task-table``) has a row for every record.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat
from conftest import parse_source

import dpteach
from dpteach import exercises
from dpteach.exercises import _feedback, _records, solutions, stubs

PACKAGE = Path(exercises.__file__).parent
ROOT = PACKAGE.parents[1]


def test_each_key_is_written_in_one_file_only():
    for key, _task in exercises.TASKS.items():
        if key in dpteach.STRATEGIES:
            continue  # "rewire" is a strategy's name too, written wherever that strategy is used
        holders = [p.name for p in PACKAGE.rglob("*.py") if re.search(rf"[\"']{key}[\"']", p.read_text())]
        assert holders == [f"{_records.module_of(key).__name__.rsplit('.', 1)[1]}.py"], (key, holders)


def test_every_task_file_is_found_and_ordered_by_its_number():
    files = sorted(PACKAGE.glob("task*_*.py"), key=lambda p: int(re.match(r"task(\d+)", p.name).group(1)))
    assert [m.__file__ for m in _records.MODULES] == [str(p) for p in files]
    assert [t.number for t in exercises.TASKS.values()] == list(range(1, len(exercises.TASKS) + 1))


def test_the_records_are_complete_and_exported():
    for key, task in exercises.TASKS.items():
        assert task.names and task.imports and task.title and task.chapter
        assert getattr(exercises, task.check) is _records.check_of(key) and task.check in exercises.__all__
        assert all(
            getattr(exercises, name) is getattr(_records.module_of(key), name) for name in task.helpers
        )
        assert callable(_records.module_of(key).try_answer)
        for module in (stubs, solutions):
            assert all(hasattr(module, name) for name in task.names), (module.__name__, task.names)


def test_no_task_module_imports_the_registry():
    for module in _records.MODULES:
        tree = parse_source(Path(module.__file__).read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert "_records" not in imported and "" not in imported, module.__name__


def test_every_kind_a_task_can_find_has_a_hint():
    """A problem is said with what to change: each kind recorded has a hint, in its task or shared."""
    harness = (PACKAGE / "_harness.py").read_text() + (PACKAGE / "_paths.py").read_text()
    shared = set(re.findall(r'(?:problem\(|stop\(|return |append\(\()\s*"(\w+)",', harness))
    for module in _records.MODULES:
        source = Path(module.__file__).read_text()
        kinds = set(re.findall(r'(?:problem\(|stop\(|return |found = )\s*\(?\s*"(\w+)",', source)) | shared
        # a kind picked first (`kind = "a"`, or `kind = "a" if ... else "b"`) and said once below
        chosen = re.findall(r'\bkind = "(\w+)"(?: if [^\n]* else "(\w+)")?', source)
        kinds |= {kind for pair in chosen for kind in pair if kind}
        hints = {**_feedback.COMMON_HINTS, **module.HINTS}
        assert kinds and kinds <= set(hints), (module.__name__, sorted(kinds - set(hints)))


def test_chapter_11_has_a_table_row_for_every_task():
    nb = nbformat.read(ROOT / "notebooks" / "11_exercises.ipynb", as_version=4)
    (table,) = [c.source for c in nb.cells if "task-table" in c.metadata.get("tags", [])]
    for task in exercises.TASKS.values():
        taught = task.taught or ("— (new)" if task.chapter == "11" else task.chapter)  # where the idea is
        tried = "—" if task.chapter == "11" else task.chapter  # the chapter whose "Try it yourself" has it
        (row,) = [line for line in table.splitlines() if line.startswith(f"| {task.number} ·")]
        assert row.rstrip().endswith(f"| {taught} | {tried} |"), row
