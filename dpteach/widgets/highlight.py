"""Marking nodes and edges on a drawn graph (Graphviz's SVG) without laying it out again.

The gradient-flow stepper shows one backward node at a time on the same picture. Re-running
``dot`` with other attributes could move nodes between steps; restyling the SVG keeps every node
where it was, and costs no ``dot`` run. Graphviz writes each node and edge as
``<g class="node|edge"><title>NAME</title>...</g>`` (an edge's title is ``tail->head``), and
dpteach's node ids are those names, so a node is found by its id.

Legend (drawn into the picture as one line at the top, by ``caption``):

=====================  ======================================================
thick teal border      the node that runs now
thick teal arrow       a gradient it hands on
thin teal border       a node that has run already
=====================  ======================================================
"""

from __future__ import annotations

import re
from html import escape, unescape
from typing import Collection

TEAL = "#00a5b8"  # no other entry of dpteach.graph.dot's legend uses it
_GROUP = re.compile(r'(<g id="[^"]*" class="(node|edge)">\s*<title>)(.*?)(</title>)(.*?)(</g>)', re.S)
_SHAPE = re.compile(r"<(polygon|path|ellipse|polyline)\b[^>]*>")
_VIEWBOX = re.compile(
    r'<svg width="([\d.]+)pt" height="([\d.]+)pt"\s+viewBox="([-\d.]+) ([-\d.]+) ([\d.]+) ([\d.]+)"'
)
CAPTION_PT = 18.0

LEGEND = (
    ("thick border", "the node that runs now"),
    ("thick arrow", "a gradient it hands on"),
    ("thin border", "has run already"),
)


def _restyle(shape: str, width: float, fill: bool) -> str:
    shape = re.sub(r' stroke-width="[^"]*"', "", shape)  # a join node or a dead end has its own width already
    shape = re.sub(r' stroke="[^"]*"', f' stroke="{TEAL}" stroke-width="{width}"', shape, count=1)
    if fill:
        shape = re.sub(r' fill="(?!none)[^"]*"', f' fill="{TEAL}"', shape, count=1)
    return shape


def highlight(
    svg: str,
    current: Collection[str] = (),
    edges: Collection[tuple[str, str]] = (),
    done: Collection[str] = (),
) -> str:
    """``svg`` with the ``current`` nodes, the ``edges`` (``(src, dst)`` ids) and the ``done`` nodes marked."""
    current, done, edges = set(current), set(done), {tuple(e) for e in edges}

    def mark(m: re.Match) -> str:
        kind, name, body = m.group(2), unescape(m.group(3)), m.group(5)
        if kind == "node" and (name in current or name in done):
            width = 5 if name in current else 2
            body = _SHAPE.sub(lambda s: _restyle(s.group(0), width, False), body, count=1)  # the border only
        elif kind == "edge" and tuple(name.split("->", 1)) in edges:
            body = _SHAPE.sub(
                lambda s: _restyle(s.group(0), 3.5, s.group(1) == "polygon"), body
            )  # line and head
        return m.group(1) + m.group(3) + m.group(4) + body + m.group(6)

    return _GROUP.sub(mark, svg)


def marked(svg: str) -> dict[str, set[str]]:
    """Which names carry each mark in a highlighted SVG: ``{"current", "done", "edges"}`` (for tests)."""
    out: dict[str, set[str]] = {"current": set(), "done": set(), "edges": set()}
    for m in _GROUP.finditer(svg):
        kind, name, body = m.group(2), unescape(m.group(3)), m.group(5)
        first = _SHAPE.search(body)
        if not first or f'stroke="{TEAL}"' not in first.group(0):
            continue
        if kind == "edge":
            out["edges"].add(name)
        else:
            out["current" if 'stroke-width="5"' in first.group(0) else "done"].add(name)
    return out


CHAR_PT = 6.2  # a generous average width of one 11 pt Helvetica character, in the SVG's points
LINE_PT = 14.0


def caption(svg: str, text: str) -> str:
    """``svg`` with ``text`` drawn above the picture, wrapped to the picture's width (the viewBox grows
    to make room): one long line was clipped at the viewBox's right edge ("has run alrea")."""
    import textwrap

    m = _VIEWBOX.search(svg)
    if m is None:
        return svg
    w, h, x0, y0, vw, vh = (float(v) for v in m.groups())
    width = max(20, int((vw - 12) / CHAR_PT))
    lines: list[str] = []
    for part in text.split(" · "):  # break between the legend's entries, inside one only if it must
        if lines and len(lines[-1]) + 3 + len(part) <= width:
            lines[-1] += " · " + part
        else:
            lines += textwrap.wrap(part, width=width) or [""]
    grow = CAPTION_PT + LINE_PT * (len(lines) - 1)
    scale = w / vw if vw else 1.0  # width/height in pt keep their ratio to the viewBox
    grown = (
        f'<svg width="{w}pt" height="{h + grow * scale:.2f}pt"\n viewBox="{x0} {y0 - grow} {vw} {vh + grow}"'
    )
    spans = "".join(
        f'<tspan x="{x0 + 6}" y="{y0 - grow + 13 + LINE_PT * i}">{escape(t)}</tspan>'
        for i, t in enumerate(lines)
    )
    line = f'<text font-family="Helvetica,sans-Serif" font-size="11" fill="{TEAL}">{spans}</text>'
    head_end = svg.index(">", m.end()) + 1
    return svg[: m.start()] + grown + svg[m.end() : head_end] + line + svg[head_end:]


def legend_line() -> str:
    """The highlight's legend in one line, as ``caption`` draws it."""
    return "teal marks the backward pass: " + " · ".join(f"{what} = {meaning}" for what, meaning in LEGEND)
