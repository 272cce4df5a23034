"""Write ``notebooks/11_exercises.ipynb`` and its solutions notebook from the stubs and the solutions.

    python -m dpteach.exercises._build        # from the repository root

The code cells come from ``stub_source`` / ``solution_source`` / ``check_source``, so the notebooks
cannot drift from the code the tests check (``tests/test_exercises.py`` compares them cell by cell).
Each exercise cell carries ``metadata.dpteach = {"exercise": key, "role": "stub" | "solution" | "check"}``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from .._course import SETUP_CELL
from ._records import EXERCISES
from ._sources import check_source, solution_source, stub_source

INTRO = """\
# 11 · Exercises: write the fix yourself

Each exercise below is one idea of the course, and you write it. Every task has two cells:

* a **stub cell**: the code to complete. Until you replace its `raise NotImplementedError(...)`, it fails
  in two lines that name the task. Its last line, `exercises.try_it(...)`, runs your code once; once
  you have written it, any error your code raises shows with its full traceback;
* a **check cell**: it runs your code against the real thing (Tasks 1, 2, 3 and 5 through `DataParallel` on
  three tiny models, an MLP, a conv net with BatchNorm and a model with tied weights, on 1, 2, 3 and 4 CPU
  slots, against the same model on one device; Task 4 against `dpteach.scatter` and `dpteach.gather` on
  nested inputs, then inside `DataParallel` on 2, 3 and 4 CPU slots; Task 6 counting the copies it makes),
  and says **"Correct!"** when everything holds; otherwise what is wrong, where, and a hint. It never raises.

Run the cells task by task: **Run All stops at the first stub you have not written yet**, since its cell
raises.

{table}

{closing} The tasks are independent: do them in any order. Worked solutions are in
`solutions/11_exercises_solutions.ipynb`; try first."""


def task_table() -> str:
    """The markdown table of the exercises, from their records."""
    rows = [f"| {t.number} · {t.title} | {t.writes} | {_where(t)} |" for t in EXERCISES.values()]
    return "\n".join(["| task | you write | chapter |", "| --- | --- | --- |", *rows])


def _where(task) -> str:
    return "— (new)" if task.chapter == "11" else task.chapter


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def closing_line() -> str:
    """Which tasks close which chapters, and which are new here: read from the records, so it cannot go stale."""
    closing = [t for t in EXERCISES.values() if t.chapter != "11"]
    new = [t for t in EXERCISES.values() if t.chapter == "11"]
    line = (
        f"Task{'s' * (len(closing) > 1)} {_and([str(t.number) for t in closing])} "
        f"{'are the ones that close' if len(closing) > 1 else 'closes'} chapter{'s' * (len(closing) > 1)} "
        f"{_and([t.chapter for t in closing])}{', respectively' if len(closing) > 1 else ''} (their "
        '"Try it yourself" sections)'
    )
    if new:
        line += f"; Task{'s' * (len(new) > 1)} {_and([str(t.number) for t in new])} {'are' if len(new) > 1 else 'is'} new"
    return line + "."


IMPORTS = """\
import torch
from torch import nn

import dpteach
from dpteach import exercises"""


SUMMARY = """\
## Summary

* Task 1: a replica's parameter learns nothing unless autograd made it *from* the original (issue #19540).
* Task 2: PR #20910 gave every copy an edge into one `ReduceAdd` node per parameter, summing onto the
  original's device. The engine records the operations a backward runs only under
  `backward(create_graph=True)`; then the gradients reaching the C++ `ReduceAdd` (chapter 10) can require
  grad, and its `TORCH_CHECK(!compute_requires_grad(inputs), ...)` throws, so double backward stopped there
  (issue #21144 kept it open). That check is the C++ node's (and dpteach's `ReduceAdd` keeps it); your
  `MyReduceAdd` has none, so under `create_graph=True` its sum is recorded like any other code (chapter 07
  does the same with `UncheckedReduceAdd`).
* Task 3: `Broadcast` and `ReduceAddCoalesced` are each other's backward: the `comm` calls they wrap
  leave autograd, so each backward calls the other's `apply` to be recorded, and Python's DataParallel
  supports double backward.
* Task 4: scatter and gather are recursive maps over the input's structure; keep every type and field.
* Task 5: slot 0 shares the model's buffers, so BatchNorm's statistics survive; every other slot's are lost.
* Task 6: `.to` alone copies onto another device; clone only on the tensor's own device (PR #20995).

Each check is also `exercises.check(key, *your_objects)`, and `print(exercises.stub_source(key))` shows a
stub again if you want to start over (the keys are in `exercises.TASKS`)."""


def _cell(source: str, key: str | None = None, role: str | None = None, tags: tuple[str, ...] = ()):
    cell = new_code_cell(source)
    if key:
        cell.metadata["dpteach"] = {"exercise": key, "role": role}
    if tags:
        cell.metadata["tags"] = list(tags)
    return cell


def exercise_cells(key: str) -> list[nbformat.NotebookNode]:
    """The two code cells of exercise ``key`` for any chapter: the stub (tagged ``raises-exception``) and its check."""
    return [
        _cell(stub_source(key), key, "stub", ("raises-exception",)),
        _cell(check_source(key), key, "check"),
    ]


def exercises_notebook() -> nbformat.NotebookNode:
    """The learners' notebook: a stub cell (tagged ``raises-exception``) and a check cell per task."""
    intro = INTRO.replace("{table}", task_table()).replace("{closing}", closing_line())
    cells = [new_code_cell(SETUP_CELL), new_markdown_cell(intro), new_code_cell(IMPORTS)]
    for key, task in EXERCISES.items():
        cells.append(new_markdown_cell(task.intro))
        if task.demo:
            cells += [new_markdown_cell(task.demo[0]), _cell(task.demo[1], key, "demo")]
            cells.append(new_markdown_cell("Your turn: fix the line, run the cell, then the check."))
        cells += exercise_cells(key)
    cells.append(new_markdown_cell(SUMMARY))
    return _finish(cells)


def solutions_notebook() -> nbformat.NotebookNode:
    """Worked solutions: each answer in full as a cell, then its check, which says "Correct!"."""
    cells = [
        new_code_cell(SETUP_CELL),
        new_markdown_cell(
            "# 11 · Exercises: worked solutions\n\nOne way to solve each task of "
            "[`11_exercises.ipynb`](../11_exercises.ipynb), and its check. Each cell is complete: the fix is marked "
            "`# FIX`. The same code lives in `dpteach.exercises.solutions`, which the tests check."
        ),
        new_code_cell(IMPORTS),
    ]
    for key, task in EXERCISES.items():
        heading = task.intro.split("\n\n", 1)[0]
        cells += [
            new_markdown_cell(f"{heading}\n\n{task.note}"),
            _cell(solution_source(key), key, "solution"),
            _cell(check_source(key), key, "check"),
        ]
    return _finish(cells)


def _finish(cells) -> nbformat.NotebookNode:
    nb = new_notebook(cells=cells)
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    for i, cell in enumerate(nb.cells):
        cell.id = f"ex11-{i:02d}"  # stable ids: rebuilding gives the same file
    return nb


def main(root: Path) -> None:
    nbformat.write(exercises_notebook(), root / "notebooks" / "11_exercises.ipynb")
    (root / "notebooks" / "solutions").mkdir(parents=True, exist_ok=True)
    nbformat.write(solutions_notebook(), root / "notebooks" / "solutions" / "11_exercises_solutions.ipynb")
    from .._course import main as add_links  # the link cell and set-up cell every chapter has

    add_links([str(root)])


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path.cwd())
