"""What the colours mean: the legend, drawn into every picture (graphviz HTML) and under side-by-sides (HTML).

``LEGEND`` and ``EDGE_LEGEND`` say what each entry means; a picture's legend lists only the entries
that picture uses.
"""

from __future__ import annotations

from html import escape
from typing import Iterable

from .nodes import Edge, Node
from .view import View

FONT = "Helvetica"
FILL = {
    "output": "#c5e1a5",
    "op": "#e0e0e0",
    "join": "#ffb74d",
    "original": "#90caf9",
    "unreached": "#ffffff",
    "dead_end": "#ef9a9a",
    "replica": "#e3f2fd",
    "input": "#fff59d",
    "leaf": "#fff59d",
    "tensor": "#ffffff",
    "more": "#fafafa",
    "recorded": "#ffe9a8",
}
RECORDED_TINT, RECORDED_BORDER = "#fffbea", "#c79100"  # the box around what create_graph=True recorded
RED, GREEN, ORANGE, PURPLE, GREY = "#c62828", "#2e7d32", "#ef6c00", "#6a1b9a", "#616161"
MISSING = "#d84343"  # the edge clone() never made: red, lighter than a dead end, dark enough at 1000 px
DEVICE_TINTS = ["#e3f0fb", "#fdf0e0", "#e8f5e9", "#f3e5f5", "#fffde7", "#e0f7fa", "#fbe9e7", "#ede7f6"]

JOIN = "ReduceAdd(Backward) / BroadcastBackward: joins the replicas to the original"  # a legend names its own
LEGEND = {  # entry -> (fill, border, border style, text)
    "output": (FILL["output"], "black", "solid", "output: backward() starts here"),
    "op": (FILL["op"], "black", "solid", "backward function (grad_fn)"),
    "join": (FILL["join"], "black", "solid", JOIN),
    "original": (FILL["original"], "black", "solid", "original parameter: a leaf, its .grad fills"),
    "unreached": (FILL["unreached"], RED, "dashed", "never reached from the output: .grad stays None"),
    "dead_end": (FILL["dead_end"], RED, "solid", "replica parameter, dead end: the gradient stops here"),
    "replica": (FILL["replica"], "black", "solid", "replica parameter: leads on to the original, not a leaf"),
    "input": (FILL["input"], "black", "solid", "leaf that requires grad: its .grad fills"),
    "tensor": (FILL["tensor"], "black", "solid", "named tensor, not a leaf: .grad stays None"),
    "fixed": (FILL["replica"], PURPLE, "solid", "was a dead end, is not any more"),
    "newly reached": (FILL["original"], GREEN, "solid", "original parameter reached now, not before"),
    "added_node": (FILL["join"], GREEN, "solid", "node only in the second graph"),
    "removed_node": ("#f5f5f5", GREY, "dashed", "node only in the first graph"),
    "collapsed": (FILL["op"], "black", "solid", "3-D box: several nodes collapsed into one"),
    "recorded": (
        FILL["recorded"],
        "black",
        "solid",
        "backward function recorded by the first backward (create_graph=True)",
    ),
}
EDGE_LEGEND = {  # entry -> (colour, glyph, text)
    "": (GREY, "──▶", "the gradient flows this way (next_functions)"),
    "join": (ORANGE, "━━▶", "gradient edge into / out of ReduceAdd or Broadcast"),
    "missing": (MISSING, "┈┈⊣", "no edge: clone() made a fresh leaf (#19540)"),
    "added": (GREEN, "━━▶", "edge added (in the second graph only)"),
    "removed": (RED, "┄┄▶", "edge removed (in the first graph only)"),
}


def missing_from_one_slot(view: View) -> tuple[list[Edge], int | None]:
    """``view.edges`` with clone's missing edges drawn from one replica only, and that replica's slot.

    Drawn from every replica, the dotted lines crossed between the boxes and no copy could be traced to
    its original. When every slot has dead ends for the same originals, only the last slot's are kept,
    in module order (the legend says so); otherwise every edge stays and the slot is None.
    """
    by_id = {n.id: n for n in view.nodes}
    by_slot: dict[int | None, set[str]] = {}
    for e in view.edges:
        if e.status == "missing":
            by_slot.setdefault(by_id[e.src].slot, set()).add(e.dst)
    slots = {n.slot for n in view.nodes if n.kind == "replica"}
    alike = len({frozenset(dsts) for dsts in by_slot.values()}) == 1
    if len(by_slot) < 2 or None in by_slot or set(by_slot) != slots or not alike:
        return list(view.edges), None
    slot = max(by_slot)  # the rightmost box: its lines run down beside the ReduceAdd nodes, not under them

    def place(e: Edge) -> int:
        param = by_id[e.dst].param
        return param.index if param is not None else -1

    kept = sorted((e for e in view.edges if e.status == "missing" and by_id[e.src].slot == slot), key=place)
    return [e for e in view.edges if e.status != "missing"] + kept, slot


