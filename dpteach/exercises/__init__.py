"""Exercises with automatic checks: write the fix yourself, and be told, kindly and precisely, whether it works.

One task per core idea of the course (chapter 11 has them all): a stub that fails loudly, naming its task, and a
check that runs the learner's code against the real thing and answers with a :class:`Result`: "Correct!", or what
is wrong, where, and a hint per kind of problem that goes one step further each time that problem comes back (a
worked answer offered from the third failed check). A check never raises on a learner's bug, runs in torch's default
settings and gives the learner's back, and stops after ``time_limit()`` seconds (``set_time_limit(seconds)``).

``TASKS`` holds each task's record (``TASKS["rewire"].chapter``); ``check(key, *answer)`` runs any
check, ``passes(key, *answer)`` asks it aside; each check is also exported by its own name (``check_rewire``).
``stub_source(key)`` and ``check_source(key)`` give a task's two cells as text, ``solution_source(key)`` its answer.
"""

from __future__ import annotations

from ._feedback import Result, Task, _failures, forget_failures
from ._records import EXERCISES, check_of, check_source, module_of, solution_source, stub_source, try_it
from ._time_limit import set_time_limit, time_limit

TASKS: dict[str, Task] = EXERCISES


def check(key: str, *answer, devices=None) -> Result:
    """Run exercise ``key``'s check on the learner's ``answer`` (the objects its stub defines, in order)."""
    return check_of(key)(*answer, devices=devices)


def passes(key: str, *answer) -> bool:
    """Does ``answer`` pass exercise ``key``'s check? Asked aside: no try is counted, no hint climbs."""
    saved = dict(_failures.get(key, {}))  # the only task whose counts a check of `key` changes
    passed = check(key, *answer).passed  # a check never raises on a learner's bug
    _failures[key] = saved
    return passed


_EXPORTED = {name: getattr(module_of(t.key), name) for t in TASKS.values() for name in (t.check, *t.helpers)}
globals().update(_EXPORTED)  # check_clone_bug, ..., rewire_with: each task's module names its own

__all__ = ["TASKS", "Result", "check", "passes", "stub_source", "solution_source", "check_source", "try_it"]
__all__ += ["forget_failures", "set_time_limit", "time_limit", *_EXPORTED]
