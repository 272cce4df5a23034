"""The pictures the widgets show, as HTML snippets: charts (``charts.py``) and graphs (Graphviz's SVG).

Every picture is an ``<img>`` with a data URI inside an ``HTML`` widget, so ipywidgets 7 and 8 show
it the same way and a test can read it back from ``widget.value`` (``decode_img``). When Graphviz
is missing the graph shows as text, with one sentence on what to install.
"""

from __future__ import annotations

import base64
import math
import re
from functools import lru_cache
from html import escape

from ..measure.costs import OP_COLOURS  # one colour per copying operation, as in the chapters' figures
from .charts import bar_chart, line_chart

BLUE, ORANGE = "#1565c0", "#ef6c00"


def img(svg: str, alt: str) -> str:
    """An ``<img>`` tag holding an SVG picture as a data URI."""
    data = base64.b64encode(svg.encode()).decode()
    return (
        f'<img alt="{escape(alt)}" style="max-width:100%;height:auto" src="data:image/svg+xml;base64,{data}">'
    )


def fitted_img(svg: str, alt: str) -> str:
    """An autograd graph scaled to the output's width, with no height cap, and never enlarged.

    It shrinks no further than the width at which its node labels are still ``MIN_LABEL_PX`` tall (as
    ``graph.compare`` does for side-by-side pictures): a wider graph (8 replicas) scrolls sideways
    from there instead of turning to dots, and opens scrolled to its middle, where the title and the
    output node are (a marker with CSS ``scroll-initial-target``; a browser without it opens at the
    left edge, as before). A two-slot graph fits a 1,000 px window without scrolling.
    """
    from ..graph.compare import MIN_LABEL_PX
    from ..graph.dot import NODE

    match = re.search(r'<svg width="([\d.]+)pt"', svg)
    natural = float(match.group(1)) * 4 / 3 if match else 0.0  # dot draws in pt, browsers in px
    label_px = float(NODE["fontsize"]) * 4 / 3
    floor = f"min-width:{round(natural * MIN_LABEL_PX / label_px)}px;" if natural else ""
    limit = f"max-width:{round(natural)}px;" if natural else "max-width:100%;"
    data = base64.b64encode(svg.encode()).decode()
    # one grid cell holds the picture and, over its middle, the marker the scroll box opens at
    middle = (
        '<span style="grid-area:1/1;justify-self:center;width:1px;height:1px;'
        'scroll-initial-target:nearest;scroll-snap-align:center"></span>'
    )
    return (
        f'<div style="max-width:100%;overflow-x:auto"><div style="display:grid"><img alt="{escape(alt)}" '
        f'style="grid-area:1/1;width:100%;{limit}{floor}height:auto" src="data:image/svg+xml;base64,{data}">'
        f"{middle}</div></div>"
    )


def decode_img(html: str) -> str | None:
    """The SVG text of the first data-URI image in ``html``; None without one (for tests)."""
    start = html.find('src="data:image/svg+xml;base64,')
    if start < 0:
        return None
    rest = html[start + 31 :]
    return base64.b64decode(rest[: rest.index('"')]).decode()


def note(text: str) -> str:
    return f'<div style="color:#b71c1c">{escape(text)}</div>'


APART = 0.01  # the loss chart marks the first step where the two runs' losses differ by more than this


def drift_step(losses, reference, apart: float = APART) -> int | None:
    """The first step where the two losses differ by more than ``apart`` of one device's; None if none."""
    for i, (a, b) in enumerate(zip(losses, reference)):
        if math.isfinite(a) and math.isfinite(b) and abs(a - b) > apart * abs(b):
            return i
    return None


