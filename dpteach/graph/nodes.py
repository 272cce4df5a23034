"""The graph's parts: ``Node`` (a backward function or a tensor) and ``Edge`` (the way the gradient goes).

``walk.py`` makes them from a live output, ids from names, never ``id()``; the drawings read them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from .names import Param


@dataclass(frozen=True)
class Node:
    """One node of the graph: a backward function (``op``, ``join``) or a tensor (everything else)."""

    id: str
    # "output", "op", "join" (a ReduceAdd/Broadcast node a replica parameter comes out of), "original",
    # "replica", "input" (a named leaf), "tensor" (a named non-leaf), "leaf" (any other), "more" (drawings)
    kind: str
    label: str  # what a learner reads: "AddmmBackward0", "original 0.weight", "replica 1 · 0.weight · cpu"
    op: str | None = None  # the grad_fn's class name, for op and join nodes
    param: Param | None = None
    shape: tuple[int, ...] | None = None
    slot: int | None = None  # the replica slot the node lives in, when exactly one
    device: str | None = None
    leaf: bool = False  # a leaf tensor: its AccumulateGrad node is what writes .grad
    dead_end: bool = False  # a replica parameter from which no path leads to an original one
    reached: bool = True  # False for an original parameter no path from the output reaches
    module: str | None = None  # the module the node belongs to, for collapse= (None: not collapsed)
    members: int = 1  # how many nodes a collapsed node stands for
    status: str = ""  # in a diff: "", "added", "removed", "fixed" (a dead end no longer) or "newly reached"


class Edge(NamedTuple):
    """An edge in the gradient's direction: from a node to one of its ``next_functions``."""

    src: str
    dst: str
    status: str = ""  # "", or in drawings "added" / "removed" (a diff) and "missing" (clone's lost edge)

    def __str__(self) -> str:
        return f"{self.src} → {self.dst}"


def shape_text(shape: tuple[int, ...] | None) -> str:
    """``2×3``, ``scalar`` for a 0-d tensor, empty without a shape."""
    if shape is None:
        return ""
    return "scalar" if len(shape) == 0 else "×".join(map(str, shape))
