"""The text form of a view: a tree from the output down, for a machine without Graphviz's ``dot``.

Each line is a node; children are indented under their parent with ``├─`` / ``└─``, and a node
with a single child continues straight down. A node met a second time is shown once more as
``↑ name (above)`` and not expanded again. Dead ends and unreached originals are marked in words.
"""

from __future__ import annotations

from .nodes import Node, shape_text
from .view import View

MAX_LINES = 400


def _shape(n: Node) -> str:
    return "" if n.shape is None or n.kind in ("op", "join") else f"  ({shape_text(n.shape)})"


def describe(n: Node, recorded: frozenset[str] = frozenset()) -> str:
    """One node on one line: its name, where it lives, and what it means for the gradient."""
    name = n.id if n.kind == "join" and n.id.endswith("]") else n.label  # ReduceAddBackward[0.weight]
    text = name.replace("\n", ": ") + _shape(n)
    if n.kind == "op" and n.slot is not None:
        text += f"  [replica {n.slot}]"
    if n.id in recorded:
        text += "  (recorded by the first backward, create_graph=True)"
    elif n.kind == "join":
        text += "  ← joins the replicas to the original"
    if n.kind == "replica":
        text += "  ✗ DEAD END: .grad stops here" if n.dead_end else "  (not a leaf)"
    if n.kind in ("original", "input") and not n.reached:
        text += "  ✗ never reached: .grad stays None"
    if n.kind == "tensor":
        text += "  (not a leaf)"
    if n.status:
        text += f"  [{n.status}]"
    return text


def render(view: View) -> str:
    """The whole view as text: title, tree, then the nodes no path from the output reaches."""
    nodes = {n.id: n for n in view.nodes}
    kids: dict[str, list[str]] = {n.id: [] for n in view.nodes}
    missing: dict[str, list[str]] = {}
    has_parent: set[str] = set()
    status = {(e.src, e.dst): e.status for e in view.edges}
    marker = {"added": "[+] ", "removed": "[-] "}
    for e in view.edges:
        if e.status == "missing":
            missing.setdefault(e.src, []).append(e.dst)
        else:
            kids[e.src].append(e.dst)
            has_parent.add(e.dst)
    lines = [view.title, *view.notes, ""]
    seen: set[str] = set()

    def emit(nid: str, first: str, rest: str) -> None:
        """Print ``nid`` after ``first``; its children after ``rest``; single children continue the column."""
        while True:
            n = nodes[nid]
            if nid in seen:
                lines.append(f"{first}↑ {describe(n).split('  ')[0]} (above)")
                return
            seen.add(nid)
            lines.append(first + describe(n, view.recorded))
            if nid in view.remarks:
                lines.append(f"{rest}   note: {view.remarks[nid]}")
            for dst in missing.get(nid, ()):
                lines.append(f"{rest}   ⊣ no edge to {nodes[dst].label} (clone made a fresh leaf)")
            children = kids[nid]
            if len(children) == 1 and children[0] not in seen:
                nid, first = children[0], rest + marker.get(status[(nid, children[0])], "")
                continue
            for i, child in enumerate(children):
                last = i == len(children) - 1
                tag = marker.get(status[(nid, child)], "")
                emit(child, rest + ("└─ " if last else "├─ ") + tag, rest + ("   " if last else "│  "))
            return

    for n in view.nodes:
        if n.id not in has_parent and n.id not in seen and (n.kind == "output" or kids[n.id]):
            emit(n.id, "", "")
    if len(lines) > MAX_LINES:
        lines[MAX_LINES:] = [
            f"… {len(lines) - MAX_LINES} more lines of tree (draw(collapse=True) shortens it)"
        ]
    lonely = [n for n in view.nodes if n.id not in seen and n.kind != "more"]
    if lonely:
        lines += ["", "Not reached from the output:", *("  " + describe(n) for n in lonely)]
    if view.footer:
        lines += ["", *view.footer]
    return "\n".join(lines)
