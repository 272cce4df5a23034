"""dpteach: data parallelism in PyTorch, taught through PR #20910 ("Fix C++ data parallel").

The public API mirrors ``torch.nn.parallel`` and works on any list of devices, duplicates
allowed (``["cpu", "cpu"]`` on a laptop). ``import dpteach`` needs torch alone; drawing,
widgets and plots import their libraries when used.
"""

from __future__ import annotations

from . import comm, functions
from ._course import VERSION as __version__  # noqa: F401  (the one place the version is written)
from ._devices import default_devices
from ._lazy import submodules
from .data_parallel import DataParallel, data_parallel
from .parallel_apply import parallel_apply
from .replicate import STRATEGIES, replicate
from .scatter_gather import gather, scatter, scatter_kwargs

__all__ = [
    "replicate",
    "scatter",
    "scatter_kwargs",
    "gather",
    "parallel_apply",
    "DataParallel",
    "data_parallel",
    "default_devices",
    "comm",
    "functions",
    "STRATEGIES",
    "autograd_graph",
    "graph_diff",
]


# Submodules that import optional libraries (graphviz, ipywidgets, matplotlib) load on first use,
# so `import dpteach` needs torch alone and `dpteach.widgets` still works after it.
_LAZY = ("graph", "widgets", "exercises", "course", "measure", "cpp", "distributed")


_wing = submodules(__name__, _LAZY)


def __getattr__(name: str):
    if name in ("autograd_graph", "graph_diff"):
        from . import graph

        return getattr(graph, name)
    return _wing(name)
