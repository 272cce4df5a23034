"""What a drawing shows of a graph: every node, or nodes collapsed by module, and at most ``max_nodes``.

A ResNet has hundreds of backward nodes per replica, a wall drawn one by one (torchviz #71, where
albanD advises collapsing by module). ``collapse=d`` merges, per replica slot, the ops and the
parameters of each module ``d`` levels deep into one node (``layer1`` for ``d=1``); the output, the
loss and ``Gather`` stay. Past ``max_nodes`` nodes with no ``collapse`` given, the finest depth that
fits is chosen; if even depth 1 does not, the first ``max_nodes`` are kept and one node says how
many were left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from .nodes import Edge, Node

MAX_NODES = 150  # the default limit: a picture dot lays out in well under a second, and a reader can scan
_PRIORITY = {"added": 3, "removed": 2, "missing": 1, "": 0}  # a merged edge keeps its loudest status


@dataclass
class View:
    """The nodes and edges one drawing shows, its title, and notes on what was merged or left out."""

    nodes: list[Node]
    edges: list[Edge]
    title: str
    notes: list[str] = field(default_factory=list)
    footer: list[str] = field(default_factory=list)  # text form only: lines after the tree
    recorded: frozenset[str] = frozenset()  # ids of the nodes a backward with create_graph=True recorded
    remarks: dict[str, str] = field(default_factory=dict)  # node id -> a note drawn beside it


def _group(n: Node, depth: int) -> tuple | None:
    """What collapsing groups a node by: kind, slot, module ``depth`` deep (None: drawn as it is)."""
    if n.module is None or n.kind not in ("op", "join", "original", "replica"):
        return None
    return (n.kind, n.slot if n.kind in ("op", "replica") else None, ".".join(n.module.split(".")[:depth]))


def _merged(key: tuple, members: list[Node]) -> Node:
    kind, slot, prefix = key
    first, k, where = members[0], len(members), prefix or "(top)"
    nid, label = {
        "op": (f"ops[{slot}].{where}" if slot is not None else f"ops.{where}", f"{where}\n{k} backward ops"),
        "replica": (
            f"replica{slot}.{where}.*",
            f"replica {slot} · {where}.* · {first.device}\n{k} parameters",
        ),
        "original": (f"original.{where}.*", f"original {where}.*\n{k} parameters"),
        "join": (f"{first.op}[{where}.*]", f"{k} × {first.op}"),
    }[kind]
    statuses = {m.status for m in members}
    status = next((s for s in ("fixed", "newly reached") if s in statuses), "")
    if len(statuses) == 1 and statuses <= {"removed", "added"}:
        status = statuses.pop()
    return Node(
        nid,
        kind,
        label,
        op=first.op if kind == "join" else None,
        slot=first.slot,
        device=first.device,
        leaf=all(m.leaf for m in members),
        dead_end=any(m.dead_end for m in members),
        reached=all(m.reached for m in members),
        module=prefix,
        members=sum(m.members for m in members),
        status=status,
    )


def collapse(nodes: Sequence[Node], edges: Sequence[Edge], depth: int) -> tuple[list[Node], list[Edge]]:
    """Merge each (kind, slot, module at ``depth``) group of two or more nodes into one node."""
    keys = [_group(n, depth) for n in nodes]  # None: drawn as it is
    groups: dict[tuple, list[Node]] = {}
    for n, key in zip(nodes, keys):
        if key is not None:
            groups.setdefault(key, []).append(n)
    rename: dict[str, str] = {}
    merged: dict[tuple, Node] = {}
    for key, members in groups.items():
        if len(members) > 1:
            merged[key] = _merged(key, members)
            rename.update({m.id: merged[key].id for m in members})
    out: dict[str, Node] = {}
    for n, key in zip(nodes, keys):  # keep the walk's order: a merged node sits where its first member was
        node = merged.get(key, n)
        out.setdefault(node.id, node)
    return list(out.values()), _merge_edges(edges, rename)


def _merge_edges(edges: Sequence[Edge], rename: dict[str, str]) -> list[Edge]:
    merged: dict[tuple[str, str], str] = {}
    for e in edges:
        src, dst = rename.get(e.src, e.src), rename.get(e.dst, e.dst)
        if src == dst:
            continue  # an edge inside one module disappears into its node
        old = merged.get((src, dst))
        if old is None or _PRIORITY[e.status] > _PRIORITY[old]:
            merged[(src, dst)] = e.status
    return [Edge(s, d, st) for (s, d), st in merged.items()]


MORE_EDGES = 3  # at most this many kept nodes are drawn leading into the "more nodes" node


def truncate(
    nodes: Sequence[Node], edges: Sequence[Edge], max_nodes: int
) -> tuple[list[Node], list[Edge], int]:
    """Keep the first ``max_nodes - 1`` nodes of the walk; one more node stands for the rest.

    Only the last ``MORE_EDGES`` kept nodes that lead into the ones left out get an edge to it: an
    edge from each (in a loop's graph, every node leads to a weight left out) took dot minutes.
    """
    keep = list(nodes[: max(1, max_nodes - 1)])
    left_out = len(nodes) - len(keep)
    kept = {n.id for n in keep}
    inner = [e for e in edges if e.src in kept and e.dst in kept]
    leading = list(dict.fromkeys(e.src for e in edges if e.src in kept and e.dst not in kept))
    label = f"… {left_out} more nodes not drawn"
    if len(leading) > MORE_EDGES:
        label += f"\n({len(leading)} drawn nodes lead into them; {MORE_EDGES} edges shown)"
    keep.append(Node("more", "more", label))
    return keep, inner + [Edge(src, "more") for src in leading[-MORE_EDGES:]], left_out


def make_view(
    nodes: Sequence[Node],
    edges: Sequence[Edge],
    title: str,
    collapse_depth: bool | int | None = None,
    max_nodes: int | None = MAX_NODES,
) -> View:
    """Apply ``collapse`` (``True`` means depth 1) and ``max_nodes`` (``None``: no limit) to a graph."""
    nodes, edges, notes = list(nodes), list(edges), []
    if collapse_depth is True:
        collapse_depth = 1
    if isinstance(collapse_depth, int) and not isinstance(collapse_depth, bool) and collapse_depth < 0:
        raise ValueError(f"collapse= must be True, False, None or a depth >= 1, got {collapse_depth}")
    if collapse_depth:
        nodes, edges = collapse(nodes, edges, collapse_depth)
        notes.append(f"collapsed by module, depth {collapse_depth}")
    elif collapse_depth is None and max_nodes is not None and len(nodes) > max_nodes:
        total = len(nodes)
        deepest = max((len(n.module.split(".")) for n in nodes if n.module), default=1)
        for depth in range(deepest, 0, -1):  # the finest depth that fits
            merged, merged_edges = collapse(nodes, edges, depth)
            if depth == 1 or len(merged) <= max_nodes:
                nodes, edges = merged, merged_edges
                break
        if len(nodes) < total:  # a graph with no modules (names= only) has nothing to merge
            notes.append(
                f"{total} nodes collapsed by module (depth {depth}) to stay under max_nodes={max_nodes}; "
                "draw(collapse=False) shows each one"
            )
    if max_nodes is not None and len(nodes) > max_nodes:
        nodes, edges, left_out = truncate(nodes, edges, max_nodes)
        notes.append(f"{left_out} nodes left out (max_nodes={max_nodes}); draw(max_nodes=None) shows all")
    return View(nodes, edges, title, notes)
