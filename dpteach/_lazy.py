"""One way for a package to import its submodules on first attribute access.

``import dpteach`` needs torch alone: the wings (graphs, widgets, course, measurement, ...) are
imported only when someone asks for ``dpteach.graph`` and the like. Each package that does this
builds its module ``__getattr__`` here.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Callable, Iterable


def submodules(package: str, names: Iterable[str]) -> Callable[[str], ModuleType]:
    """A module ``__getattr__`` for ``package`` that imports ``package.<name>`` for each of ``names``."""
    known = frozenset(names)

    def __getattr__(name: str) -> ModuleType:
        if name in known:
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
