"""The registry of the exercises: found by file name, looked up by key, shown as cells, tried once.

An exercise is one ``taskN_*.py`` (its record ``TASK``, its check, ``try_answer``) and the objects
its record names, in ``stubs.py`` and ``solutions.py``. Nothing else lists it: this module finds every
``taskN_*.py``, ordered by N; the task modules never import it, so there is no cycle.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from pathlib import Path
from types import ModuleType
from typing import Callable

from . import solutions, stubs
from ._feedback import Task
from ._harness import GRAD_COUNT, NotYet

_FOUND = sorted(
    (int(m.group(1)), name)
    for _, name, _ in pkgutil.iter_modules([str(Path(__file__).parent)])
    if (m := re.fullmatch(r"task(\d+)_\w+", name))
)
MODULES: tuple[ModuleType, ...] = tuple(importlib.import_module(f"{__package__}.{n}") for _, n in _FOUND)
EXERCISES: dict[str, Task] = {m.TASK.key: m.TASK for m in MODULES}
_MODULE = {m.TASK.key: m for m in MODULES}


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


def by_task(module: ModuleType) -> dict[str, tuple]:
    """Each task's objects as ``module`` (``stubs`` or ``solutions``) writes them, named by the record."""
    return {key: tuple(getattr(module, name) for name in task.names) for key, task in EXERCISES.items()}


def _cell(module: ModuleType, key: str) -> str:
    """Exercise ``key``'s imports, its objects as ``module`` writes them, and a last line that runs them once."""
    code = "\n\n\n".join(inspect.getsource(getattr(module, name)).rstrip() for name in record(key).names)
    return f"{record(key).imports}\n\n\n{code}\n\n\nexercises.try_it({key!r}, {', '.join(record(key).names)})"


def stub_source(key: str) -> str:
    """The stub cell of exercise ``key``: imports, the stub (it raises NotImplementedError), a line that tries it."""
    return _cell(stubs, key)


def solution_source(key: str) -> str:
    """A worked answer to exercise ``key`` as a cell: imports, the code, and the same line that tries it."""
    return _cell(solutions, key)


def check_source(key: str) -> str:
    """The check cell of exercise ``key`` (it never raises; it says what is right, what is wrong, and a hint)."""
    return f"exercises.{record(key).check}({', '.join(record(key).names)})"


class NotWrittenYet(NotImplementedError):
    """A stub's own ``NotImplementedError("Task N (...): ...")``, which IPython shows in two lines
    (``_render_traceback_``), not through dpteach's frames."""

    def _render_traceback_(self) -> list[str]:
        return [
            f"\x1b[31mNotImplementedError\x1b[39m: {self}",
            "Not written yet: replace the `raise NotImplementedError(...)` in this cell with your code, "
            "run the cell again, then run the check below it.",
        ]


def try_it(key: str, *answer) -> None:
    """Run exercise ``key`` once with the learner's ``answer`` (its module's ``try_answer``), raising what it raises (a
    stub's own ``NotImplementedError`` as ``NotWrittenYet``); a :class:`NotYet` or a backward's wrong count is printed."""
    try:
        said = module_of(key).try_answer(*answer)
    except NotImplementedError as error:
        if type(error) is not NotImplementedError or not str(error).startswith("Task "):
            raise
        raise NotWrittenYet(str(error)) from None
    except (NotYet, RuntimeError) as problem:  # found before backward, or torch's count of backward's values
        n = GRAD_COUNT.search(f"{problem}")
        if isinstance(problem, RuntimeError) and not n:
            raise
        if n:  # torch counts the values but does not say what each is for
            problem = f"{n[1]}.backward must return {n[2]} values, one per argument of apply, not {n[3]}"
        print(f"Not yet: {problem}\nChange your code, then run this cell again.")
        return
    print(f"Tried it: {said}. Now run the check below.")
