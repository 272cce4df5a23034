"""The one walk of the autograd graph behind a tensor, in named passes: walk, name, trace, place, finish.

The walk starts at ``output.grad_fn`` and follows ``next_functions``: the way the gradient flows
in ``backward()``. Every ``AccumulateGrad`` node becomes its leaf tensor (``.variable``), named
after the module or replica parameter it is. A replica parameter that is not a leaf (``"rewire"``,
``"broadcast"``) gets a node of its own between its consumers and its ``grad_fn``, so the picture
shows it leading on into the ``ReduceAdd`` / ``Broadcast`` node and the original parameter.

Only graph structure is read, never saved tensors (``_saved_*``), so a graph can be walked after
``backward()`` freed them (torchviz's ``show_saved`` raises there). With ``handles=True`` the walk
also hands back the live ``grad_fn`` behind each node, which the gradient stepper
(``dpteach.widgets.flow``) hooks.

Node ids are built from names and the order of the walk (``AddmmBackward0_2``, ``original.0.weight``,
``replica1.0.weight``, ``ReduceAddBackward[0.weight]``), never from ``id()``, so the same model
gives the same nodes, edges and DOT text on every run, and two strategies' graphs can be diffed.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Mapping, Sequence

import torch

from .names import Named, Param, TensorNames
from .nodes import Edge, Node


@dataclass(frozen=True)
class Handles:
    """The live autograd objects behind a walked graph (``walk_graph(..., handles=True)``).

    ``fns``: node id -> its ``grad_fn`` (a leaf's: its ``AccumulateGrad``; none for outputs and named
    non-leaf tensors). ``entries``: node id -> ``(i, child id)`` for each ``next_functions[i]`` that
    is not None (an output or named non-leaf tensor: one entry, 0, to the node it came out of).
    """

    fns: Mapping[str, object]
    entries: Mapping[str, list[tuple[int, str]]]


# where a node of the walk comes from: an output, a named non-leaf tensor (the "site" (grad_fn,
# output_nr) its consumers point at), a leaf (an AccumulateGrad), or any other grad_fn
OUTPUT, SITE, LEAF, FN = "output", "site", "leaf", "fn"


@dataclass(slots=True, eq=False)
class _RawNode:
    """What the walk found, one per node, in preorder: where it comes from, its live handle, its name."""

    where: str
    fn: object  # the grad_fn (SITE: the one its tensor came out of; LEAF: its AccumulateGrad)
    named: Named | None
    tensor: torch.Tensor | None  # OUTPUT: the output; LEAF: the leaf tensor (AccumulateGrad.variable)
    children: list[int] = field(default_factory=list)  # distinct, in next_functions order
    entries: list[tuple[int, int]] | None = None  # (index into next_functions, child), on request


def _is_leaf_fn(fn: object) -> bool:
    """An ``AccumulateGrad`` node: the one kind of grad_fn that holds its leaf tensor (``.variable``)."""
    return hasattr(fn, "variable")


def grad_fns(starts, stop: set[int] | None = None) -> list:
    """Every grad_fn reachable from ``starts`` along ``next_functions``, not entering ``stop`` (``id()``s).

    The list holds the grad_fns themselves: while it lives, no ``id()`` in it is reused.
    """
    stop = stop or set()
    seen: set[int] = set()
    out = []
    stack = [fn for fn in starts if fn is not None and id(fn) not in stop]
    while stack:
        fn = stack.pop()
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        out.append(fn)
        stack.extend(c for c, _ in fn.next_functions if c is not None and id(c) not in stop)
    return out


def _walk(
    outputs: Sequence[torch.Tensor], table: TensorNames, keep_entries: bool
) -> tuple[list[_RawNode], list[int]]:
    """Pass 1: one depth-first walk from the outputs; nodes in preorder, and the postorder."""
    found: list[_RawNode] = []
    # (id(grad_fn), output_nr) of a named non-leaf tensor, or (id(grad_fn), None) -> its node; found holds
    # the grad_fns, so their id()s stay theirs
    index: dict[tuple[int, int | None], int] = {}
    sites, leaves = table.sites, table.leaves
    post: list[int] = []

    def targets(f: _RawNode) -> enumerate:
        """A node's way on: numbered (grad_fn, output_nr) entries; output_nr None: "the grad_fn itself"."""
        if f.where == FN:
            return enumerate(f.fn.next_functions)
        if f.where == SITE:
            return enumerate(((f.fn, None),))
        if f.where == OUTPUT and f.fn is not None:
            out = f.tensor
            return enumerate(((f.fn, None if out.grad_fn is None else out.output_nr),))
        return enumerate(())

    def visit(fn: object, nr: int | None) -> tuple[int, bool]:
        """The node a next_functions entry leads to, and whether it was made just now."""
        named = sites.get((id(fn), nr))
        key = (id(fn), nr if named is not None else None)
        if key in index:
            return index[key], False
        index[key] = len(found)
        if named is not None:  # a named non-leaf tensor sits on this edge
            found.append(_RawNode(SITE, fn, named, None))
        elif _is_leaf_fn(fn):  # AccumulateGrad: the leaf tensor and the node that writes its .grad
            found.append(_RawNode(LEAF, fn, leaves.get(id(fn.variable)), fn.variable))
        else:
            found.append(_RawNode(FN, fn, None, None))
        return len(found) - 1, True

    for out in outputs:
        if out.grad_fn is not None:
            start = out.grad_fn
        elif out.requires_grad:  # the output is itself a leaf: reach its AccumulateGrad (picotron's trick)
            with torch.enable_grad():
                start = out.expand_as(out).grad_fn.next_functions[0][0]
        else:
            start = None
        found.append(_RawNode(OUTPUT, start, None, out))
        stack = [(len(found) - 1, targets(found[-1]))]
        while stack:
            parent, way = stack[-1]
            node = found[parent]
            for i, (fn, nr) in way:
                if fn is None:
                    continue
                child, new = visit(fn, nr)
                if child not in node.children:
                    node.children.append(child)
                if keep_entries:
                    node.entries = node.entries or []
                    node.entries.append((i, child))
                if new:  # walk into it before the next sibling (preorder)
                    stack.append((child, targets(found[child])))
                    break
            else:
                stack.pop()
                post.append(parent)
    return found, post


