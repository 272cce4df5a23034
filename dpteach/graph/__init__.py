"""Autograd graphs, walked from a live output and drawn: before and after the gradient edges are rewired.

    g = autograd_graph(loss, module=model, replicas=replicas)
    g.dead_ends       # replica parameters whose gradient stops in the replica ("clone": all of them)
    g.unreached       # original parameters no path from the output reaches
    g                 # in Jupyter: the picture (SVG); without Graphviz: a text tree
    graph_diff(before, after)            # the edges the fix added, the dead ends it removed
    compare_strategies(model, x, devices)  # "clone", "rewire", "broadcast" side by side

Graphviz is imported only when a picture is drawn; docs/architecture.md says what each file holds.
"""

from __future__ import annotations

from .autograd import AutogradGraph, autograd_graph
from .compare import StrategyComparison, compare_strategies
from .diff import GraphDiff, graph_diff
from .display import Drawing, GraphvizMissing, set_jupyter_format
from .names import Param
from .nodes import Edge, Node

__all__ = [
    "autograd_graph",
    "graph_diff",
    "compare_strategies",
    "AutogradGraph",
    "GraphDiff",
    "StrategyComparison",
    "Drawing",
    "GraphvizMissing",
    "set_jupyter_format",
    "Node",
    "Edge",
    "Param",
]
