"""Drawing a view with graphviz: one box per replica slot, one for the original module, a legend inside.

Arrows follow ``next_functions``: the way the gradient flows in ``backward()``, from the output
at the top down to the tensors whose ``.grad`` it fills. The colours and borders are those of
``legend.LEGEND``; the legend drawn into every picture lists the entries that picture uses.

The box around each replica slot is tinted by device (grey for the CPU, a colour per CUDA device),
so two slots on one device share a tint and slots on different GPUs do not. The original module's
parameters and the ReduceAdd / Broadcast nodes sit in a blue-bordered box of their own.
"""

from __future__ import annotations

import re
from dataclasses import replace

from .legend import (
    EDGE_LEGEND,
    FILL,
    FONT,
    GREEN,
    GREY,
    ORANGE,
    PURPLE,
    RECORDED_BORDER,
    RECORDED_TINT,
    RED,
    device_tint,
    edge_entry,
    entry,
    legend_label,
    missing_from_one_slot,
)
from .nodes import Edge, Node, shape_text
from .view import MAX_NODES, View


def _join_detail(n: Node, view: View, by_id: dict[str, Node]) -> str:
    copies = sum(1 for e in view.edges if e.dst == n.id and by_id[e.src].kind == "replica")
    targets = [by_id[e.dst] for e in view.edges if e.src == n.id and by_id[e.dst].kind == "original"]
    if not copies:
        return ""
    if n.members > 1:
        return f"each sums {copies} replicas' gradients"
    into = targets[0].label.removeprefix("original ") if len(targets) == 1 else f"{len(targets)} parameters"
    return f"sums {copies} gradient{'s' * (copies != 1)}\ninto {into}"  # two short lines: four of these share a row


def _short(n: Node) -> str:
    """A compact label: the colour and the box already say what the node is and where it lives."""
    if n.param is not None:
        return n.param.name
    if n.members > 1:
        where = n.module or "(top)"
        if n.kind == "op":
            return f"{where} ({n.members} ops)"
        return f"{n.members} × {n.op}" if n.kind == "join" else f"{where}.* ({n.members})"
    first = n.label.splitlines()[0]
    if n.kind in ("op", "join") and n.op:  # AddmmBackward0 -> Addmm: three pictures must fit one row
        short = re.sub(r"Backward\d*$", "", first)
        # a backward's own backward (MseLossBackwardBackward0) keeps its name: "MseLossBackward" would
        # read as the first-order node
        return first if not short or short.endswith("Backward") else short
    return first


def _node_attrs(n: Node, view: View, by_id: dict[str, Node], compact: bool = False) -> dict[str, str]:
    kind = entry(n, view.recorded)
    lines = [n.label]
    if n.kind == "replica" and n.param is not None and n.slot is not None:
        lines = [n.param.name]  # its box's title says which replica and which device
    shape = shape_text(n.shape)
    if n.kind in ("output", "original", "replica", "input", "leaf", "tensor") and shape:
        if n.kind == "replica" and n.param is not None and len(lines[0]) + len(shape) > 12:
            lines.append(f"({shape})")  # as narrow as ".grad stops here": the copies share one row
        else:
            lines[0] += f"  ({shape})"
    attrs = {"fillcolor": FILL.get(kind, "#ffffff"), "style": "filled"}
    if n.kind in ("op", "join", "more"):
        attrs["style"] = "rounded,filled"
    if n.kind == "join" and kind != "recorded":
        attrs.update(penwidth="2", color=ORANGE)
        detail = _join_detail(n, view, by_id)
        if detail:
            lines.append(detail)
    if kind == "unreached":
        attrs.update(color=RED, fontcolor=RED, style="filled,dashed", penwidth="2")
        lines.append("never reached: .grad stays None")
    elif kind == "dead_end":  # two short lines: a replica's parameters share one row (_pin_replica_order)
        attrs.update(color=RED, penwidth="2")
        lines += ["dead end:", ".grad stops here"]
    elif n.kind == "tensor":
        lines.append("not a leaf: .grad stays None")
    if n.members > 1:
        attrs["shape"] = "box3d"
    if n.status == "fixed":
        attrs.update(color=PURPLE, penwidth="3")
        lines += ["no longer", "a dead end"]  # two short lines: a replica's parameters share one row
    elif n.status == "newly reached":
        attrs.update(color=GREEN, penwidth="3")
        lines.append("reached now")
    elif n.status == "added":
        attrs.update(color=GREEN, penwidth="3")
    elif n.status == "removed":
        attrs.update(style="dashed", color=GREY, fontcolor=GREY, fillcolor="#f5f5f5")
    attrs["label"] = _short(n) if compact else "\n".join(lines)  # compact: colours and borders say the rest
    return attrs