def entry(n: Node, recorded: frozenset[str] = frozenset()) -> str:
    """The legend entry (and fill colour) a node uses."""
    if n.id in recorded:
        return "recorded"
    if n.kind in ("original", "input") and not n.reached:
        return "unreached"
    if n.kind == "original":
        return "original"
    if n.kind == "replica":
        return "dead_end" if n.dead_end else "replica"
    return "input" if n.kind == "leaf" else n.kind


def edge_entry(e: Edge, by_id: dict[str, Node]) -> str:
    if e.status:
        return e.status
    return "join" if "join" in (by_id[e.src].kind, by_id[e.dst].kind) else ""


def _rows(views: list[View]) -> tuple[list[tuple], list[tuple[str, str, str]], bool]:
    """The legend's rows for ``views``: (fill, border, style, border width, text) per node entry used,
    (colour, glyph, text) per edge entry, each in the legend's own order; and whether there are boxes."""
    nodes: set[str] = set()
    edges: set[str] = set()
    boxes = False
    for view in views:
        by_id = {n.id: n for n in view.nodes}
        nodes |= {entry(n, view.recorded) for n in view.nodes}
        nodes |= {n.status for n in view.nodes if n.status in ("fixed", "newly reached")}
        nodes |= {f"{n.status}_node" for n in view.nodes if n.status in ("added", "removed")}
        nodes |= {"collapsed" for n in view.nodes if n.members > 1}
        edges |= {edge_entry(e, by_id) for e in view.edges}
        boxes = boxes or any(n.kind == "replica" for n in view.nodes)
    node_keys, edge_keys = [k for k in LEGEND if k in nodes], [k for k in EDGE_LEGEND if k in edges]
    slot = next((s for s in (missing_from_one_slot(v)[1] for v in views) if s is not None), None)
    joins = " / ".join(sorted({n.op for v in views for n in v.nodes if n.kind == "join" and n.op}))
    text = {k: LEGEND[k][3] for k in node_keys}
    text["join"] = f"{joins}: {JOIN.split(': ')[1]}" if joins else JOIN
    rows = [(*LEGEND[k][:3], 3 if LEGEND[k][1] in (GREEN, PURPLE) else 1, text[k]) for k in node_keys]
    edge_rows = []
    for key in edge_keys:
        colour, glyph, text = EDGE_LEGEND[key]
        text = f"gradient edge into / out of {joins}" if key == "join" and joins else text
        if key == "missing" and slot is not None:
            text += f"; drawn for replica {slot} only, every replica is the same"
        edge_rows.append((colour, glyph, text))
    return rows, edge_rows, boxes


BOXES = "a tinted box: one replica slot, its tint the device"


def legend_label(view: View) -> str:
    """The legend as a graphviz HTML-like table: the entries this view uses, in the legend's own order."""
    nodes, edges, boxes = _rows([view])
    rows = []
    for fill, border, style, width, text in nodes:
        dashed = ' STYLE="dashed"' if style == "dashed" else ""
        rows.append(
            f'<TR><TD BGCOLOR="{fill}" COLOR="{border}" BORDER="{width}"{dashed} WIDTH="28"> </TD>'
            f'<TD ALIGN="LEFT" BORDER="0">{escape(text)}</TD></TR>'
        )
    rows += [
        f'<TR><TD BORDER="0"><FONT COLOR="{colour}"><B>{glyph}</B></FONT></TD>'
        f'<TD ALIGN="LEFT" BORDER="0">{escape(text)}</TD></TR>'
        for colour, glyph, text in edges
    ]
    if boxes:
        rows.append(f'<TR><TD COLSPAN="2" ALIGN="LEFT" BORDER="0">{BOXES}</TD></TR>')
    return (
        '<<TABLE BORDER="1" CELLBORDER="1" CELLSPACING="3" CELLPADDING="2" COLOR="#9e9e9e">'
        '<TR><TD COLSPAN="2" BORDER="0"><B>legend</B></TD></TR>' + "".join(rows) + "</TABLE>>"
    )


def legend_html(views: Iterable[View]) -> str:
    """The legend as browser HTML, one line, for pictures drawn side by side without their own."""
    nodes, edges, boxes = _rows(list(views))
    items = [
        f'<span style="display:inline-block;width:22px;height:12px;background:{fill};'
        f'border:{width}px {style} {border};vertical-align:middle"></span>&nbsp;{escape(text)}'
        for fill, border, style, width, text in nodes
    ]
    items += [f'<b style="color:{colour}">{glyph}</b>&nbsp;{escape(text)}' for colour, glyph, text in edges]
    if boxes:
        items.append(escape(BOXES))
    spans = "".join(f'<span style="margin-right:18px;white-space:nowrap">{item}</span> ' for item in items)
    return f'<div style="font-size:12px;line-height:1.9"><b>legend</b>&nbsp; {spans}</div>'


def device_tint(device: str | None) -> str:
    if not device or not device.startswith("cuda"):
        return "#f2f2f2"
    index = int(device.partition(":")[2] or 0)
    return DEVICE_TINTS[index % len(DEVICE_TINTS)]
