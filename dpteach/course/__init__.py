"""The course kit: what the chapters use beside the library, never part of it.

* ``story``: the running example (model, data, training loop, one step under a strategy);
* ``demos``: chapter 04's C++-style modules and failed attempts, chapter 05's call counters;
* ``env``: the environment check of chapter 00 (``dpteach.course.env.check()``);
* ``plots``: small matplotlib helpers (chapter 05's lines that coincide);
* ``checks``: the checks of the small exercises, with hints that grow on each failed try.

Import the module you need (``from dpteach.course import story``); this file imports a module only
when it is asked for by attribute (``dpteach.course.story``).
"""

from .._lazy import submodules

_MODULES = ("story", "demos", "env", "plots", "checks")


__getattr__ = submodules(__name__, _MODULES)