_EDGE_STYLE = {  # each entry's line, in its colour from legend.EDGE_LEGEND
    "added": {"penwidth": "3"},
    "removed": {"style": "dashed", "penwidth": "2"},
    "missing": {"style": "dotted", "arrowhead": "tee", "penwidth": "2.5"},
    "join": {"penwidth": "2"},
    "": {},
}


def _edge_attrs(e: Edge, by_id: dict[str, Node]) -> dict[str, str]:
    key = edge_entry(e, by_id)
    attrs = {"color": EDGE_LEGEND[key][0], **_EDGE_STYLE[key]}
    if by_id[e.src].kind == "replica" and by_id[e.dst].kind in ("join", "original"):
        attrs["minlen"] = "2"  # room below the replicas for the lines from the copies to fan out
    return attrs


def _remark(c, i: int, target: str, text: str, width: int = 32) -> None:
    """A note beside ``target`` on its row, tied to it by a dashed line: what the reader should see there."""
    import textwrap

    name = f"note_{i}"
    label = "\\l".join(textwrap.wrap(text, width)) + "\\l"  # dot centres lines: \l left-justifies them
    c.node(
        name,
        label=label,
        shape="note",
        style="filled",
        fillcolor="#fffde7",
        color="#9e9e9e",
        fontsize="10",
        margin="0.15,0.06",  # browsers' Helvetica runs wider than dot measures it
    )
    c.body.append(f"\t{{rank=same; {_quote(target)} {_quote(name)}}}\n")
    c.edge(target, name, style="dashed", arrowhead="none", color="#9e9e9e")


def _quote(name: str) -> str:
    from graphviz.quoting import quote

    return quote(name)


def _same_row(c, row: list[Node]) -> None:
    """``row`` on one rank, tied left to right by invisible edges: dot keeps them in this order."""
    if len(row) < 2:
        return
    c.body.append("\t{rank=same; " + " ".join(_quote(n.id) for n in row) + "}\n")
    for a, b in zip(row, row[1:]):
        c.edge(a.id, b.id, style="invis")


def _pin_module_order(c, members: list[Node], view: View) -> None:
    """The original's parameters on one row in module order (0.weight, 0.bias, 2.weight, ...), tied
    left to right by invisible edges, so every picture of one module puts them in the same place."""
    by_id = {n.id: n for n in view.nodes}

    def key(n: Node) -> tuple:
        """An original's place in module order, a join's the first original it feeds; then the module
        path, numbers as numbers (collapsed boxes have no parameter)."""
        fed = [by_id[e.dst].param for e in view.edges if e.src == n.id and by_id[e.dst].param is not None]
        index = n.param.index if n.param is not None else min((p.index for p in fed), default=-1)
        return (index, _param_key(n)[1])

    originals = sorted((n for n in members if n.kind == "original"), key=key)
    # the ReduceAdd nodes too, one above each original: left to dot, 2.bias's stood first
    joins = sorted((n for n in members if n.kind == "join" and n.id not in view.recorded), key=key)
    for row in (originals, joins):
        _same_row(c, row)


def _param_key(n: Node) -> tuple:
    """A parameter's place in module order (0.weight, 0.bias, 2.weight, ...); a collapsed box's, its
    module path with numbers compared as numbers."""
    path = [(int(p), "") if p.isdigit() else (-1, p) for p in (n.module or "").split(".")]
    return (n.param.index if n.param is not None else -1, path)


_NO_PARAM = (float("inf"), [])


