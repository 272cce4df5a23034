"""Exercises with automatic checks: write the fix yourself, and be told, kindly and precisely, whether it works.

Six tasks, one per core idea of the course. Each has a stub that fails loudly
(``NotImplementedError("Task 2 (rewire gradient edges): ...")``) and a check that runs the
learner's code against the real thing and answers with a :class:`Result`: "Correct!" when
everything holds, otherwise what is wrong, where, and a hint. A check never raises on a
learner's bug, and stops with a sentence when the learner's code runs longer than
``time_limit()`` seconds (two minutes; ``set_time_limit(seconds)`` changes it, ``None`` lifts it).

{table}

``stub_source(key)`` and ``check_source(key)`` give the two cells of a task as text, for any
chapter; ``solution_source(key)`` the worked answer (``dpteach.exercises.solutions``).
"""

from __future__ import annotations

from ._feedback import Result, Task
from ._records import EXERCISES, check_of
from ._sources import check_source, solution_source, stub_source
from ._time_limit import set_time_limit, time_limit
from ._try import try_it
from .task1_clone_bug import check_clone_bug
from .task2_rewire import check_rewire, rewire_with
from .task3_broadcast import broadcast_with, check_broadcast_pair
from .task4_scatter_gather import check_scatter_gather
from .task5_batchnorm import check_batchnorm
from .task6_copy_once import check_copy_once

TASKS: dict[str, Task] = EXERCISES  # key -> the exercise's record (``exercises.TASKS["rewire"].chapter``)


def check(key: str, *answer, devices=None) -> Result:
    """Run exercise ``key``'s check on the learner's ``answer`` (the objects its stub defines, in order)."""
    return check_of(key)(*answer, devices=devices)


def _table() -> str:
    """The index of the exercises for this docstring, from their records."""
    rows = [
        (
            str(t.number),
            f"``{t.key}``",
            ", ".join(f"``{n}``" for n in t.names),
            t.chapter,
            f"``{t.check}({', '.join(t.names)})``",
        )
        for t in EXERCISES.values()
    ]
    head = ("task", "key", "what the learner writes", "chapter", "check")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    rule = "  ".join("=" * w for w in widths)
    line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([rule, line(head), rule, *map(line, rows), rule])


__doc__ = (__doc__ or "").replace("{table}", _table())

__all__ = [
    "TASKS",
    "Result",
    "check",
    "check_clone_bug",
    "check_rewire",
    "check_broadcast_pair",
    "check_scatter_gather",
    "check_batchnorm",
    "check_copy_once",
    "rewire_with",
    "broadcast_with",
    "stub_source",
    "solution_source",
    "check_source",
    "try_it",
    "set_time_limit",
    "time_limit",
]
