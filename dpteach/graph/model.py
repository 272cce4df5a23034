"""The autograd graph behind a tensor, walked into plain nodes and edges.

The walk starts at ``output.grad_fn`` and follows ``next_functions``: the way the gradient flows
in ``backward()``. Every ``AccumulateGrad`` node becomes its leaf tensor (``.variable``), named
after the module or replica parameter it is. A replica parameter that is not a leaf (``"rewire"``,
``"broadcast"``) gets a node of its own between its consumers and its ``grad_fn``, so the picture
shows it leading on into the ``ReduceAdd`` / ``Broadcast`` node and the original parameter.

Only graph structure is read, never saved tensors (``_saved_*``), so a graph can be walked after
``backward()`` freed them: where torchviz's ``show_saved`` raises "Trying to backward through the
graph a second time", this does not.

Node ids are built from names and the order of the walk (``AddmmBackward0_2``, ``original.0.weight``,
``replica1.0.weight``, ``ReduceAddBackward[0.weight]``), never from ``id()``, so the same model
gives the same nodes, edges and DOT text on every run, and two strategies' graphs can be diffed.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Mapping, NamedTuple, Sequence

import torch

from .names import Named, Param, TensorNames, shape_of

KINDS = ("output", "op", "join", "original", "replica", "input", "tensor", "leaf", "more")


@dataclass(frozen=True)
class Node:
    """One node of the graph: a backward function (``op``, ``join``) or a tensor (everything else)."""

    id: str
    kind: str  # one of KINDS; "join" is a ReduceAdd/Broadcast node that a replica parameter comes out of
    label: str  # the name a learner reads: "AddmmBackward0", "original 0.weight", "replica 1 · 0.weight · cpu"
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


def _module_of(param: Param | None) -> str | None:
    return None if param is None else param.name.rpartition(".")[0]


class _Walk:
    """One depth-first walk from the outputs; builds nodes in preorder, records the postorder."""

    def __init__(self, table: TensorNames) -> None:
        self.table = table
        self.join_fns = table.join_fns
        self.nodes: dict[str, Node] = {}
        self.children: dict[str, list[str]] = {}
        self.by_fn: dict[int, str] = {}  # id(grad_fn) -> node id
        self.by_site: dict[tuple[int, int], str] = {}
        self.counts: Counter[str] = Counter()
        self.keep: list[object] = []  # hold the grad_fn wrappers so their id()s stay theirs
        self.postorder: list[str] = []
        self._pending: list = []  # a node just made, waiting to be walked into

    def _add(self, node: Node, targets: list) -> str:
        while node.id in self.nodes:  # two tensors given one name: keep both, deterministically
            node = replace(node, id=node.id + "'")
        self.nodes[node.id] = node
        self.children[node.id] = []
        self._pending.append((node.id, iter(targets)))
        return node.id

    def _counted(self, base: str) -> str:
        self.counts[base] += 1
        return f"{base}_{self.counts[base]}"

    def _tensor_node(self, named: Named, leaf: bool, targets: list) -> str:
        if named.kind == "original":
            nid = f"original.{named.param.name}"
        elif named.kind == "replica":
            nid = f"replica{named.param.slot}.{named.param.name}"
        else:
            nid = f"tensor.{named.label}"
        slot = named.param.slot if named.param else None
        node = Node(nid, named.kind, named.label, param=named.param, shape=named.shape, slot=slot,
                    device=named.device, leaf=leaf)
        return self._add(node, targets)

    def _resolve(self, target: tuple) -> str | None:
        """The node id a ``next_functions`` entry leads to, creating the node on first sight."""
        if target[0] == "site":  # (grad_fn, output_nr): maybe a named non-leaf tensor sits here
            _, fn, nr = target
            if fn is None:
                return None
            named = self.table.lookup_site(fn, nr)
            if named is None:
                return self._resolve(("fn", fn))
            key = (id(fn), nr)
            if key not in self.by_site:
                self.by_site[key] = self._tensor_node(named, False, [("fn", fn)])
            return self.by_site[key]
        fn = target[1]
        if id(fn) in self.by_fn:
            return self.by_fn[id(fn)]
        self.keep.append(fn)
        if hasattr(fn, "variable"):  # AccumulateGrad: the leaf tensor and the node that writes its .grad
            var = fn.variable
            named = self.table.lookup_leaf(var)
            if named is not None:
                nid = self._tensor_node(named, True, [])
            else:
                what = "parameter (not the module's)" if isinstance(var, torch.nn.Parameter) else "leaf tensor"
                nid = self._add(Node(self._counted("leaf"), "leaf", what, shape=shape_of(var), device=str(var.device),
                                     leaf=True), [])
        else:
            name = type(fn).__name__
            kind = "join" if id(fn) in self.join_fns else "op"
            nid = self._counted(name)
            if kind == "join":  # a ReduceAdd node feeds one original parameter: name it after it
                leaves = [f.variable for f, _ in fn.next_functions if f is not None and hasattr(f, "variable")]
                named = [self.table.lookup_leaf(v) for v in leaves]
                if len(named) == 1 and named[0] is not None and named[0].kind == "original":
                    self.counts[name] -= 1
                    nid = f"{name}[{named[0].param.name}]"
            nid = self._add(Node(nid, kind, name, op=name), [("site", f, nr) for f, nr in fn.next_functions])
        self.by_fn[id(fn)] = nid
        return nid

    def run(self, outputs: Sequence[torch.Tensor]) -> None:
        for i, out in enumerate(outputs):
            nid = "output" if len(outputs) == 1 else f"output_{i}"
            if out.grad_fn is not None:
                targets = [("site", out.grad_fn, out.output_nr)]
            elif out.requires_grad:  # the output is itself a leaf: reach its AccumulateGrad (picotron's trick)
                with torch.enable_grad():
                    targets = [("fn", out.expand_as(out).grad_fn.next_functions[0][0])]
            else:
                targets = []
            self._add(Node(nid, "output", "output", shape=shape_of(out), device=str(out.device)), targets)
            self._drain()

    def _drain(self) -> None:
        stack = [self._pending.pop()]
        while stack:
            nid, it = stack[-1]
            target = next(it, None)
            if target is None:
                stack.pop()
                self.postorder.append(nid)
                continue
            child = self._resolve(target)
            if child is None:
                continue
            if child not in self.children[nid]:
                self.children[nid].append(child)
            if self._pending:  # a node made just now: walk into it before the next sibling (preorder)
                stack.append(self._pending.pop())


def build_graph(outputs: Sequence[torch.Tensor], table: TensorNames) -> tuple[list[Node], list[Edge]]:
    """Walk the graph, then work out slots, dead ends, unreached originals and modules."""
    walk = _Walk(table)
    walk.run(outputs)
    nodes, children, post = walk.nodes, walk.children, walk.postorder

    # which replica slots each node leads to; a node leading to exactly one lives in that slot's cluster
    mask: dict[str, int] = {}
    to_original: dict[str, bool] = {}
    for nid in post:  # children first
        n = nodes[nid]
        kids = children[nid]
        mask[nid] = (1 << n.slot) if n.kind == "replica" else 0
        for c in kids:
            mask[nid] |= mask[c] if nodes[c].kind not in ("join", "original") else 0
        to_original[nid] = n.kind == "original" or any(to_original[c] for c in kids)

    # the ops between the output and the first parameter (loss, Gather) belong to no module
    bearing = {nid for nid in nodes if any(nodes[c].kind in ("original", "replica") for c in children[nid])}
    below: set[str] = set()
    for nid in reversed(post):  # parents first
        if nid in bearing or nid in below:
            below.update(children[nid])
    module: dict[str, str | None] = {}
    for nid in post:
        n = nodes[nid]
        if n.param is not None:
            module[nid] = _module_of(n.param)
        elif n.kind in ("op", "join"):
            params = [nodes[c].param for c in children[nid] if nodes[c].kind in ("original", "replica")]
            if params and (n.kind == "op" or len(params) == 1):
                module[nid] = _module_of(params[0])
            elif n.kind == "op" and nid in below:
                module[nid] = next((module[c] for c in children[nid] if module.get(c) is not None), None)
            else:
                module[nid] = None
        else:
            module[nid] = None

    out: list[Node] = []
    for nid, n in nodes.items():
        m = mask[nid]
        slot = n.slot
        if n.kind == "op" and m and m & (m - 1) == 0:  # exactly one bit: one slot
            slot = m.bit_length() - 1
        out.append(replace(n, slot=slot, module=module[nid], dead_end=n.kind == "replica" and not to_original[nid]))
    seen = {n.param for n in out if n.kind == "original"}
    for param, t in table.originals:
        if param not in seen:
            out.append(Node(f"original.{param.name}", "original", str(param), param=param, shape=shape_of(t),
                            device=param.device, leaf=t.grad_fn is None, reached=False, module=_module_of(param)))
    present = {n.id for n in out}
    for named, t in table.named_leaves:  # a leaf you named that the output does not reach: its .grad stays None
        if f"tensor.{named.label}" not in present and table.lookup_leaf(t) is named:
            out.append(Node(f"tensor.{named.label}", "input", named.label, shape=named.shape, device=named.device,
                            leaf=True, reached=False))
    edges = [Edge(src, dst) for src in nodes for dst in children[src]]
    slot_device = {n.slot: n.device for n in out if n.kind == "replica"}
    out = [replace(n, device=slot_device.get(n.slot, n.device)) if n.kind == "op" else n for n in out]
    return out, edges


def frozen(nodes: Sequence[Node]) -> Mapping[str, Node]:
    return MappingProxyType({n.id: n for n in nodes})
