"""Showing a graph: SVG in Jupyter when Graphviz is there, text with one sentence on how to get it when not.

Displaying never raises: without the ``graphviz`` package or the ``dot`` program it shows the text
form (``text.py``) and what to install; ``.svg()`` and ``.save()`` raise, with the same sentence.
"""

from __future__ import annotations

import base64
import re
import shutil
import subprocess
from functools import cached_property
from html import escape
from pathlib import Path
from typing import Sequence

from . import text as text_form
from .nodes import Edge, Node
from .view import MAX_NODES, View, make_view

NO_DOT = (
    "(This is the text form: Graphviz's `dot` program was not found. To see the picture, install it "
    "(`conda install -c conda-forge graphviz`, `sudo apt-get install graphviz` or `brew install graphviz`) "
    "and run the cell again.)"
)
NO_PACKAGE = (
    "(This is the text form: the `graphviz` Python package is missing. To see the picture, "
    "`pip install graphviz` and install Graphviz's `dot` program, then run the cell again.)"
)


_FORMAT = {"jupyter": "svg"}


def set_jupyter_format(fmt: str) -> str:
    """Show graphs in Jupyter as ``"svg"`` (the default) or ``"png"`` (for front ends that crop SVG,
    like VS Code; torchview #101 and ``graphviz.set_jupyter_format`` do the same). Returns the old one."""
    if fmt not in ("svg", "png"):
        raise ValueError(f"the Jupyter format is 'svg' or 'png', not {fmt!r}")
    old, _FORMAT["jupyter"] = _FORMAT["jupyter"], fmt
    return old


class GraphvizMissing(RuntimeError):
    """Raised by ``.svg()`` / ``.save()`` when the picture cannot be made; the message says what to install."""


DOT_SECONDS = 10.0  # the longest a drawing waits for dot's layout before it shows the text form instead


class LayoutTooSlow(GraphvizMissing):
    """Raised by ``.svg()`` / ``.save()`` when ``dot`` did not finish within ``DOT_SECONDS``."""


def _render(digraph_maker, fmt: str) -> bytes:
    """Run ``dot`` on the drawing, for at most ``DOT_SECONDS``; every way it can fail is one GraphvizMissing.

    The ``graphviz`` package only writes the DOT text; ``dot`` itself runs here, under a time limit
    (the package's ``pipe()`` has none), so no drawing keeps a notebook cell busy for minutes.
    """
    try:
        import graphviz  # noqa: F401  (needed to write the DOT text)
    except ImportError as err:
        raise GraphvizMissing(NO_PACKAGE) from err
    source = digraph_maker().source
    program = shutil.which("dot")
    if program is None:
        raise GraphvizMissing(NO_DOT)
    try:
        done = subprocess.run(
            [program, f"-T{fmt}"], input=source.encode(), capture_output=True, timeout=DOT_SECONDS
        )
    except subprocess.TimeoutExpired as err:  # subprocess.run has killed dot by now
        raise LayoutTooSlow(
            f"(This is the text form: Graphviz's `dot` did not lay this drawing out within {DOT_SECONDS:g} s. "
            "draw(collapse=True) or a smaller draw(max_nodes=...) gives a picture it can lay out.)"
        ) from err
    except OSError as err:
        raise GraphvizMissing(f"(This is the text form: Graphviz's `dot` failed: {err}.)") from err
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip() or f"exit status {done.returncode}"
        raise GraphvizMissing(f"(This is the text form: Graphviz's `dot` failed: {why}.)")
    return done.stdout


class Drawing:
    """One picture of a graph: ``.dot`` (DOT source), ``.text``, ``.svg()``, ``.save(path)``; shows itself."""

    def __init__(self, view: View, legend: bool = True, compact: bool = False) -> None:
        self.view, self.legend, self.compact = view, legend, compact
        self._pictures: dict[str, bytes | GraphvizMissing] = {}

    def digraph(self):
        """The ``graphviz.Digraph`` (needs the graphviz Python package, not ``dot``)."""
        from .dot import to_digraph

        return to_digraph(self.view, self.legend, self.compact)

    @cached_property
    def dot(self) -> str:
        """The DOT source: the same text for the same graph on every run."""
        return self.digraph().source

    @cached_property
    def text(self) -> str:
        return text_form.render(self.view)

    def _picture(self, fmt: str) -> bytes:
        """``dot``'s picture in ``fmt``, made once; a failure is kept too: dot never runs twice per display."""
        if fmt not in self._pictures:
            try:
                self._pictures[fmt] = _render(self.digraph, fmt)
            except GraphvizMissing as err:
                self._pictures[fmt] = err
        got = self._pictures[fmt]
        if isinstance(got, GraphvizMissing):
            raise type(got)(str(got))
        return got

    def svg(self) -> str:
        """The picture as SVG text; raises GraphvizMissing (saying what to install) without Graphviz."""
        return self._picture("svg").decode("utf-8")

    def png(self) -> bytes:
        """The picture as PNG bytes; raises GraphvizMissing (saying what to install) without Graphviz."""
        return self._picture("png")

    def save(self, path: str, format: str | None = None) -> str:
        """Write the picture to ``path`` (format from the suffix: .svg, .png, .pdf, .dot); returns the path."""
        fmt = format or (path.rsplit(".", 1)[-1] if "." in path else "svg")
        data = self.dot.encode() if fmt in ("dot", "gv") else self._picture(fmt)
        Path(path).write_bytes(data)
        return path

    def _repr_svg_(self) -> str | None:
        if _FORMAT["jupyter"] != "svg":
            return None
        try:
            return self.svg()
        except GraphvizMissing:
            return None

    def data_uri(self, fmt: str | None = None) -> str:
        """The picture as a ``data:`` URI (in the Jupyter format unless ``fmt``), for an ``<img>`` in HTML."""
        fmt = fmt or _FORMAT["jupyter"]
        kind = "png" if fmt == "png" else "svg+xml"
        return f"data:image/{kind};base64,{base64.b64encode(self._picture(fmt)).decode()}"

    def width_px(self) -> int:
        """The picture's natural width in CSS pixels (dot draws 72 pt to the inch, browsers 96 px)."""
        if _FORMAT["jupyter"] == "png":
            return int.from_bytes(self.png()[16:20], "big")  # the PNG header's width (dot's PNGs: 96 dpi)
        match = re.search(r'<svg width="([\d.]+)pt"', self.svg())
        return round(float(match.group(1)) * 4 / 3) if match else 0

    def html(self) -> str:
        """The SVG as an ``<img>`` no wider than the cell: JupyterLab 4 shows ``image/svg+xml`` as an
        ``<img>`` that no max-width confines, so a wide graph ran off the cell's right edge."""
        alt = escape(self.view.title.splitlines()[0] if self.view.title else "autograd graph")
        return f'<img alt="{alt}" style="max-width:100%;height:auto" src="{self.data_uri("svg")}">'

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        try:
            if _FORMAT["jupyter"] == "png":
                return {"image/png": base64.b64encode(self.png()).decode(), "text/plain": self.view.title}
            # text/html first in Jupyter's order (scaled to the cell); image/svg+xml for front ends and
            # tools that read the picture itself
            return {"text/html": self.html(), "image/svg+xml": self.svg(), "text/plain": self.view.title}
        except GraphvizMissing as err:
            return {"text/plain": f"{self.text}\n\n{err}"}

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"<Drawing: {self.view.title.splitlines()[0]}>"


