"""Chapter 09's exercise 1, set up: a ``my_tasks.py`` whose one marked line the learner edits, and a check.

The file holds ``tasks.gradients`` as the chapter runs it, with its imports, so the ranks can import
it by name (``ranks.run("my_tasks:gradients", ...)``); only its loss line is marked for editing.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Sequence

from . import compare, tasks
from .launch import Ranks
from .model import single_device_gradients

__all__ = ["write_my_tasks", "check_uneven_shards"]

LOSS = "loss = loss_fn(ddp(x), y)"
MARK = "  # EDIT this line: a loss whose gradient is one device's, whatever the shards"
IMPORTS = """from typing import Sequence

import torch.distributed as dist

from dpteach.distributed.model import loss_fn, make_model
from dpteach.distributed.train import local_shard, wrap
"""


def write_my_tasks(path: str | Path = "my_tasks.py", overwrite: bool = False) -> Path:
    """Write ``tasks.gradients`` and its imports to ``path``, its loss line marked ``# EDIT``."""
    path = Path(path)
    if path.exists() and not overwrite:
        print(f"{path} is there already: edit it, or call write_my_tasks(overwrite=True) to start again")
        return path
    lines = inspect.getsource(tasks.gradients).splitlines()
    (at,) = [i for i, line in enumerate(lines) if LOSS in line]
    lines[at] = lines[at][: lines[at].index(LOSS)] + LOSS + MARK
    path.write_text(IMPORTS + "\n\n" + "\n".join(lines) + "\n")
    print(f"wrote {path.resolve()}: edit the line marked # EDIT, save, then run check_uneven_shards(ranks)")
    return path


# The second split: another world size and another number of rows per rank (3 here, 4 in the first),
# so that a divisor typed in as a number (4, or global_batch / 2) fits the first split only.
SECOND_SHARDS = {3: [6, 2, 1], 2: [5, 1]}  # by world size: 3 ranks, or 2 when the learner's ranks are 3


def check_uneven_shards(ranks, shards: Sequence[int] | None = None, task: str = "my_tasks:gradients") -> str:
    """Run ``task`` on uneven shards (6 + 2 rows, 4 on any further rank) and say whether its gradient is
    one device's over all the rows, and if not, what to change.

    A loss that passes is run once more, on fresh gloo ranks with another split (6 + 2 + 1 rows on 3
    ranks; 5 + 1 on 2 if ``ranks`` has 3): a divisor fixed to the first split fails there. The last
    line starts with the kind of problem found: ``Correct``, ``Extra 1/N``, ``Constant
    factor``, ``Rows weighed unevenly`` or ``Fixed divisor``."""
    shards = list(shards or [6, 2] + [4] * (ranks.world_size - 2))
    printed, problem, _ = _run_split(ranks, task, shards)
    if problem is not None:
        return printed + "\n" + problem
    world = 3 if ranks.world_size != 3 else 2
    second = SECOND_SHARDS[world]
    # said in the returned text, between the two splits' tables, so that it reads in the order it ran
    checking = (
        f"first split correct; checking a second: {' + '.join(map(str, second))} rows on {world} gloo ranks"
    )
    with Ranks(world, "gloo") as other:
        printed_2, problem_2, factor = _run_split(other, task, second)
    if problem_2 is None:
        verdict = "Correct: one device's gradient on every rank, with uneven shards."
    else:
        verdict = (
            f"Fixed divisor: one device's gradient with {sum(shards)} rows on {ranks.world_size} ranks, "
            f"but not with {sum(second)} rows on {world}"
            + (f" (every gradient {factor:.3g} times one device's)" if factor is not None else "")
            + ". Your loss divides by a number that fits the first split only: build it from "
            "global_batch and dist.get_world_size()."
        )
    return "\n".join([printed, checking, printed_2, verdict])


def _run_split(ranks, task: str, shards: list[int]) -> tuple[str, str | None, float | None]:
    """What ``against_one_device`` prints for ``task`` on ``shards``, the problem found (None: correct),
    and the constant factor between its gradient and one device's, if there is one."""
    results = ranks.run(task, global_batch=sum(shards), shards=shards, echo=False)
    reference = single_device_gradients(sum(shards))
    printed = compare.against_one_device(results, reference, rows=sum(shards))
    worst = max(compare.largest_difference(r["grads"], reference)[1] for r in results)
    factor = compare.constant_factor(results[0]["grads"], reference)
    if worst < 1e-6:
        return printed, None, factor
    if factor is not None and abs(factor * ranks.world_size - 1) < 1e-3:
        return (
            printed,
            (
                f"Extra 1/N: every gradient is {factor:.3g} times one device's, as DDP divides your loss's "
                "gradient by the number of ranks once more. Scale your loss by dist.get_world_size()."
            ),
            factor,
        )
    if factor is not None:  # any other constant: say by how much the loss is off, the way to fix it
        fix = f"divide it by {factor:.3g}" if factor > 1 else f"multiply it by {1 / factor:.3g}"
        return (
            printed,
            (
                f"Constant factor: every gradient is {factor:.3g} times one device's. Every row weighs "
                f"the same, but your loss is {factor:.3g} times too {'large' if factor > 1 else 'small'}. "
                f"Change the marked line to {fix}, written from global_batch and dist.get_world_size() "
                "rather than typed in, so that it holds for every split of the batch."
            ),
            factor,
        )
    return (
        printed,
        (
            "Rows weighed unevenly: each rank's mean weighs its rows by 1/(its rows), so the gradient is not "
            "one device's. Change the marked line so that every row weighs the same on every rank (Hint 1)."
        ),
        factor,
    )
