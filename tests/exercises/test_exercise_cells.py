"""The exercise cells inside the chapters: verbatim from the library, named so they shadow nothing.

A stub defines ``MyReduceAdd``, ``MyBroadcast``, ``MyReduceAddCoalesced``: after "Run all", an
earlier cell of the chapter that uses the library's ``ReduceAdd`` or ``Broadcast`` still gets the
library's class when the learner runs it again (the test runs the chapter, then that cell again, in
one kernel). And the first thing chapter 11 shows of Task 1, the check on the broken strategy,
nudges without giving the answer.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat
import pytest
from conftest import parse_source

from dpteach import exercises

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = sorted(p for p in (ROOT / "notebooks").glob("[01][0-9]_*.ipynb") if not p.name.startswith("11_"))


def _role(cell):
    return cell.metadata.get("dpteach", {}).get("role")


def _defined(source: str) -> set[str]:
    """Names a cell binds at its top level (imports, defs, classes, assignments)."""
    try:
        tree = parse_source(source)
    except SyntaxError:  # IPython magics
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.name for p in CHAPTERS])
def test_chapter_exercise_cells_are_the_librarys(path):
    for cell in nbformat.read(path, as_version=4).cells:
        if _role(cell) == "stub":
            assert cell.source == exercises.stub_source(cell.metadata["dpteach"]["exercise"]), path.name
        if _role(cell) == "check":
            assert cell.source == exercises.check_source(cell.metadata["dpteach"]["exercise"]), path.name


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.name for p in CHAPTERS])
def test_a_stub_defines_no_name_an_earlier_cell_defined(path):
    earlier: set[str] = set()
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type != "code":
            continue
        if _role(cell) == "stub":
            names = set(exercises.TASKS[cell.metadata["dpteach"]["exercise"]].names)
            assert not names & earlier, f"{path.name}: the stub redefines {sorted(names & earlier)}"
        earlier |= _defined(cell.source)


@pytest.mark.notebook
@pytest.mark.parametrize(
    "chapter, library",
    [
        ("03_rewiring_gradient_edges.ipynb", {"ReduceAdd": "dpteach.replicate.rewire"}),
        (
            "07_double_backward.ipynb",
            {"Broadcast": "dpteach.functions", "ReduceAddCoalesced": "dpteach.functions"},
        ),
    ],
)
def test_rerunning_an_earlier_cell_after_run_all_uses_the_librarys_class(chapter, library):
    from nbclient import NotebookClient

    path = ROOT / "notebooks" / chapter
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    uses = re.compile(r"\b(" + "|".join(library) + r")\.apply\(")
    stub_at = next(i for i, c in enumerate(nb.cells) if _role(c) == "stub")
    again = next(
        i for i, c in enumerate(nb.cells[:stub_at]) if c.cell_type == "code" and uses.search(c.source)
    )
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):  # "Run all"; the stub's error is tagged and expected
            client.execute_cell(cell, index)
        nb.cells.append(nbformat.v4.new_code_cell(nb.cells[again].source))  # the learner runs it again
        rerun = client.execute_cell(nb.cells[-1], len(nb.cells) - 1)
        assert not [o for o in rerun.outputs if o.output_type == "error"], rerun.outputs
        probe = "\n".join(
            f"assert {name}.__module__ == {module!r}, {name}" for name, module in library.items()
        )
        nb.cells.append(nbformat.v4.new_code_cell(probe))
        checked = client.execute_cell(nb.cells[-1], len(nb.cells) - 1)
        assert not [o for o in checked.outputs if o.output_type == "error"], checked.outputs


def test_the_first_check_of_task_1_nudges_without_the_answer():
    shown = str(exercises.check_clone_bug("clone"))  # chapter 11 runs this just above Task 1's stub
    assert not shown.startswith("Correct!")
    for answer in ("copy=True", ".clone()", "clone_tensor(param"):
        assert answer not in shown, answer


NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("[01][0-9]_*.ipynb")), ids=lambda p: p.name)
def test_a_chapter_counts_the_tasks_there_are(path):
    text = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown")
    said = re.findall(r"\b(\w+) tasks\b", text, flags=re.IGNORECASE)
    counted = [w.lower() for w in said if w.lower() in NUMBER_WORDS or w.isdigit()]
    for word in counted:
        n = int(word) if word.isdigit() else NUMBER_WORDS.index(word)
        assert n == len(exercises.TASKS), f"{path.name} says '{word} tasks'; there are {len(exercises.TASKS)}"
