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
from ._sources import check_source, solution_source, stub_source

INTRO = """\
# 11 · Exercises: write the fix yourself

Each exercise below is one idea of the course, and you write it. Every task has two cells:

* a **stub cell**: the code to complete. Until you replace its `raise NotImplementedError(...)`, it fails
  loudly, naming the task (its last line, `exercises.try_it(...)`, runs your code once and shows any error
  with its full traceback);
* a **check cell**: it runs your code through `DataParallel` on three tiny models (an MLP, a conv net with
  BatchNorm, a model with tied weights) and 1 to 4 CPU slots, against the same model on one device, and
  says **"Correct!"** when everything holds; otherwise what is wrong, where, and a hint. It never raises.

| task | you write | chapter |
| --- | --- | --- |
| 1 · find the bug in clone-based replicate | the line that loses the gradient edge | 01 |
| 2 · rewire gradient edges | `ReduceAdd`, PR #20910's node | 03 |
| 3 · Broadcast / ReduceAddCoalesced for double backward | the adjoint pair of `replicate.py` | 07 |
| 4 · scatter and gather nested inputs | `scatter` and `gather` for tuples, dicts, namedtuples, dataclasses | 04 |
| 5 · keep BatchNorm statistics from slot 0 | a strategy whose slot-0 buffers are the model's | 05 |

The tasks are independent: do them in any order. Worked solutions are in
`solutions/11_exercises_solutions.ipynb`; try first."""

IMPORTS = """\
import torch
from torch import nn

import dpteach
from dpteach import exercises"""

TASKS = {
    "clone_bug": (
        "## Task 1 · Find the bug in clone-based replicate\n\n"
        "Chapter 01 trained a model under `strategy=\"clone\"` and watched nothing happen (issue #19540). "
        "`replicate_by_clone` below builds replicas the same way: a deep copy per slot, then every parameter "
        "replaced by `copy`. The line that made `copy` is shown as a `# BROKEN` comment. Replace the `raise` "
        "with a line that makes a copy of `param` on `device` that **keeps a gradient edge back to `param`** "
        "and has memory of its own. One line; the check also tells you about the traps (`torch.no_grad()`, "
        "`.detach()`, `nn.Parameter`, and `.to(device)` on the device a tensor is already on).",
        "First, read what the check says about the broken strategy itself, `\"clone\"`: every sentence is one "
        "symptom of the bug.",
        'exercises.check_clone_bug("clone")',
    ),
    "rewire": (
        "## Task 2 · Rewire gradient edges (PR #20910)\n\n"
        "PR #20910 kept `clone()` and gave every replica parameter a gradient edge into one `ReduceAdd` node "
        "per original parameter. Write that node. `exercises.rewire_with(ReduceAdd)` builds the `\"rewire\"` "
        "strategy around your class: it clones every slot and calls `ReduceAdd.apply(original, *copies)` once "
        "per original parameter, putting the outputs in the replicas. Forward hands the copies back as the "
        "node's outputs; backward sums the copies' gradients **on the original's device** (chapter 03).",
    ),
    "broadcast_pair": (
        "## Task 3 · A Broadcast / ReduceAddCoalesced pair that survives double backward\n\n"
        "Python's `replicate.py` uses two autograd functions, each the other's backward (PR #2508, after issue "
        "#2467, \"Double backward functionality within dataParallel is incomplete\", whose error read "
        "\"Scatter is not differentiable twice\"). Write both. Forward does the copying and the summing with "
        "`dpteach.comm`; backward must call the **partner's `apply`**, so the backward graph is itself made of "
        "nodes with a backward, and a gradient penalty or a Hessian-vector product can go through it (chapter 07). "
        "The check replicates with `exercises.broadcast_with(Broadcast)` and compares gradients *and* the "
        "gradients of a gradient penalty with one device's.",
    ),
    "scatter_gather": (
        "## Task 4 · Scatter and gather nested inputs\n\n"
        "`DataParallel` splits its inputs over the slots and joins the outputs back. Inputs come nested: "
        "tuples, lists, dicts, namedtuples, dataclasses, and things that are not tensors at all. Write "
        "`scatter` and `gather`: tensors are split (and joined) along `dim` with the differentiable `Scatter` / "
        "`Gather` functions, containers keep their type and every field, anything else is shared by every slot. "
        "PyTorch's `scatter` hands a dataclass to every slot unsplit (issue #45840) and its `gather` cannot "
        "rebuild one (issue #41327); yours must do both.",
    ),
    "batchnorm": (
        "## Task 5 · Keep BatchNorm statistics from slot 0\n\n"
        "PR #20910's replicas deep-copy every buffer, so BatchNorm's running statistics, updated in place on "
        "each replica, vanish with the replicas (issue #21144, and chapter 05). Python's `replicate.py` avoids "
        "this because slot 0's replica shares the model's memory. Start from the `\"rewire\"` replicas and make "
        "every buffer of slot 0's replica **be** the model's own buffer; the other slots keep their copies "
        "(only slot 0's statistics survive, as in PyTorch).",
    ),
}