def _module_first(view: View) -> list[Edge]:
    """``view.edges`` (the same edges) with each node's out-edges ordered by the first parameter, in
    module order, each leads to: with ``ordering=out`` dot then draws each replica's parameters in
    module order, above the original's, so the lines between them run side by side. (In
    ``next_functions`` order ``AddmmBackward0`` lists the bias first, and ``2.bias``'s line crossed the
    whole picture.)"""
    by_id = {n.id: n for n in view.nodes}
    out: dict[str, list[tuple[int, Edge]]] = {}
    for i, e in enumerate(view.edges):
        out.setdefault(e.src, []).append((i, e))
    low: dict[str, tuple] = {}

    def lowest(start: str) -> tuple:  # the smallest module-order key reachable from a node, iteratively
        stack = [(start, False)]
        while stack:
            nid, done = stack.pop()
            if nid in low:
                continue
            nexts = [e.dst for _, e in out.get(nid, ()) if e.status != "missing" and e.dst in by_id]
            if not done:
                stack.append((nid, True))
                stack.extend((d, False) for d in nexts if d not in low)
                continue
            n = by_id.get(nid)
            own = _param_key(n) if n is not None and n.kind in ("original", "replica") else _NO_PARAM
            low[nid] = min([own, *(low.get(d, _NO_PARAM) for d in nexts)])
        return low[start]

    # sources in the order they first appear (out's own order), each one's edges sorted
    return [e for items in out.values() for _, e in sorted(items, key=lambda ie: (lowest(ie[1].dst), ie[0]))]


def _order_by_depth(view: View, edges: list[Edge]) -> tuple[dict[str, int], dict[str, int]]:
    """Each node's depth (longest path from a root) and its place in a depth-first walk along ``edges``."""
    children: dict[str, list[str]] = {n.id: [] for n in view.nodes}
    parents: dict[str, int] = dict.fromkeys(children, 0)
    for e in edges:
        if e.status != "missing" and e.src in children and e.dst in children:
            children[e.src].append(e.dst)
            parents[e.dst] += 1
    roots = [n for n, k in parents.items() if not k]
    depth, order, left = dict.fromkeys(roots, 0), {}, dict(parents)
    queue = list(roots)  # Kahn's walk: a node's depth is final once all its parents are done
    while queue:
        n = queue.pop()
        for c in children[n]:
            depth[c] = max(depth.get(c, 0), depth[n] + 1)
            left[c] -= 1
            if not left[c]:
                queue.append(c)
    stack = list(reversed(roots))
    while stack:
        n = stack.pop()
        if n not in order:
            order[n] = len(order)
            stack.extend(reversed(children[n]))
    return depth, order


def _pin_replica_order(c, members: list[Node], depth: dict[str, int], order: dict[str, int]) -> None:
    """Each row of a replica's box in next_functions order (``_module_first``), tied left to right, so
    every slot has one shape; the replica's parameters share one row at the foot of its box, in module
    order like the original's, so the edges from the copies leave the box straight down, side by side
    (a parameter on a row higher up sent its edge out through the side of the box)."""
    rows: dict[int, list[Node]] = {}
    for n in members:
        if n.id in depth and n.kind != "replica":
            rows.setdefault(depth[n.id], []).append(n)
    for row in rows.values():
        row.sort(key=lambda n: order.get(n.id, 0))
    params = sorted((n for n in members if n.kind == "replica" and n.id in depth), key=_param_key)
    for row in [*rows.values(), params]:
        _same_row(c, row)


# Compact pictures are shown two to a row (~490 px each at notebook width): boxes as narrow as their
# names (width 0, not dot's 0.75 in minimum, which made "T" as wide as "0.weight") and a larger font,
# so the labels stay about 10 px tall or more once the row is scaled to fit (compare.py).
COMPACT_NODE = {"fontsize": "12", "height": "0.25", "width": "0", "margin": "0.04,0.02"}
NODE = {"fontsize": "10", "height": "0.3", "margin": "0.08,0.04"}