def _named_node(named: Named, **more) -> Node:
    """The node of a named tensor: an original parameter, a replica's copy, or one of ``names=``."""
    param = named.param
    if named.kind == "original":
        nid = f"original.{param.name}"
    elif named.kind == "replica":
        nid = f"replica{param.slot}.{param.name}"
    else:
        nid = f"tensor.{named.label}"
    slot = None if param is None else param.slot
    return Node(
        nid, named.kind, named.label, param=param, shape=named.shape, slot=slot, device=named.device, **more
    )


def _name(found: list[_RawNode], table: TensorNames, n_outputs: int) -> list[Node]:
    """Pass 2: each node's id (from names, and counts in the walk's order) and what it shows."""
    counts: Counter[str] = Counter()
    taken: set[str] = set()
    join_fns = table.join_fns
    nodes: list[Node] = []  # their ids, labels and what they are; _finish adds what needs the whole graph
    outputs = 0
    for f in found:
        named = f.named
        if f.where == OUTPUT:
            out = f.tensor
            nid = "output" if n_outputs == 1 else f"output_{outputs}"
            outputs += 1
            node = Node(nid, "output", "output", shape=tuple(out.shape), device=str(out.device))
        elif named is not None:  # a named tensor: a parameter, a replica's copy, one of names=
            node = _named_node(named, leaf=f.where == LEAF)
        elif f.where == LEAF:
            var = f.tensor
            counts["leaf"] += 1
            nid = f"leaf_{counts['leaf']}"
            what = "parameter (not the module's)" if isinstance(var, torch.nn.Parameter) else "leaf tensor"
            node = Node(nid, "leaf", what, shape=tuple(var.shape), device=str(var.device), leaf=True)
        else:
            name = type(f.fn).__name__
            if name == "CppFunction":  # a node written in C++ (chapter 10's ReduceAdd): its own name
                name = f.fn.name().rsplit("::", 1)[-1]
            kind = "join" if id(f.fn) in join_fns else "op"
            nid = None
            if kind == "join":  # a ReduceAdd node feeds one original parameter: name it after it
                leaves = [fn.variable for fn, _ in f.fn.next_functions if fn is not None and _is_leaf_fn(fn)]
                only = table.leaves.get(id(leaves[0])) if len(leaves) == 1 else None
                if only is not None and only.kind == "original":
                    nid = f"{name}[{only.param.name}]"
            if nid is None:
                counts[name] += 1
                nid = f"{name}_{counts[name]}"
            node = Node(nid, kind, name, op=name)
        if node.id in taken:  # two tensors given one name: keep both, deterministically
            nid = node.id
            while nid in taken:
                nid += "'"
            node = replace(node, id=nid)
        taken.add(node.id)
        nodes.append(node)
    return nodes


