"""Chapter 09's exercise 1, set up: a ``my_tasks.py`` whose one marked line the learner edits, and a check.

The file holds ``tasks.gradients`` as the chapter runs it, with its imports, so the ranks can import
it by name (``ranks.run("my_tasks:gradients", ...)``); only its loss line is marked for editing.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Sequence

from . import compare, tasks
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


def check_uneven_shards(ranks, shards: Sequence[int] | None = None, task: str = "my_tasks:gradients") -> str:
    """Run ``task`` on uneven shards (6 + 2 rows, 4 on any further rank) and say whether its gradient is
    one device's over all the rows, and if not, what to change."""
    shards = list(shards or [6, 2] + [4] * (ranks.world_size - 2))
    results = ranks.run(task, global_batch=sum(shards), shards=shards, echo=False)
    reference = single_device_gradients(sum(shards))
    printed = compare.against_one_device(results, reference, rows=sum(shards))
    worst = max(compare.largest_difference(r["grads"], reference)[1] for r in results)
    factor = compare.constant_factor(results[0]["grads"], reference)
    if worst < 1e-6:
        verdict = "Correct: one device's gradient on every rank, with uneven shards."
    elif factor is not None and abs(factor * ranks.world_size - 1) < 1e-3:
        verdict = (
            f"Every gradient is {factor:.3g} times one device's: DDP divides your loss's gradient by the "
            "number of ranks once more. Scale your loss by dist.get_world_size()."
        )
    elif factor is not None:  # any other constant: say by how much the loss is off, the way to fix it
        fix = f"divide it by {factor:.3g}" if factor > 1 else f"multiply it by {1 / factor:.3g}"
        verdict = (
            f"Every gradient is {factor:.3g} times one device's: every row weighs the same, but your loss is "
            f"{factor:.3g} times too {'large' if factor > 1 else 'small'}. Change the marked line to {fix}."
        )
    else:
        verdict = (
            "Not one device's gradient: each rank's mean weighs its rows by 1/(its rows). "
            "Change the marked line so that every row weighs the same on every rank (Hint 1)."
        )
    return printed + "\n" + verdict
