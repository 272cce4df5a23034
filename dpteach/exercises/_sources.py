"""The exercises as notebook cells: each stub, each worked answer and each check, as source text.

A stub cell holds the task's imports, the stub, and a last line that tries it: until the learner
writes the answer, that line raises NotImplementedError (the cell is tagged ``raises-exception``).
The check cell below it answers kindly either way.
"""

from __future__ import annotations

import inspect

from . import solutions, stubs
from ._records import record


def _code(module, key: str) -> str:
    return "\n\n\n".join(inspect.getsource(getattr(module, name)).rstrip() for name in record(key).names)


def try_line(key: str) -> str:
    """The stub cell's last line: one DataParallel step with the learner's answer, errors shown in full."""
    return f"exercises.try_it({key!r}, {', '.join(record(key).names)})"


def stub_source(key: str) -> str:
    """The stub cell of exercise ``key``: imports, the stub (it raises NotImplementedError), a line that tries it."""
    return f"{record(key).imports}\n\n\n{_code(stubs, key)}\n\n\n{try_line(key)}"


def solution_source(key: str) -> str:
    """A worked answer to exercise ``key`` as a cell: imports, the code, and the same line that tries it."""
    return f"{record(key).imports}\n\n\n{_code(solutions, key)}\n\n\n{try_line(key)}"


def check_source(key: str) -> str:
    """The check cell of exercise ``key`` (it never raises; it says what is right, what is wrong, and a hint)."""
    return f"exercises.{record(key).check}({', '.join(record(key).names)})"
