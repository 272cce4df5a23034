"""``autograd_graph(output, module, replicas)``: the graph behind a tensor, and the facts a learner asks of it."""

from __future__ import annotations

from collections import deque
from types import MappingProxyType
from typing import Mapping, Sequence

import torch
from torch import nn

from .display import Drawable
from .names import Param, build_names
from .nodes import Edge, Node
from .walk import Handles, grad_fns, walk_graph


class AutogradGraph(Drawable):
    """The autograd graph behind an output, as plain nodes and edges; shows itself as a picture.

    ``nodes`` (id -> :class:`Node`, in the order of the walk) and ``edges`` (gradient direction)
    are the whole graph; the properties below are what a learner asks of it. ``draw()`` makes a
    picture (``legend.LEGEND`` says what its colours mean); ``dot`` is its DOT source.
    """

    def __init__(
        self,
        nodes: Sequence[Node],
        edges: Sequence[Edge],
        params: Sequence[Param],
        title: str | None,
        canonical: Mapping[str, str] | None = None,
        recorded: frozenset[str] = frozenset(),
        no_history: str | None = None,
    ) -> None:
        self.no_history = no_history  # why there is nothing to draw (no output has a grad_fn), else None
        self._canonical = dict(canonical or {})  # a tied weight's other names -> the name its original has
        # the nodes a first backward with create_graph=True recorded (autograd_graph's create_graph=)
        self.recorded: frozenset[str] = recorded
        self.nodes: Mapping[str, Node] = MappingProxyType({n.id: n for n in nodes})
        self.edges: tuple[Edge, ...] = tuple(edges)
        self._originals = {n.param.name: n.id for n in self.nodes.values() if n.kind == "original"}
        self._order = {p.name: i for i, p in enumerate(params)}  # the module's own order, for sorting
        self._children: dict[str, list[str]] = {n.id: [] for n in nodes}
        for e in self.edges:
            self._children[e.src].append(e.dst)
        self.name = title  # the caller's first line, e.g. "strategy='clone'" (None: none given)
        self.title, self.short_title = (
            summary if title is None else f"{title}\n{summary}"
            for summary in (self._summary(), self._summary(True))
        )

    def _sorted(self, params) -> tuple[Param, ...]:
        def key(p: Param):
            rank = self._order.get(self._canonical.get(p.name, p.name), len(self._order))
            return (-1 if p.slot is None else p.slot, rank, p.name)

        return tuple(sorted(params, key=key))

    @property
    def dead_ends(self) -> tuple[Param, ...]:
        """Replica parameters from which no path leads on to an original parameter: the gradient stops there."""
        return self._sorted(n.param for n in self.nodes.values() if n.kind == "replica" and n.dead_end)

    @property
    def unreached(self) -> tuple[Param, ...]:
        """Original parameters (that require grad) no path from the output reaches: their .grad stays None."""
        return self._sorted(n.param for n in self.nodes.values() if n.kind == "original" and not n.reached)

    @property
    def originals(self) -> tuple[Param, ...]:
        """Every original parameter that requires grad, reached or not."""
        return self._sorted(n.param for n in self.nodes.values() if n.kind == "original")

    @property
    def replica_params(self) -> tuple[Param, ...]:
        """Every replica parameter the output's graph goes through."""
        return self._sorted(n.param for n in self.nodes.values() if n.kind == "replica")

    def children(self, node_id: str) -> list[str]:
        """The ids ``node_id``'s ``next_functions`` lead to."""
        return list(self._children[node_id])

    def path(self, src: str, dst: str) -> tuple[str, ...] | None:
        """A shortest path of node ids from ``src`` to ``dst`` along the gradient, or None."""
        before = {src: None}
        queue = deque([src])
        while queue:
            nid = queue.popleft()
            if nid == dst:
                out = []
                while nid is not None:
                    out.append(nid)
                    nid = before[nid]
                return tuple(reversed(out))
            for c in self._children.get(nid, ()):
                if c not in before:
                    before[c] = nid
                    queue.append(c)
        return None

    def _original_of(self, node: Node) -> str | None:
        """The id of the node of a replica parameter's original (a tied weight's names all lead to it)."""
        return self._originals.get(self._canonical.get(node.param.name, node.param.name))

    def paths_to_original(self) -> dict[Param, tuple[str, ...] | None]:
        """For each replica parameter, the path its gradient takes to *its* original (None: a dead end)."""
        ends = {n.param: (n.id, self._original_of(n)) for n in self.nodes.values() if n.kind == "replica"}
        return {p: self.path(*ends[p]) if ends[p][1] else None for p in self.replica_params}

    def _drawn_parts(self) -> tuple[list[Node], list[Edge]]:
        # draw the edge clone() never made, from each dead end to its original: the picture of #19540
        dead = [
            (n.id, self._original_of(n)) for n in self.nodes.values() if n.kind == "replica" and n.dead_end
        ]
        missing = [Edge(nid, original, "missing") for nid, original in dead if original]
        return list(self.nodes.values()), [*self.edges, *missing]

    def _summary(self, short: bool = False) -> str:
        if self.no_history:
            return self.no_history
        nodes = list(self.nodes.values())
        originals = [n for n in nodes if n.kind == "original"]
        replicas = [n for n in nodes if n.kind == "replica"]
        reached = sum(n.reached for n in originals)
        if replicas:
            dead = sum(n.dead_end for n in replicas)
            if short:
                return f"{reached}/{len(originals)} originals reached, {dead} dead ends"
            return (
                f"the gradient reaches {reached} of {len(originals)} original parameters; "
                f"{dead} of {len(replicas)} replica parameters are dead ends"
            )
        if originals:
            return f"the gradient reaches {reached} of {len(originals)} parameters"
        ops = sum(n.kind in ("op", "join") for n in nodes)
        leaves = sum(n.leaf for n in nodes)
        return f"{ops} backward function{'s' * (ops != 1)}, {leaves} lea{'f' if leaves == 1 else 'ves'}"

    def __repr__(self) -> str:
        if self.no_history:
            return f"<AutogradGraph: {self.no_history}>"
        return (
            f"<AutogradGraph: {len(self.nodes)} nodes, {len(self.edges)} edges, "
            f"{len(self.dead_ends)} dead ends, {len(self.unreached)} unreached>"
        )