def loss_curve(losses, reference, strategy: str, steps: int) -> str:
    """The DataParallel run's loss against the one-device reference, step by step.

    A run whose loss passes 3 times its first (a learning rate too large) is drawn on a log axis, so
    both lines stay in sight as they blow up, and a dashed line marks the step from which the two
    differ by more than 1%: on a log axis a gap of tens of percent is a hair's breadth."""
    cap = 3 * max(reference[0], losses[0]) if reference and losses else None
    diverged = cap is not None and any(not v <= cap for v in (*losses, *reference))
    apart = drift_step(losses, reference) if diverged else None
    svg = line_chart(
        [
            ("one device (the reference)", reference, BLUE, False),
            (f"DataParallel, strategy={strategy!r}", losses, ORANGE, True),
        ],
        steps,
        "the original model's loss against one device's" + (" (log scale)" if diverged else ""),
        "SGD step",
        "training loss (MSE)",
        y_cap=cap,
        names=("one device", "DataParallel"),  # the red note's names for the lines of a diverging run
        log=diverged,
        mark=(apart, f"from step {apart} the losses differ by over {APART:.0%}")
        if apart is not None
        else None,
    )
    return img(svg, f"loss curve under strategy {strategy}")


def human(n: float) -> str:
    """Bytes as a learner reads them: 1.3 kB, 4.2 MB."""
    for unit in ("B", "kB", "MB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def _op_label(op: str, costs) -> str:
    """A legend entry of the bytes chart: the copying operation, then the bars it is part of ("clone op:
    clone, rewire bars"), so that a colour is never read as a strategy's."""
    users = [c.strategy for c in costs if c.bytes_by_op.get(op, 0)]
    bars = "every bar" if len(users) == len(costs) > 1 else f"{', '.join(users)} bar{'s' * (len(users) != 1)}"
    return f"{op} op: {bars}"


def cost_charts(costs, model_bytes: int, slots: int, reference_s: float | None) -> str:
    """Bytes each strategy copies in one step, stacked by operation: the one chart the cost explorer draws.

    The bytes are counted and repeat, so they are the bars; a step's time does not repeat, so it is never
    drawn (a bar of timing noise would be the largest thing on the page). ``reference_s`` is unused: the
    times stand as text in ``tables.cost_table``, labelled "this run", with their spread."""
    names = [c.strategy for c in costs]
    ops = sorted(
        {op for c in costs for op in c.bytes_by_op},
        key=lambda op: list(OP_COLOURS).index(op) if op in OP_COLOURS else len(OP_COLOURS),
    )
    # The colours are operations', not strategies': "rewire" replicates by cloning as "clone" does, so its
    # bar is the clone operation's colour. The legend names the operation and the bars it appears in.
    stacks = [
        (_op_label(op, costs), [c.bytes_by_op.get(op, 0) for c in costs], OP_COLOURS.get(op, "#bdbdbd"))
        for op in ops
    ]
    notes = [f"{human(c.bytes)} · {c.bytes / model_bytes:.1f}×" for c in costs]
    extra = f"one model copy per extra slot ({human(model_bytes * (slots - 1))})" if slots > 1 else None
    chart = bar_chart(
        names,
        stacks,
        f"bytes copied per step, {slots} slot{'s' * (slots != 1)} (by operation)",
        "bytes",
        notes,
        (model_bytes * (slots - 1), extra) if extra else None,
        empty="no copies: one slot runs the model itself" if slots == 1 else "",
    )
    return img(chart, "bytes moved per strategy")


@lru_cache(maxsize=64)
def _svg_of_dot(dot: str) -> str:
    import graphviz  # the package only builds the command line; `dot` does the layout

    return graphviz.Source(dot).pipe(format="svg", encoding="utf-8")


def graph_svg(graph) -> str:
    """The graph's SVG, cached by its DOT source (deterministic), so an unchanged graph costs no ``dot`` run.

    Raises ``dpteach.graph.GraphvizMissing`` (its message says what to install) without Graphviz.
    """
    try:
        return _svg_of_dot(graph.dot)
    except (
        Exception
    ):  # no graphviz package, no `dot`, or dot failed: the graph's own svg() says which, or works
        return graph.svg()


def graph_html(graph, svg: str | None = None, alt: str = "autograd graph") -> str:
    """The graph as an ``<img>`` (SVG) fitted to the output's width (``fitted_img``), or its text form
    and one sentence on what to install."""
    from ..graph import GraphvizMissing

    try:
        svg = graph_svg(graph) if svg is None else svg
    except GraphvizMissing as err:
        return f"<pre style='font-size:11px'>{escape(graph.text)}</pre>{note(str(err))}"
    return fitted_img(svg, alt)
