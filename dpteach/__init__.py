"""dpteach: data parallelism in PyTorch, taught through PR #20910 ("Fix C++ data parallel").

The public API mirrors ``torch.nn.parallel`` and works on any list of devices, duplicates
allowed (``["cpu", "cpu"]`` on a laptop). ``import dpteach`` needs torch alone; drawing,
widgets and plots import their libraries when used.
"""

from __future__ import annotations

from . import comm, functions
from ._devices import default_devices
from .data_parallel import DataParallel, data_parallel
from .parallel_apply import parallel_apply
from .replicate import STRATEGIES, replicate
from .scatter_gather import gather, scatter, scatter_kwargs

__version__ = "0.1.0"

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


def __getattr__(name: str):
    # the graph model lives in dpteach.graph; imported on first use so `import dpteach` stays light
    if name in ("autograd_graph", "graph_diff"):
        from . import graph

        return getattr(graph, name)
    raise AttributeError(f"module 'dpteach' has no attribute {name!r}")