def autograd_graph(
    output: torch.Tensor | Sequence[torch.Tensor],
    module: nn.Module | None = None,
    replicas: Sequence[nn.Module] | None = None,
    *,
    names: Mapping[str, torch.Tensor] | None = None,
    title: str | None = None,
    create_graph: tuple[torch.Tensor, Sequence[torch.Tensor]] | None = None,
) -> AutogradGraph:
    """The autograd graph behind ``output``, its leaves named after ``module`` and ``replicas``.

    ``module``: the original module (a ``DataParallel`` is unwrapped to its ``.module``); its
    parameters are named ``original 0.weight``. ``replicas``: the modules ``replicate`` made from it,
    one per slot; their copies are named ``replica 1 · 0.weight · cpu``, whether they are leaves
    (``"clone"``) or outputs of a ReduceAdd / Broadcast node (``"rewire"``, ``"broadcast"``).
    ``names``: more tensors to name, ``{"x": x, "h": h}``; a non-leaf gets a node of its own.
    ``title``: a first line for the picture. Works after ``backward()``: no saved tensor is read.
    ``create_graph=(loss, grads)``: ``grads`` came from ``torch.autograd.grad(loss, ...,
    create_graph=True)``; the nodes that backward recorded (under ``grads``, outside ``loss``'s own
    graph) are listed in ``.recorded`` and drawn in a box of their own (chapter 07).
    """
    graph, _ = walked_graph(output, module, replicas, names=names, title=title, create_graph=create_graph)
    return graph


def walked_graph(
    output: torch.Tensor | Sequence[torch.Tensor],
    module: nn.Module | None = None,
    replicas: Sequence[nn.Module] | None = None,
    *,
    names: Mapping[str, torch.Tensor] | None = None,
    title: str | None = None,
    handles: bool = False,
    create_graph: tuple[torch.Tensor, Sequence[torch.Tensor]] | None = None,
) -> tuple[AutogradGraph, Handles | None]:
    """``autograd_graph``, and with ``handles=True`` the live ``grad_fn`` behind each node (``walk.Handles``)."""
    outputs = list(output) if isinstance(output, (list, tuple)) else [output]
    if not outputs or not all(isinstance(o, torch.Tensor) for o in outputs):
        raise TypeError(
            f"autograd_graph expects a tensor (or a list of tensors), got {type(output).__name__}"
        )
    table = build_names(module, replicas, names)
    nodes, edges, found = walk_graph(outputs, table, handles=handles or create_graph is not None)
    recorded: frozenset[str] = frozenset()
    if create_graph is not None:
        loss, grads = create_graph
        forward = grad_fns([loss.grad_fn])  # the graph the first backward walked
        under = grad_fns([g.grad_fn for g in grads], stop={id(fn) for fn in forward})
        new = {id(fn) for fn in under}  # what it recorded, under grads (both lists alive till here)
        kind_of = {n.id: n.kind for n in nodes}
        recorded = frozenset(
            nid for nid, fn in found.fns.items() if kind_of.get(nid) in ("op", "join") and id(fn) in new
        )
        found = found if handles else None
    params, why = [p for p, _ in table.originals], no_history(outputs, module)
    return AutogradGraph(nodes, edges, params, title, table.canonical, recorded, why), found


def no_history(outputs: Sequence[torch.Tensor], module: nn.Module | None = None) -> str | None:
    """Why no output has an autograd history (``grad_fn`` is None for each), in one line; None if one has."""
    if any(o.grad_fn is not None for o in outputs):
        return None
    t = outputs[0]
    which = "This tensor" if len(outputs) == 1 else "None of these tensors"
    if t.requires_grad:  # a leaf: made by the user (a parameter, requires_grad=True), not by an operation
        return (
            f"{which}: a leaf, made by you and not by an operation, so there is no graph behind it; "
            "its gradient lands in its .grad. Draw a result computed from it instead"
        )
    if t.is_inference():
        return (
            f"{which}: no history, computed under torch.inference_mode(); compute it with grad on to draw it"
        )
    params = [] if module is None else [p for p in module.parameters() if p.requires_grad]
    if params:
        return (
            f"{which}: no history although the module's parameters require grad: computed under "
            "torch.no_grad() or from .detach()ed tensors? Run the forward with grad on"
        )
    return (
        f"{which}: no history: computed under torch.no_grad(), or from tensors with requires_grad=False "
        "(set requires_grad=True on an input, or compute it from a module's parameters)"
    )