def to_digraph(view: View, legend: bool = True, compact: bool = False):
    """A ``graphviz.Digraph`` of ``view`` (needs the graphviz Python package, not the dot program).

    ``compact=True``: only names in the boxes, packed tighter, for pictures shown side by side.
    """
    import graphviz  # imported here: `import dpteach` must not need it

    by_id = {n.id: n for n in view.nodes}
    title = "\n".join([view.title, *view.notes])
    # Past MAX_NODES, dot's layout of a box whose nodes span many ranks (the original module's, fed from
    # every depth of the replicas) costs seconds: big drawings leave that box out (the ReduceAdd nodes
    # then line up between the replicas) and cap network simplex's iterations.
    big = len(view.nodes) > MAX_NODES
    g = graphviz.Digraph(
        "autograd",
        graph_attr={
            "rankdir": "TB",
            "label": title,
            "labelloc": "t",
            "fontname": FONT,
            "fontsize": "13",
            "nodesep": "0.08" if compact else "0.25",
            "ranksep": "0.25" if compact else "0.35",
            "ordering": "out",
            # no second crossing-minimisation pass: it moved nodes against the invisible left-to-right
            # edges that tie each row (a hand-rewired 0.weight put 2.bias first), and mirrored replica
            # 1 to save a crossing. The first pass runs in full on a picture of one size (the rows of
            # each replica are tied, so it cannot reorder them; it straightens the edges between); big
            # drawings keep it short, and dot keeps the order the statements give (cut short in
            # compact drawings too, the long edges to a row of parameters looped round the boxes)
            "remincross": "false",
            "mclimit": "0.01" if big else "1",
            **({"nslimit": "2", "nslimit1": "2"} if big else {}),
        },
        node_attr={"shape": "box", "fontname": FONT, **(COMPACT_NODE if compact else NODE)},
        edge_attr={"arrowsize": "0.7"},
    )
    slots = sorted({n.slot for n in view.nodes if n.slot is not None and n.kind in ("op", "replica")})
    clusters: dict[str, list[Node]] = {f"replica{s}": [] for s in slots}
    for n in view.nodes:
        if n.id in view.recorded:  # what a backward with create_graph=True recorded: a box of its own
            clusters.setdefault("recorded", []).append(n)
        elif n.slot is not None and n.kind in ("op", "replica"):
            clusters[f"replica{n.slot}"].append(n)
        elif n.kind in ("original", "join") and slots and not big:
            clusters.setdefault("original", []).append(n)
    drawn, _ = missing_from_one_slot(view)  # clone's missing edges from one replica: traceable, not a fan
    edges = drawn if big else _module_first(replace(view, edges=drawn))
    depth, order = _order_by_depth(view, edges) if not big else ({}, {})
    in_cluster = {n.id for members in clusters.values() for n in members}
    for n in view.nodes:  # the nodes outside any box first: dot then keeps the slots in order, 0 on the left
        if n.id not in in_cluster:
            g.node(n.id, **_node_attrs(n, view, by_id, compact))
    for name, members in clusters.items():
        tint, just = None, "c"
        if name == "original":  # its label below: the edges from the replicas come in over the top
            device = next((n.device for n in members if n.kind == "original"), None) or "cpu"
            label, border, loc = f"original module · {device}", "#1565c0", "b"
        elif name == "recorded":
            label, border, loc = (
                "recorded by the first backward\\r(create_graph=True)\\r",
                RECORDED_BORDER,
                "t",
            )
            device, tint, just = None, RECORDED_TINT, "r"  # right: the edges come in over the left
        else:
            device = next((n.device for n in members if n.kind == "replica"), members[0].device)
            label, border, loc = f"replica {name.removeprefix('replica')} · {device}", "#9e9e9e", "t"
        with g.subgraph(name=f"cluster_{name}") as c:
            c.attr(
                label=label,
                style="filled,rounded",
                color=border,
                fillcolor=tint or device_tint(device),
                fontname=FONT,
                fontsize="12",
                labelloc=loc,
                labeljust=just,
                peripheries="1",
            )
            for n in members:
                c.node(n.id, **_node_attrs(n, view, by_id, compact))
            if name == "original":
                _pin_module_order(c, members, view)
            elif not big and name != "recorded":
                _pin_replica_order(c, members, depth, order)
            for i, target in enumerate(view.remarks):  # a note sits in the box of the node it is about
                if any(n.id == target for n in members):
                    _remark(c, i, target, view.remarks[target])
    for i, target in enumerate(view.remarks):
        if target not in in_cluster:
            _remark(g, i, target, view.remarks[target])
    for e in edges:
        g.edge(e.src, e.dst, **_edge_attrs(e, by_id))
    if legend and view.nodes:
        # the legend is the label of a frameless box around everything: below the picture, moving no node
        outer = graphviz.Digraph(
            "autograd", graph_attr={**g.graph_attr}, node_attr={**g.node_attr}, edge_attr={**g.edge_attr}
        )
        g.name, g.node_attr, g.edge_attr = "cluster_legend", {}, {}
        legend_box = {"labelloc": "b", "labeljust": "r", "peripheries": "0", "fontsize": "11"}
        g.graph_attr = {"label": legend_label(view), **legend_box}
        outer.subgraph(g)
        return outer
    return g
