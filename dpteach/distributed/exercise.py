"""Chapter 09's exercise checks: exercise 1's ``my_tasks.py`` and its check, and the checks of the
predictions of exercises 3 (buckets) and 5 (``no_sync``).

Exercise 1's file holds ``tasks.gradients`` as the chapter runs it, with its imports, so the ranks can
import it by name (``ranks.run("my_tasks:gradients", ...)``); only its loss line is marked for editing.
Exercises 3 and 5 are predictions: their checks run the task on the learner's ranks and set each
prediction beside what the ranks did. A wrong prediction is told what to change, first the idea,
then how to count, and only after repeated misses the numbers.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Sequence

from . import compare, order, tasks
from .launch import Ranks
from .model import single_device_gradients

__all__ = ["write_my_tasks", "check_uneven_shards", "check_bucket_sizes", "check_accumulate"]

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


# How many times each prediction check has said "not yet" in this kernel: its hints go one step further
# each time, and give the numbers only from the third miss on.
_misses: dict[str, int] = {}


def _miss(check: str) -> int:
    _misses[check] = _misses.get(check, 0) + 1
    return _misses[check]


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


BUCKET_CAPS = (25, 0.5, 0.001)  # MiB, as exercise 3 words them


def check_bucket_sizes(ranks, predicted: dict) -> str:
    """Exercise 3: ``predicted`` maps each cap of ``BUCKET_CAPS`` (MiB) to a pair, (buckets in step 2,
    backward nodes still to run when bucket 0 is launched). Runs ``bucket_order`` at each cap on
    ``ranks`` and says, per cap, whether both numbers match; the last line starts ``Correct`` or
    ``Not yet``, and says what to change."""
    if not isinstance(predicted, dict) or any(cap not in predicted for cap in BUCKET_CAPS):
        return (
            "Not yet: give one prediction per cap, as a dict "
            "{25: (buckets, nodes), 0.5: (buckets, nodes), 0.001: (buckets, nodes)}, nodes being the "
            "backward nodes still to run when bucket 0 is launched."
        )
    bad = [cap for cap in BUCKET_CAPS if not (len(predicted[cap]) == 2 and all(map(_whole, predicted[cap])))]
    if bad:
        return f"Not yet: the prediction for {bad[0]} MiB must be two whole numbers, (buckets, nodes)."
    lines, wrong = [], []
    for cap in BUCKET_CAPS:
        step = ranks.run("bucket_order", bucket_cap_mb=cap, echo=False)[0]["steps"][1]  # step 2: rebuilt
        real = (len(order.buckets(step)), len(order.overlap(step)[0]["nodes"]))
        said = tuple(predicted[cap])
        if said == real:
            lines.append(
                f"{cap:g} MiB: {real[0]} bucket(s), bucket 0 launched with {real[1]} nodes to run: right"
            )
        else:
            parts = [what for what, a, b in zip(("buckets", "nodes"), said, real) if a != b]
            lines.append(f"{cap:g} MiB: your {' and '.join(parts)} differ from what DDP did")
            wrong.append((cap, said, real))
    if not wrong:
        _misses.pop("buckets", None)
        return "\n".join(lines + ["Correct: every cap's buckets and overlap, as DDP cut and launched them."])
    miss = _miss("buckets")
    cap, said, real = wrong[0]
    if miss == 1:
        advice = (
            "change the pair for the caps above: a bucket is launched once its last gradient is ready, "
            "and closes once it holds the cap or more (Hint: the idea)."
        )
    elif miss == 2:
        advice = (
            f"at {cap:g} MiB, walk the gradients in the order they become ready (the bucket-rebuild "
            f"cell prints it), adding their bytes until a bucket holds {cap:g} x 1,048,576 bytes or "
            "more; then count the backward nodes that run after bucket 0's last gradient "
            "(order.event_lines(report[0]['steps'][1]) lists them)."
        )
    else:
        advice = f"at {cap:g} MiB DDP made {real[0]} bucket(s), bucket 0 launched with {real[1]} nodes to run; see Answer 3."
    return "\n".join(lines + [f"Not yet: {advice}"])


def check_accumulate(ranks, predicted: dict, one_device: bool) -> str:
    """Exercise 5: ``predicted`` maps micro-batches (2 and 4) to a pair, (all-reduces per rank with
    ``no_sync``, without it); ``one_device``: whether both give one device's gradient. Runs the
    ``accumulate`` task four ways on ``ranks``; the last line starts ``Correct`` or ``Not yet``."""
    counts = (2, 4)
    if not isinstance(predicted, dict) or any(k not in predicted for k in counts):
        return "Not yet: give a pair per number of micro-batches, as a dict {2: (with_no_sync, without), 4: (...)}."
    if any(not (len(predicted[k]) == 2 and all(map(_whole, predicted[k]))) for k in counts):
        return "Not yet: each pair must be two whole numbers: all-reduces per rank with no_sync, and without."
    if not isinstance(one_device, bool):
        return "Not yet: one_device must be True or False: do both ways give one device's gradient?"
    global_batch = 4 * ranks.world_size  # 4 rows per rank: they split into 2 or 4 equal micro-batches
    reference = single_device_gradients(global_batch)
    real, exact = {}, True
    for k in counts:
        pair = []
        for quiet in (True, False):
            results = ranks.run(
                "accumulate", global_batch=global_batch, micro_batches=k, no_sync=quiet, echo=False
            )
            calls = {r["allreduces"] for r in results}
            pair.append(calls.pop() if len(calls) == 1 else -1)
            exact &= max(compare.largest_difference(r["grads"], reference)[1] for r in results) < 1e-6
        real[k] = tuple(pair)
    lines = [
        f"{k} micro-batches: your {tuple(predicted[k])} (no_sync, without): "
        + ("right" if tuple(predicted[k]) == real[k] else "not what the ranks did")
        for k in counts
    ]
    lines.append(
        f"one device's gradient both ways: you said {one_device}: {'right' if one_device == exact else 'no'}"
    )
    if all(tuple(predicted[k]) == real[k] for k in counts) and one_device == exact:
        _misses.pop("accumulate", None)
        return "\n".join(
            lines + ["Correct: no_sync saves an all-reduce per extra micro-batch, and the mean is the same."]
        )
    miss = _miss("accumulate")
    if miss == 1:
        advice = "ask which backwards run with DDP's sync on, and what .grad holds once all have run (Hint: the idea)."
    elif miss == 2:
        advice = (
            "the course model fits in one bucket, so each synced backward is one all-reduce; inside no_sync "
            "a backward only adds into .grad. Averaging is linear: the mean of sums is the sum of means."
        )
    else:
        advice = f"the ranks did {real[2]} with 2 micro-batches, {real[4]} with 4, one device's gradient: {exact}; see Answer 5."
    return "\n".join(lines + [f"Not yet: {advice}"])
