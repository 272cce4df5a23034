"""Two small SVG charts, drawn by hand: a line chart (the loss curve) and stacked bars (bytes, seconds).

Why not matplotlib: a widget redraws on every click, and a matplotlib figure takes tens of
milliseconds to render on an idle laptop and several hundred on a busy 2-core machine, where these
take well under one. The SVG is text, so a test reads the numbers back from it, and it needs no
library at all. Each chart carries its legend inside the picture.
"""

from __future__ import annotations

import math
from html import escape
from typing import Sequence

FONT = 'font-family="Helvetica,Arial,sans-serif"'
LEFT, RIGHT, TOP, BOTTOM = 52, 12, 30, 38  # margins in pixels: axis labels left and below, the title above


def nice_ticks(top: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values from 0 to at least ``top`` (1, 2 or 5 times a power of ten apart)."""
    if not top > 0 or not math.isfinite(top):
        top = 1.0
    raw = top / n
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return [i * step for i in range(int(math.ceil(top / step - 1e-9)) + 1)]


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1e6:
        return f"{v / 1e6:g}M"
    if abs(v) >= 1e3:
        return f"{v / 1e3:g}k"
    return f"{v:.3g}"


def _frame(
    width: int,
    height: int,
    title: str,
    xlabel: str,
    ylabel: str,
    ticks: Sequence[float],
    labels: Sequence[str] = (),
    below: int = 0,
) -> list[str]:
    """The picture's frame: title, axis labels, grid. ``below``: pixels added under the x label, for a legend
    kept off the plot."""
    h = height - TOP - BOTTOM
    y0 = TOP + h
    full = height + below
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{full}" viewBox="0 0 {width} {full}">',
        f'<rect width="{width}" height="{full}" fill="white"/>',
        f'<text x="{width / 2}" y="16" text-anchor="middle" font-size="12" {FONT}>{escape(title)}</text>',
        f'<text x="{LEFT + (width - LEFT - RIGHT) / 2}" y="{height - 6}" text-anchor="middle" font-size="11" '
        f"{FONT}>{escape(xlabel)}</text>",
        f'<text transform="translate(12 {TOP + h / 2}) rotate(-90)" text-anchor="middle" font-size="11" '
        f"{FONT}>{escape(ylabel)}</text>",
    ]
    for k, t in enumerate(ticks):  # ``labels``: what each tick says, where not its value
        y = y0 - h * t / ticks[-1]
        text = labels[k] if k < len(labels) else _fmt(t)
        out.append(f'<line x1="{LEFT}" x2="{width - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e0e0e0"/>')
        out.append(
            f'<text x="{LEFT - 4}" y="{y + 4:.1f}" text-anchor="end" font-size="10" {FONT}>{text}</text>'
        )
    out.append(f'<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{y0}" stroke="#616161"/>')
    return out


def off_axis(series: Sequence[tuple[str, Sequence[float], str, bool]], top: float, names=()) -> list[str]:
    """One line per series that leaves the axis: the first step above ``top``, then the first inf and nan.

    Series that leave it at the same steps share a line ("both lines: ..."); a series that stays on the
    axis is not named. ``names``: what to call each series (its label where not given).
    """
    tests = {
        f"above {_fmt(top)}": lambda v: math.isfinite(v) and v > top,
        "inf": math.isinf,
        "nan": math.isnan,
    }
    said: dict[str, list[str]] = {}
    for k, (label, values, _, _) in enumerate(series):
        firsts = {
            what: next((i for i, v in enumerate(values) if is_(v)), None) for what, is_ in tests.items()
        }
        # in the order they first happen: a diverging loss passes the axis' top, then float32's (inf), then nan
        found = sorted((i, what) for what, i in firsts.items() if i is not None)
        if found:
            (at, first), *rest = found
            text = ", ".join([f"{first} from step {at}", *(f"{what} from {i}" for i, what in rest)])
            said.setdefault(text, []).append(names[k] if k < len(names) else label)
    return [f"{'both lines' if len(who) == 2 else ' and '.join(who)}: {text}" for text, who in said.items()]


def line_chart(
    series: Sequence[tuple[str, Sequence[float], str, bool]],
    x_max: int,
    title: str,
    xlabel: str,
    ylabel: str,
    width: int = 470,
    height: int = 270,
    y_cap: float | None = None,
    names: Sequence[str] = (),
    log: bool = False,
    mark: tuple[int, str] | None = None,
) -> str:
    """Lines ``(label, values, colour, dashed)`` over x = 0, 1, 2, ...; a dot marks each line's last value.

    ``y_cap``: the y axis ends there; larger values, infinities and NaNs (a diverging run) are drawn on
    the top edge, and a red note under the legend says from which step each line is (``off_axis``),
    calling the lines by ``names`` (short names, one per series; the labels where not given). A chart
    with such a note, or on a log axis, has its legend and note under the x label, off the lines.
    ``log``: a log axis, one grid line per power of ten, from the smallest positive value to the largest
    finite one (``y_cap`` is then ignored; infinities and NaNs still go on the top edge).
    ``mark``: ``(step, label)``, a dashed vertical line at that step, its label beside it.
    """
    finite = [x for _, v, _, _ in series for x in v if math.isfinite(x)]
    top = max(finite, default=1.0)
    if log:
        positive = [x for x in finite if x > 0] or [1.0]
        lo = math.floor(math.log10(min(positive)))
        hi = max(lo + 1, math.ceil(math.log10(max(positive))))
        every = max(1, math.ceil((hi - lo) / 6))  # at most about seven labelled powers of ten
        hi = lo + every * math.ceil((hi - lo) / every)
        ticks = [float(e - lo) for e in range(lo, hi + 1, every)]
        labels = [f"1e{e}" if abs(e) > 2 else _fmt(10.0**e) for e in range(lo, hi + 1, every)]
        clipped = len(finite) < sum(len(v) for _, v, _, _ in series)
    else:
        clipped = len(finite) < sum(len(v) for _, v, _, _ in series) or (y_cap is not None and top > y_cap)
        ticks, labels = nice_ticks(min(top, y_cap) if y_cap is not None else top), []
    w, h = width - LEFT - RIGHT, height - TOP - BOTTOM
    x_max = max(x_max, 1, *(len(v) - 1 for _, v, _, _ in series))
    # a diverging run's lines climb through the top right, where the legend sits: there the legend and the
    # red note go under the x label, off the plot, so they never cover a line
    said = off_axis(series, 10 ** (lo + ticks[-1]) if log else ticks[-1], names) if clipped else []
    notes = ["off the axis, drawn on its top edge:", *said] if clipped else []
    outside = log or clipped
    below = 15 * (len(series) + len(notes)) + 4 if outside else 0

    def xy(i: int, v: float) -> tuple[float, float]:
        if not math.isfinite(v):  # inf and nan on the top edge
            up = ticks[-1]
        elif log:  # the power of ten above the axis' bottom; 0 (or less) on the bottom edge
            up = min(max(math.log10(v) - lo, 0.0), ticks[-1]) if v > 0 else 0.0
        else:
            up = min(v, ticks[-1])
        return LEFT + w * i / x_max, TOP + h - h * up / ticks[-1]

    out = _frame(width, height, title, xlabel, ylabel, ticks, labels, below)
    if mark is not None:  # under the lines, so they stay on top
        x = LEFT + w * mark[0] / x_max
        anchor, dx = ("end", -4) if mark[0] > x_max / 2 else ("start", 4)
        out.append(
            f'<line class="mark" x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{TOP + h}" stroke="#6a1b9a" '
            f'stroke-dasharray="3 3"/>'
        )
        out.append(
            f'<text class="mark" x="{x + dx:.1f}" y="{TOP + h - 8}" text-anchor="{anchor}" font-size="10" '
            f'fill="#6a1b9a" {FONT}>{escape(mark[1])}</text>'
        )
    for t in nice_ticks(x_max, 6):
        if t <= x_max:
            x = LEFT + w * t / x_max
            out.append(
                f'<text x="{x:.1f}" y="{TOP + h + 14}" text-anchor="middle" font-size="10" {FONT}>{t:g}</text>'
            )
    for k, (label, values, colour, dashed) in enumerate(series):
        dash = ' stroke-dasharray="6 4"' if dashed else ""
        if len(values):
            points = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(i, v) for i, v in enumerate(values)))
            out.append(
                f'<polyline class="series" data-label="{escape(label)}" points="{points}" fill="none" '
                f'stroke="{colour}" stroke-width="2"{dash}/>'
            )
            x, y = xy(len(values) - 1, values[-1])
            out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{colour}"/>')
        # the legend: top right, inside the plot; or under the x label, left-aligned, when kept off it
        ly, lx = (height + 10 + 15 * k, LEFT) if outside else (TOP + 12 + 15 * k, width - RIGHT - 210)
        out.append(
            f'<line x1="{lx}" x2="{lx + 22}" y1="{ly - 4}" y2="{ly - 4}" stroke="{colour}" stroke-width="2"{dash}/>'
        )
        out.append(f'<text x="{lx + 27}" y="{ly}" font-size="10" {FONT}>{escape(label)}</text>')
    for k, text in enumerate(notes):  # the red note, under the legend, off the plot
        out.append(
            f'<text class="off-axis" x="{LEFT}" y="{height + 10 + 15 * (len(series) + k)}" '
            f'font-size="10" fill="#b71c1c" {FONT}>{escape(text)}</text>'
        )
    out.append("</svg>")
    return "\n".join(out)


def bar_chart(
    categories: Sequence[str],
    stacks: Sequence[tuple[str, Sequence[float], str]],
    title: str,
    ylabel: str,
    notes: Sequence[str] = (),
    line: tuple[float, str] | None = None,
    width: int = 420,
    height: int = 270,
    empty: str = "",
) -> str:
    """Stacked bars: ``stacks`` are ``(label, one value per category, colour)``; ``notes`` go above each bar.

    ``line``: ``(value, label)`` for a dotted reference line across the chart. ``empty``: what the chart
    says across its middle when every bar is 0 (an empty axis alone reads as a failed drawing).
    """
    totals = [sum(s[1][i] for s in stacks) for i in range(len(categories))]
    w, h = width - LEFT - RIGHT, height - TOP - BOTTOM
    top = max([*totals, line[0] if line else 0])
    rows = (len(stacks) > 1) * sum(any(v > 0 for v in s[1]) for s in stacks) + bool(line)  # legend rows
    below = h - (13 * rows + 6) - (16 if notes else 2)  # room under the legend and the notes' line of text
    ticks = nice_ticks(max(top * 1.45, top * h / max(below, 0.3 * h)))  # the tallest bar clears the legend
    slot = w / max(1, len(categories))
    scale = h / ticks[-1]
    out = _frame(width, height, title, "", ylabel, ticks)
    for i, name in enumerate(categories):
        x, base = LEFT + slot * i + slot * 0.18, TOP + h
        for label, values, colour in stacks:
            v = values[i]
            if v > 0:
                out.append(
                    f'<rect class="bar" data-category="{escape(name)}" data-stack="{escape(label)}" '
                    f'data-value="{v}" x="{x:.1f}" y="{base - v * scale:.1f}" width="{slot * 0.64:.1f}" '
                    f'height="{v * scale:.1f}" fill="{colour}"/>'
                )
                base -= v * scale
        out.append(
            f'<text x="{x + slot * 0.32:.1f}" y="{TOP + h + 14}" text-anchor="middle" font-size="10" '
            f"{FONT}>{escape(name)}</text>"
        )
        if i < len(notes):
            out.append(
                f'<text x="{x + slot * 0.32:.1f}" y="{base - 4:.1f}" text-anchor="middle" font-size="10" '
                f"{FONT}>{escape(notes[i])}</text>"
            )
    legend = [
        (label, f'<rect x="{LEFT + 6}" y="{{y}}" width="10" height="10" fill="{colour}"/>')
        for label, values, colour in stacks
        if len(stacks) > 1 and any(v > 0 for v in values)
    ]
    if line:
        y = TOP + h - line[0] * scale
        out.append(
            f'<line x1="{LEFT}" x2="{width - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="black" '
            f'stroke-dasharray="2 3"/>'
        )
        legend.append(
            (
                line[1],
                f'<line x1="{LEFT + 4}" x2="{LEFT + 17}" y1="{{y5}}" y2="{{y5}}" stroke="black" '
                f'stroke-dasharray="2 3"/>',
            )
        )
    for k, (label, mark) in enumerate(legend):  # top left, inside the plot
        ly = TOP + 10 + 13 * k
        out.append(mark.format(y=ly - 8, y5=ly - 4))
        out.append(f'<text x="{LEFT + 20}" y="{ly}" font-size="10" {FONT}>{escape(label)}</text>')
    if empty and not any(totals):
        out.append(
            f'<text class="empty" x="{LEFT + w / 2:.1f}" y="{TOP + h / 2:.1f}" text-anchor="middle" '
            f'font-size="12" fill="#616161" {FONT}>{escape(empty)}</text>'
        )
    out.append("</svg>")
    return "\n".join(out)
