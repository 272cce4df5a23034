"""The exercises in order. Each one's record (``TASK``) lives in its own ``taskN_*.py``; this file only lists them.

A new exercise is a new ``taskN_*.py`` with a ``TASK`` record, a check and ``try_answer``, its stub
in ``stubs.py`` and its answer in ``solutions.py``, and one line in ``MODULES`` below; then
``python -m dpteach.exercises._build`` writes chapter 11 and its solutions.
"""

from __future__ import annotations

from types import ModuleType
from typing import Callable

from . import (
    task1_clone_bug,
    task2_rewire,
    task3_broadcast,
    task4_scatter_gather,
    task5_batchnorm,
    task6_copy_once,
)
from ._feedback import Task

MODULES: tuple[ModuleType, ...] = (
    task1_clone_bug,
    task2_rewire,
    task3_broadcast,
    task4_scatter_gather,
    task5_batchnorm,
    task6_copy_once,
)

EXERCISES: dict[str, Task] = {m.TASK.key: m.TASK for m in MODULES}
_MODULE = {m.TASK.key: m for m in MODULES}


def by_task(module: ModuleType) -> dict[str, tuple]:
    """Each task's objects as ``module`` (``stubs`` or ``solutions``) writes them, named by the record."""
    return {key: tuple(getattr(module, name) for name in task.names) for key, task in EXERCISES.items()}


def record(key: str) -> Task:
    """Exercise ``key``'s record, or a KeyError that lists the keys there are."""
    if key not in EXERCISES:
        raise KeyError(f"no exercise {key!r}; the exercises are {', '.join(repr(k) for k in EXERCISES)}")
    return EXERCISES[key]


def module_of(key: str) -> ModuleType:
    return _MODULE[record(key).key]


def check_of(key: str) -> Callable:
    """The check function of exercise ``key`` (``check_rewire`` for ``"rewire"``)."""
    return getattr(module_of(key), record(key).check)
