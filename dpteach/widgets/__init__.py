"""The interactive lab: three widgets, each a thin view over a plain-Python model.

    from dpteach import widgets
    widgets.explorer(strategy="clone")    # train under a strategy beside one device: loss, gradients, graph
    widgets.gradient_stepper("rewire")    # walk one backward pass node by node over its graph
    widgets.cost_explorer()               # model size and slots against bytes copied and time

The models need no ipywidgets, so tests and static renders use them directly:
``TrainingLab`` (``training.py``), ``GradientFlow`` (``flow.py``), ``CostLab`` (``cost.py``).
The views (``view_explorer.py``, ``view_stepper.py``, ``view_cost.py``) import ipywidgets when one is made,
and use only what ipywidgets 7.7 (Colab) and 8 (JupyterLab 4) share. Without ipywidgets, making a
widget raises ImportError with one sentence on what to install. Pictures are SVG (``charts.py``,
Graphviz for graphs, ``highlight.py`` for the stepper's marks); tables are HTML (``tables.py``).
"""

from __future__ import annotations

from .cost import BUDGET_S, CostLab
from .flow import GradientFlow
from .training import STRATEGIES, TrainingLab

__all__ = [
    "explorer",
    "gradient_stepper",
    "cost_explorer",
    "TrainingLab",
    "GradientFlow",
    "CostLab",
    "STRATEGIES",
    "DataParallelExplorer",
    "GradientStepper",
    "CostExplorer",
]

_VIEWS = {
    "DataParallelExplorer": "view_explorer",
    "GradientStepper": "view_stepper",
    "CostExplorer": "view_cost",
}


def explorer(strategy: str = "clone", slots: int = 2, lr: float = 0.2, steps: int = 60, seed: int = 0):
    """A DataParallel explorer: strategy, slots, learning rate and steps; step / run / reset; loss curve
    against one device, the original's gradient norms, and the autograd graph of the current step."""
    from .view_explorer import DataParallelExplorer  # raises the one-sentence ImportError without ipywidgets

    return DataParallelExplorer(TrainingLab(strategy, slots, lr, steps, seed))


def gradient_stepper(strategy: str = "clone", slots: int = 2, seed: int = 0):
    """A gradient-flow stepper: one backward pass of the course model, node by node, over its graph."""
    from .view_stepper import GradientStepper

    return GradientStepper(GradientFlow(strategy, slots, seed))


def cost_explorer(
    width: int = 64, slots: int = 2, budget_s: float = BUDGET_S, modelled: bool = True, timed: bool = True
):
    """A cost explorer: model width and slots against the bytes one step copies and its time, per strategy.

    ``budget_s`` caps the time the lab spends on each strategy's five timed steps (1 s, ``cost.BUDGET_S``;
    raise it when the status line says fewer than five fitted); ``modelled=False`` leaves out
    the cost model's DataParallel-vs-DDP table (chapter 08's model), and ``timed=False`` this machine's
    step times (``CostLab(timed=False)``), for a page about counts only (chapter 06)."""
    from .view_cost import CostExplorer

    return CostExplorer(CostLab(width, slots, budget_s=budget_s, timed=timed), modelled=modelled)


def __getattr__(name: str):
    if name in _VIEWS:  # the view classes, imported (with ipywidgets) on first use
        from importlib import import_module

        return getattr(import_module(f".{_VIEWS[name]}", __name__), name)
    raise AttributeError(f"module 'dpteach.widgets' has no attribute {name!r}")
