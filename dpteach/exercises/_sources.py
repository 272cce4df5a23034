"""The exercises as notebook cells: each stub, each worked answer and each check, as source text.

A stub cell holds the task's imports, the stub, and a last line that tries it: until the learner
writes the answer, that line raises NotImplementedError (the cell is tagged ``raises-exception``).
The check cell below it answers kindly either way.
"""

from __future__ import annotations

import inspect

from . import solutions, stubs

IMPORTS = {
    "clone_bug": "from copy import deepcopy\n\nimport torch\nfrom torch import nn\n\nfrom dpteach import exercises",
    "rewire": "import torch\nfrom torch.autograd import Function\n\nfrom dpteach import exercises",
    "broadcast_pair": "import torch\nfrom torch.autograd import Function\n\nfrom dpteach import comm, exercises",
    "scatter_gather": "import dataclasses\n\nimport torch\n\nfrom dpteach import exercises\n"
    "from dpteach.functions import Gather, Scatter",
    "batchnorm": "import dpteach\nfrom dpteach import exercises",
}

NAMES = {  # the objects a learner writes, in the order the check takes them
    "clone_bug": ["replicate_by_clone"],
    "rewire": ["ReduceAdd"],
    "broadcast_pair": ["Broadcast", "ReduceAddCoalesced"],
    "scatter_gather": ["scatter", "gather"],
    "batchnorm": ["keep_bn_statistics"],
}

CHECKS = {
    "clone_bug": "check_clone_bug",
    "rewire": "check_rewire",
    "broadcast_pair": "check_broadcast_pair",
    "scatter_gather": "check_scatter_gather",
    "batchnorm": "check_batchnorm",
}


def _key(key: str) -> str:
    if key not in NAMES:
        raise KeyError(f"no exercise {key!r}; the exercises are {', '.join(repr(k) for k in NAMES)}")
    return key


def _code(module, key: str) -> str:
    return "\n\n\n".join(inspect.getsource(getattr(module, name)).rstrip() for name in NAMES[_key(key)])


def try_line(key: str) -> str:
    """The stub cell's last line: one DataParallel step with the learner's answer, errors shown in full."""
    return f"exercises.try_it({key!r}, {', '.join(NAMES[_key(key)])})"


def stub_source(key: str) -> str:
    """The stub cell of exercise ``key``: imports, the stub (it raises NotImplementedError), a line that tries it."""
    return f"{IMPORTS[_key(key)]}\n\n\n{_code(stubs, key)}\n\n\n{try_line(key)}"


def solution_source(key: str) -> str:
    """A worked answer to exercise ``key`` as a cell: imports, the code, and the same line that tries it."""
    return f"{IMPORTS[_key(key)]}\n\n\n{_code(solutions, key)}\n\n\n{try_line(key)}"


def check_source(key: str) -> str:
    """The check cell of exercise ``key`` (it never raises; it says what is right, what is wrong, and a hint)."""
    return f"exercises.{CHECKS[_key(key)]}({', '.join(NAMES[key])})"
