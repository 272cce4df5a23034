"""dpteach: data parallelism in PyTorch, taught through PR #20910 ("Fix C++ data parallel").

The public API mirrors ``torch.nn.parallel`` and works on any list of devices, duplicates
allowed (``["cpu", "cpu"]`` on a laptop). ``import dpteach`` needs torch alone; drawing,
widgets and plots import their libraries when used.

To draw a step's autograd graph, keep the replicas the step makes::

    dp = dpteach.DataParallel(model, ["cpu", "cpu"], strategy="rewire")
    with dpteach.keep_replicas(dp) as replicas:
        loss = dp(x).pow(2).mean()
    dpteach.autograd_graph(loss, module=model, replicas=replicas)
"""

from . import comm, functions
from ._course import VERSION as __version__  # noqa: F401  (the one place the version is written)
from ._devices import default_devices
from ._lazy import submodules
from .data_parallel import DataParallel, data_parallel, keep_replicas
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
    "keep_replicas",
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
del submodules  # a helper of this file, not a name of the library


def __getattr__(name: str):
    if name in ("autograd_graph", "graph_diff"):
        from . import graph

        return getattr(graph, name)
    return _wing(name)


def __dir__() -> list[str]:
    # What tab completion offers: the public names (the lazy ones included, though not yet loaded)
    # and the wings; not the submodules imported along the way nor this file's helpers.
    return sorted({*__all__, *_LAZY, "__version__"})
