"""``graph_diff(before, after)``: what changed between two graphs of the same model, drawn as one picture.

Node ids are names (``walk.py``), so two graphs of one model and input share every node they have
in common and differ by what the strategy changed: from ``"clone"`` to ``"rewire"`` (PR #20910),
the edges into each ``ReduceAddBackward`` node and on to the original, drawn green; every dead end
gone, its border purple; every original parameter now reached.
"""

from __future__ import annotations

from dataclasses import replace

from .autograd import AutogradGraph
from .display import Drawable
from .names import Param
from .nodes import Edge, Node


def _only_in(these, those) -> tuple:
    """What ``these`` hold and ``those`` do not, in ``these``' order."""
    those = set(those)
    return tuple(x for x in these if x not in those)


class GraphDiff(Drawable):
    """The edges ``after`` adds to ``before`` and removes from it, and what that does to the gradient.

    ``added`` / ``removed``: edges of the drawing in one graph only. A replica parameter is a node of
    its own there, so from ``"clone"`` to ``"rewire"`` nothing is removed, though in autograd's own
    ``next_functions`` each edge that ended at a replica's ``AccumulateGrad`` now ends at
    ``ReduceAddBackward``. ``fixed``: replica parameters that were dead ends and are not any more;
    ``new_dead_ends``: the reverse. ``newly_reached`` / ``newly_unreached``: original parameters whose
    fate changed.
    """

    def __init__(self, before: AutogradGraph, after: AutogradGraph, title: str | None = None) -> None:
        self.before, self.after = before, after
        old, new = ([(e.src, e.dst) for e in g.edges] for g in (before, after))
        self.added: tuple[Edge, ...] = tuple(Edge(*e, "added") for e in _only_in(new, old))
        self.removed: tuple[Edge, ...] = tuple(Edge(*e, "removed") for e in _only_in(old, new))
        self.fixed: tuple[Param, ...] = _only_in(before.dead_ends, after.dead_ends)
        self.new_dead_ends: tuple[Param, ...] = _only_in(after.dead_ends, before.dead_ends)
        self.newly_reached: tuple[Param, ...] = _only_in(before.unreached, after.unreached)
        self.newly_unreached: tuple[Param, ...] = _only_in(after.unreached, before.unreached)
        summary = (
            f"{len(self.added)} edges added, {len(self.removed)} removed; "
            f"{len(self.fixed)} dead ends removed, {len(self.newly_reached)} original parameters now reached"
        )
        if title is None and before.name and after.name:
            title = f"from {before.name} to {after.name}"
        self.title = summary if title is None else f"{title}\n{summary}"

    def _drawn_parts(self) -> tuple[list[Node], list[Edge]]:
        fixed, reached = set(self.fixed), set(self.newly_reached)
        nodes = []
        for n in self.after.nodes.values():
            if n.param in fixed:
                n = replace(n, status="fixed")
            elif n.param in reached:
                n = replace(n, status="newly reached")
            elif n.id not in self.before.nodes:
                n = replace(n, status="added")
            nodes.append(n)
        nodes += [
            replace(n, status="removed")
            for nid, n in self.before.nodes.items()
            if nid not in self.after.nodes
        ]
        old = {(e.src, e.dst) for e in self.before.edges}
        edges = [e if (e.src, e.dst) in old else Edge(e.src, e.dst, "added") for e in self.after.edges]
        _, after_drawn = self.after._drawn_parts()
        missing = [e for e in after_drawn if e.status == "missing"]
        return nodes, [*edges, *self.removed, *missing]

    def _footer(self) -> list[str]:
        lines = [f"added ({len(self.added)}):"] + [f"  + {e}" for e in self.added]
        lines += [f"removed ({len(self.removed)}):"] + [f"  - {e}" for e in self.removed]
        if self.fixed:
            lines += ["dead ends removed: " + ", ".join(map(str, self.fixed))]
        if self.new_dead_ends:
            lines += ["new dead ends: " + ", ".join(map(str, self.new_dead_ends))]
        if self.newly_reached:
            lines += ["original parameters now reached: " + ", ".join(map(str, self.newly_reached))]
        return lines

    def __repr__(self) -> str:
        return f"<GraphDiff: {self.title.splitlines()[-1]}>"


def graph_diff(before: AutogradGraph, after: AutogradGraph, *, title: str | None = None) -> GraphDiff:
    """The difference between two graphs (say, one model under ``"clone"`` and under ``"rewire"``)."""
    for name, g in (("before", before), ("after", after)):
        if not isinstance(g, AutogradGraph):
            raise TypeError(
                f"graph_diff expects two AutogradGraphs (from autograd_graph), but {name} is a "
                f"{type(g).__name__}"
            )
    return GraphDiff(before, after, title)
