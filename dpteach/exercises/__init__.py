"""Exercises with automatic checks: write the fix yourself, and be told, kindly and precisely, whether it works.

One task per core idea of the course (chapter 11 has them all): a stub that fails loudly, naming
its task, and a check that runs the learner's code against the real thing and answers with a
:class:`Result`: "Correct!", or what is wrong, where, and a hint that goes one step further each
time the same problem comes back (a worked answer offered from the third failed check). A check
never raises on a learner's bug, runs in torch's default settings and gives the learner's back, and
stops with a sentence after ``time_limit()`` seconds (``set_time_limit(seconds)`` changes it).

``TASKS`` holds each task's record (``TASKS["rewire"].chapter``); ``check(key, *answer)`` runs any
check; each check is also exported by its own name (``check_rewire``). ``stub_source(key)`` and
``check_source(key)`` give the two cells of a task as text, ``solution_source(key)`` the worked answer.
"""

from __future__ import annotations

from ._feedback import Result, Task, forget_failures
from ._records import EXERCISES, check_of, check_source, module_of, solution_source, stub_source, try_it
from ._time_limit import set_time_limit, time_limit

TASKS: dict[str, Task] = EXERCISES


def check(key: str, *answer, devices=None) -> Result:
    """Run exercise ``key``'s check on the learner's ``answer`` (the objects its stub defines, in order)."""
    return check_of(key)(*answer, devices=devices)


_EXPORTED = {name: getattr(module_of(t.key), name) for t in TASKS.values() for name in (t.check, *t.helpers)}
globals().update(_EXPORTED)  # check_clone_bug, ..., rewire_with: each task's module names its own

__all__ = ["TASKS", "Result", "check", "stub_source", "solution_source", "check_source", "try_it"]
__all__ += ["forget_failures", "set_time_limit", "time_limit", *_EXPORTED]
