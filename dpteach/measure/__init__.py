"""Measurement: every second dpteach prints comes from one timer, ``timer``.

* ``timer``: medians, timed in turns, CUDA synchronised, one intra-op thread per CPU slot;
* ``profile``: where the time of one DataParallel step goes, phase by phase;
* ``costs``: the bytes a step moves and the copies chapter 06 times;
* ``scaling``: one step on 1 ... N slots against the plain step and ``torch.nn.DataParallel``;
* ``bench``: ``python -m dpteach.measure.bench``, the benchmark (JSON and a plot);
* ``costmodel``: the modelled step time of DataParallel and DDP on n GPUs of a named profile;
* ``threads``: which thread runs each backward node of a DataParallel step, by role;
* ``published``: measured step times, published ones and ours, beside the cost model's prediction.

Import the module you need (``from dpteach.measure import timer``); this file imports a module only
when it is asked for by attribute (``dpteach.measure.timer``).
"""

from .._lazy import submodules

_MODULES = (
    "timer",
    "profile",
    "costs",
    "scaling",
    "bench",
    "costmodel",
    "threads",
    "published",
)


__getattr__ = submodules(__name__, _MODULES)