def _trace(found: list[_RawNode], post: list[int], nodes: list[Node]) -> tuple[list[int | None], list[bool]]:
    """Pass 3: the one replica slot each op leads to (None: none or several); which nodes lead to an original.

    The gather and the ops above it are in no slot, even with one. No path on to an original: a dead end.
    """
    mask = [0] * len(found)  # bit s: a path from the node reaches a parameter of replica slot s
    to_original = [False] * len(found)
    passes_on = [n.kind not in ("join", "original") for n in nodes]  # a join starts the original's side
    for i in post:  # children first
        n = nodes[i]
        m = (1 << n.slot) if n.kind == "replica" else 0
        reaches = n.kind == "original"
        for c in found[i].children:
            if passes_on[c]:
                m |= mask[c]
            reaches = reaches or to_original[c]
        mask[i], to_original[i] = (0 if n.op == "GatherBackward" else m), reaches  # replicas meet
    slots = [
        (m.bit_length() - 1) if n.kind == "op" and m and m & (m - 1) == 0 else n.slot  # exactly one bit
        for m, n in zip(mask, nodes)
    ]
    return slots, to_original


def _module_of(param: Param | None) -> str | None:
    return None if param is None else param.name.rpartition(".")[0]


def _place(found: list[_RawNode], post: list[int], nodes: list[Node]) -> list[str | None]:
    """Pass 4: the module each node belongs to, for ``collapse=``.

    An op that consumes a parameter belongs to that parameter's module; an op below one, to its
    children's; the ops between the output and the first parameter (the loss, Gather) to none.
    """
    params = [n.param if n.kind in ("original", "replica") else None for n in nodes]
    below = [False] * len(found)  # under a node that consumes a parameter
    for i in reversed(post):  # parents first
        kids = found[i].children
        if below[i] or any(params[c] is not None for c in kids):
            for c in kids:
                below[c] = True
    module: list[str | None] = [None] * len(found)
    for i in post:  # children first
        n = nodes[i]
        if n.param is not None:
            module[i] = _module_of(n.param)
        elif n.kind in ("op", "join"):
            kids = found[i].children
            mine = [params[c] for c in kids if params[c] is not None]
            if mine and (n.kind == "op" or len(mine) == 1):
                module[i] = _module_of(mine[0])
            elif n.kind == "op" and below[i]:
                module[i] = next((module[c] for c in kids if module[c] is not None), None)
    return module


def _finish(
    nodes: list[Node],
    slots: list[int | None],
    to_original: list[bool],
    module: list[str | None],
    table: TensorNames,
) -> list[Node]:
    """Pass 5: the final nodes, with the parameters the walk never reached."""
    slot_device = {n.slot: n.device for n in nodes if n.kind == "replica"}  # an op runs on its slot's device
    out = [
        replace(
            n,
            slot=slot,
            device=slot_device.get(slot, n.device) if n.kind == "op" else n.device,
            dead_end=n.kind == "replica" and not reaches,
            module=mod,
        )
        for n, slot, reaches, mod in zip(nodes, slots, to_original, module)
    ]
    seen = {n.param for n in nodes if n.kind == "original"}
    for param, t in table.originals:
        if param not in seen:
            named = Named("original", str(param), param, tuple(t.shape), param.device)
            out.append(_named_node(named, leaf=t.grad_fn is None, reached=False, module=_module_of(param)))
    present = {n.id for n in out}
    for named, t in table.named_leaves:  # a leaf you named that the output does not reach: .grad stays None
        if f"tensor.{named.label}" not in present and table.leaves.get(id(t)) is named:
            out.append(_named_node(named, leaf=True, reached=False))
    return out


def walk_graph(
    outputs: Sequence[torch.Tensor], table: TensorNames, *, handles: bool = False
) -> tuple[list[Node], list[Edge], Handles | None]:
    """The graph behind ``outputs`` as nodes and edges (and, with ``handles=True``, its live grad_fns)."""
    found, post = _walk(outputs, table, keep_entries=handles)
    named = _name(found, table, len(outputs))
    slots, to_original = _trace(found, post, named)
    module = _place(found, post, named)
    nodes = _finish(named, slots, to_original, module, table)
    ids = [n.id for n in named]
    edges = [Edge(ids[i], ids[c]) for i, f in enumerate(found) for c in f.children]
    if not handles:
        return nodes, edges, None
    fns = {ids[i]: f.fn for i, f in enumerate(found) if f.where in (FN, LEAF)}
    entries = {ids[i]: [(k, ids[c]) for k, c in f.entries or ()] for i, f in enumerate(found)}
    return nodes, edges, Handles(MappingProxyType(fns), MappingProxyType(entries))
