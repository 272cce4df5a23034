"""Exercises with automatic checks: write the fix yourself, and be told, kindly and precisely, whether it works.

Five tasks, one per core idea of the course. Each has a stub that fails loudly
(``NotImplementedError("Task 2 (rewire gradient edges): ...")``) and a check that runs the
learner's code against the real thing and answers with a :class:`Result`: "Correct!" when
everything holds, otherwise what is wrong, where, and a hint. A check never raises on a
learner's bug, and stops with a sentence when the learner's code runs longer than
``time_limit()`` seconds (two minutes; ``set_time_limit(seconds)`` changes it, ``None`` lifts it).

=====  ==================  ===========================================  =======  ================================
task   key                 what the learner writes                      chapter  check
=====  ==================  ===========================================  =======  ================================
1      ``clone_bug``       fix ``replicate_by_clone``                   01       ``check_clone_bug(fn)``
2      ``rewire``          ``ReduceAdd`` (forward, backward)            03       ``check_rewire(ReduceAdd)``
3      ``broadcast_pair``  ``Broadcast`` and ``ReduceAddCoalesced``     07       ``check_broadcast_pair(B, R)``
4      ``scatter_gather``  ``scatter`` and ``gather``                   04       ``check_scatter_gather(s, g)``
5      ``batchnorm``       ``keep_bn_statistics`` (slot 0 buffers)      05       ``check_batchnorm(fn)``
=====  ==================  ===========================================  =======  ================================

``stub_source(key)`` and ``check_source(key)`` give the two cells of a task as text, for any
chapter; ``solution_source(key)`` the worked answer (``dpteach.exercises.solutions``).
"""

from __future__ import annotations

from ._feedback import Result, Task
from ._sources import check_source, solution_source, stub_source
from .task1_clone_bug import TASK as _T1
from .task1_clone_bug import check_clone_bug
from .task2_rewire import TASK as _T2
from .task2_rewire import check_rewire, rewire_with
from .task3_broadcast import TASK as _T3
from .task3_broadcast import broadcast_with, check_broadcast_pair
from .task4_scatter_gather import TASK as _T4
from .task4_scatter_gather import check_scatter_gather
from .task5_batchnorm import TASK as _T5
from .task5_batchnorm import check_batchnorm
from ._time_limit import set_time_limit, time_limit
from ._try import try_it

TASKS: dict[str, Task] = {t.key: t for t in (_T1, _T2, _T3, _T4, _T5)}

_CHECKS = {
    "clone_bug": check_clone_bug,
    "rewire": check_rewire,
    "broadcast_pair": check_broadcast_pair,
    "scatter_gather": check_scatter_gather,
    "batchnorm": check_batchnorm,
}


def check(key: str, *answer, devices=None) -> Result:
    """Run exercise ``key``'s check on the learner's ``answer`` (the objects its stub defines, in order)."""
    if key not in _CHECKS:
        raise KeyError(f"no exercise {key!r}; the exercises are {', '.join(repr(k) for k in _CHECKS)}")
    return _CHECKS[key](*answer, devices=devices)


__all__ = [
    "TASKS",
    "Result",
    "check",
    "check_clone_bug",
    "check_rewire",
    "check_broadcast_pair",
    "check_scatter_gather",
    "check_batchnorm",
    "rewire_with",
    "broadcast_with",
    "stub_source",
    "solution_source",
    "check_source",
    "try_it",
    "set_time_limit",
    "time_limit",
]