class Drawable:
    """What graphs and diffs share: ``draw()``, ``.dot``, ``.text``, ``.svg()``, and showing themselves."""

    title: str
    # a sentence saying why there is nothing to draw: shown in place of the picture (a lone output
    # box) and of the text form; draw() still draws it, for whoever asks
    no_history: str | None = None

    def _drawn_parts(self) -> tuple[Sequence[Node], Sequence[Edge]]:
        raise NotImplementedError

    def _footer(self) -> list[str]:
        """Lines the text form adds after the tree."""
        return []

    def draw(
        self,
        collapse: bool | int | None = None,
        max_nodes: int | None = MAX_NODES,
        legend: bool = True,
        compact: bool = False,
        notes: dict[str, str] | None = None,
    ) -> Drawing:
        """A picture of the graph.

        ``collapse``: ``True`` or a depth merges each module's nodes into one per replica slot
        (``False``: never); ``None`` collapses only when there are more than ``max_nodes`` nodes.
        ``max_nodes=None`` draws everything. ``legend=False`` leaves the legend out; ``compact=True``
        writes only names in the boxes, for pictures shown side by side. ``notes``: node -> a
        sentence drawn in a note beside that node; the node as its id (``list(graph.nodes)`` lists
        them) or as the name printed in its box (``"ReduceAddCoalescedBackward"``, or in a compact
        drawing ``"ReduceAddCoalesced"``) when one drawn node has that name.
        """
        nodes, edges = self._drawn_parts()
        title = getattr(self, "short_title", self.title) if compact else self.title
        view = make_view(nodes, edges, title, collapse, max_nodes)
        view.footer = self._footer()
        drawn = {n.id for n in view.nodes}
        view.recorded = frozenset(getattr(self, "recorded", frozenset()) & drawn)
        view.remarks = {_note_target(key, view.nodes, drawn): text for key, text in (notes or {}).items()}
        return Drawing(view, legend, compact)

    @cached_property
    def _default(self) -> Drawing:
        return self.draw()

    @property
    def dot(self) -> str:
        """DOT source of the default drawing (deterministic: no ``id()`` in it)."""
        return self._default.dot

    @property
    def text(self) -> str:
        """The text form of the default drawing (what shows without ``dot``)."""
        return self._default.text

    def svg(self) -> str:
        return self._default.svg()

    def save(self, path: str, format: str | None = None) -> str:
        return self._default.save(path, format)

    def _repr_svg_(self) -> str | None:
        return None if self.no_history else self._default._repr_svg_()

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        if self.no_history:
            return {"text/plain": self.no_history}
        return self._default._repr_mimebundle_(include, exclude)

    def __str__(self) -> str:
        return self.no_history or self.text


def _note_target(key: str, nodes, drawn: set[str]) -> str:
    """The id of the node ``key`` names for ``draw(notes=)``: an id, or the name one drawn node shows."""
    if key in drawn:
        return key
    hits = []
    for n in nodes:
        first = n.label.splitlines()[0] if n.label else ""
        names = {first, n.op, re.sub(r"Backward\d*$", "", n.op or "") or None}
        if n.param is not None:
            names.add(n.param.name)
        if key in names:
            hits.append(n.id)
    if len(hits) == 1:
        return hits[0]
    if hits:
        raise KeyError(
            f"notes={key!r} names {len(hits)} nodes of this drawing; give one of their ids: {hits}"
        )
    raise KeyError(
        f"notes= names a node this drawing does not have: {key!r} (list(graph.nodes) lists the ids)"
    )
