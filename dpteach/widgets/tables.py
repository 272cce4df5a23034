"""The tables the widgets show, as HTML: gradient norms, the gradients one backward node hands on, costs.

Plain strings, so tests read them and a notebook can show them without widgets
(``IPython.display.HTML(grad_table(lab))``).
"""

from __future__ import annotations

import math
from html import escape

RED, GREEN, GREY = "#c62828", "#2e7d32", "#757575"
CSS = "border-collapse:collapse;font-size:12px;font-family:Helvetica,Arial,sans-serif"
CELL = "padding:2px 8px;border-bottom:1px solid #e0e0e0;text-align:right"
LINES = "line-height:1.4"


def _table(head: list[str], rows: list[list[str]], caption: str) -> str:
    th = "".join(f'<th style="{CELL};text-align:center">{h}</th>' for h in head)
    body = "".join("<tr>" + "".join(f'<td style="{CELL}">{c}</td>' for c in r) + "</tr>" for r in rows)
    return (
        f'<div style="{LINES}"><table class="dpteach-table" style="{CSS}"><caption style="caption-side:top;'
        f'text-align:left;font-size:12px;padding:2px 0">{caption}</caption><tr>{th}</tr>{body}</table></div>'
    )


def lines(html: str) -> str:
    """``html`` with ordinary line spacing (an HTML widget sets every line 28 px high, a widget row's height)."""
    return f'<div style="{LINES}">{html}</div>'


def _shape(shape) -> str:
    return "scalar" if not shape else "×".join(map(str, shape))


def _norm(v: float) -> str:
    """A gradient norm: four decimals, or powers of ten once a diverging run makes it huge."""
    return f"{v:.4f}" if not math.isfinite(v) or abs(v) < 1e4 else f"{v:.4e}"


def scrolled(html: str) -> str:
    """``html`` in a box that scrolls sideways where it is wider than the page (a table of 8 replicas)."""
    return f'<div style="max-width:100%;overflow-x:auto">{html}</div>'


def grad_table(lab) -> str:
    """Each original parameter's ``.grad`` norm under DataParallel, one device's at the same weights (like for
    like, however far the two runs have parted), and each replica's own."""
    rows = lab.grad_rows()
    slots = len(rows[0].replicas) if rows else 0
    head = ["parameter", "shape", "one device ‖grad‖<br>(same weights)", "original<br>‖grad‖"]
    head += [f"replica {i}<br>own ‖grad‖" for i in range(slots)]
    out = []
    for r in rows:
        if r.original is None:
            original = f'<b style="color:{RED}">None</b>'
        else:
            colour = GREEN if r.matches else RED
            original = f'<span style="color:{colour}">{_norm(r.original)}</span>'
        replicas = [
            f'<span style="color:{GREY}">passed on</span>' if g is None else _norm(g) for g in r.replicas
        ]
        out.append(
            [f"<code>{escape(r.name)}</code>", _shape(r.shape), _norm(r.reference), original, *replicas]
        )
    numbers = [r.reference for r in rows] + [r.original for r in rows if r.original is not None]
    node = {"rewire": "one ReduceAddBackward per parameter", "broadcast": "BroadcastBackward"}.get(
        getattr(lab, "strategy", ""), "the join node"
    )
    if not all(math.isfinite(v) for v in numbers):
        why = (
            "the gradients are no longer finite (inf or nan): the loss diverged, "
            "and nothing can be compared any more"
        )
    elif any(r.original is None for r in rows):
        why = (
            "the original's .grad is <b>None</b>: the gradients stopped in the replicas' own .grad, "
            "which nobody reads (#19540)"
        )
    elif slots and all(g is None for r in rows for g in r.replicas):
        agree = all(r.matches for r in rows)
        why = f"every replica passed its gradient on, through {node}; the original's " + (
            "norm agrees with one device's" if agree else "norm <b>differs</b> from one device's (in red)"
        )
    else:
        why = "the original's gradient norm against one device's"
    return scrolled(_table(head, out, f"after step {lab.step_count}'s backward: {why}"))


def handoff_table(step) -> str:
    """What one backward node received, and which gradient it handed to which node."""
    if any(g.source for g in step.received):  # a join: one row per replica parameter's gradient
        rows = [["received", f"← {escape(g.source)}", str(g)] for g in step.received]
    else:
        rows = [["received", "", "<br>".join(map(str, step.received)) or "—"]]
    for h in step.handoffs:
        rows.append(
            ["hands on", f"→ {escape(h.label)}", "no gradient (undefined)" if h.grad is None else str(h.grad)]
        )
    if not step.handoffs and step.kind != "output":
        rows.append(["hands on", "nothing: a leaf", "its .grad holds the gradient"])
    return _table(["", "from / to", "gradient (shape, norm)"], rows, f"<b>{escape(step.label)}</b>")


def _small(text: str) -> str:
    """A figure that stands beside the ranking, not in it: this run's time, small and grey."""
    return f'<small style="color:{GREY}">{escape(text)}</small>'


def fold(summary: str, html: str) -> str:
    """``html`` folded under a line that opens it (closed at first, in the widget and in its still)."""
    return (
        f'<details><summary style="font-size:12px;color:{GREY}">{escape(summary)}</summary>{html}</details>'
    )


def cost_table(lab, modelled: bool = True) -> str:
    """The strategies ranked by bytes copied (counted), then by the cost model (modelled; left out with
    ``modelled=False``). This run's median time per step and its middle half are never in the ranking's
    table: they stand folded under it, "show this run's times" (no fold for a lab made with ``timed=False``)."""
    from .cost import MODEL_STRATEGY, tied_ranks

    order = lab.by_bytes()
    rows = [
        [
            rank,  # equal bytes share a rank, marked "="
            f"<code>{escape(c.strategy)}</code>",
            f"{c.bytes:,}",
            escape(c.by_op()),
            f"{c.bytes / lab.model_bytes:.1f}×",  # as the bars above it round
        ]
        for rank, c in zip(tied_ranks(c.bytes for c in order), order)
    ]
    counted = _table(
        ["rank", "strategy", "bytes copied", "by operation", "× model size"],
        rows,
        f"dpteach's strategies, ranked by bytes (counted, exact), one step, {lab.slots} slot{'s' * (lab.slots != 1)}; "
        f"model: {lab.model_bytes:,} bytes of parameters",
    )
    if getattr(lab, "timed", True) and lab.costs:  # the times: beside the ranking, folded, never in it
        timed = [*order, *([lab.reference] if lab.reference is not None else [])]
        times = _table(
            ["", "time per step"],
            [[escape(c.strategy), _small(c.shown(lab.budget_s))] for c in timed],
            _small("this run's time per step, on this machine: noisy, it ranks nothing"),
        )
        counted += fold("show this run's times", times)
    if not modelled:
        return scrolled(counted)
    modelled_table = _table(
        [
            "rank",
            "wrapper",
            f"per step, modelled ({lab.slots} × {escape(lab.gpu)})",
            "assumed thread starts",
            "without them",
        ],
        [[escape(cell) for cell in row] for row in lab.modelled_rows()],
        f"torch's DataParallel against DDP, ranked by the cost model: {lab.slots} × {escape(lab.gpu)}, "
        f"modelled; its DataParallel is torch.nn.DataParallel (strategy <code>{MODEL_STRATEGY}</code>)",
    )
    return scrolled(counted) + scrolled(modelled_table)