SOLUTION_NOTES = {
    "clone_bug": "`param.to(device, copy=True)` is computed by autograd from `param`, so its `grad_fn` has an "
    "edge to `param`; `copy=True` gives every slot its own memory even on the device `param` is on.",
    "rewire": "Forward returns the copies (detached aliases of the clones' memory), which makes them the node's "
    "outputs; backward moves every gradient to `ctx.destination` and adds them: one value for `original`, "
    "`None` for each copy.",
    "broadcast_pair": "Each backward is the other's `apply`: the sum in Broadcast's backward is a "
    "ReduceAddCoalesced node, whose own backward is a Broadcast, and so on, as deep as differentiation goes.",
    "scatter_gather": "One recursive function each. A namedtuple takes its fields as arguments "
    "(`type(obj)(*fields)`), a dataclass is rebuilt with `dataclasses.replace`, and `zip` stops at the "
    "shortest, so a small batch gives fewer pieces than slots.",
    "batchnorm": "For every buffer, the owner module's `_buffers` entry in slot 0's replica is set to the "
    "original buffer itself: BatchNorm's in-place updates on slot 0 now land in the model.",
}

SUMMARY = """\
## Summary

* Task 1: a replica's parameter learns nothing unless autograd made it *from* the original (issue #19540).
* Task 2: PR #20910 gave every copy an edge into one `ReduceAdd` node per parameter, summing onto the
  original's device. Its C++ body was made of recorded operations, but an explicit check refused
  gradients that require grad, so double backward stopped there (issue #21144 kept it open).
* Task 3: `Broadcast` and `ReduceAddCoalesced` are each other's backward: the `comm` calls they wrap
  leave autograd, so each backward calls the other's `apply` to be recorded, and Python's DataParallel
  supports double backward.
* Task 4: scatter and gather are recursive maps over the input's structure; keep every type and field.
* Task 5: slot 0 shares the model's buffers, so BatchNorm's statistics survive; every other slot's are lost.

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
    return [_cell(stub_source(key), key, "stub", ("raises-exception",)), _cell(check_source(key), key, "check")]


def exercises_notebook() -> nbformat.NotebookNode:
    """The learners' notebook: a stub cell (tagged ``raises-exception``) and a check cell per task."""
    cells = [new_code_cell(SETUP_CELL), new_markdown_cell(INTRO), new_code_cell(IMPORTS)]
    for key, (text, *demo) in TASKS.items():
        cells.append(new_markdown_cell(text))
        if demo:
            cells += [new_markdown_cell(demo[0]), _cell(demo[1], key, "demo")]
            cells.append(new_markdown_cell("Your turn: fix the line, run the cell, then the check."))
        cells += exercise_cells(key)
    cells.append(new_markdown_cell(SUMMARY))
    return _finish(cells)


def solutions_notebook() -> nbformat.NotebookNode:
    """Worked solutions: each answer in full as a cell, then its check, which says "Correct!"."""
    cells = [
        new_code_cell(SETUP_CELL),
        new_markdown_cell("# 11 · Exercises: worked solutions\n\nOne way to solve each task of "
                          "`../11_exercises.ipynb`, and its check. Each cell is complete: the fix is marked "
                          "`# FIX`. The same code lives in `dpteach.exercises.solutions`, which the tests check."),
        new_code_cell(IMPORTS),
    ]
    for key, (text, *_) in TASKS.items():
        heading = text.split("\n\n", 1)[0]
        cells += [new_markdown_cell(f"{heading}\n\n{SOLUTION_NOTES[key]}"),
                  _cell(solution_source(key), key, "solution"), _cell(check_source(key), key, "check")]
    return _finish(cells)


def _finish(cells) -> nbformat.NotebookNode:
    nb = new_notebook(cells=cells)
    nb.metadata = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                   "language_info": {"name": "python"}}
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
