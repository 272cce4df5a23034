"""The charts' notes stay readable: the bar chart's legend (top left, inside the plot) never collides with
the tallest bar's note, and the loss chart's red off-axis note, rendered, lies under its axes, off the
lines, and inside the picture."""

import math
import re

import pytest

from dpteach.widgets import TrainingLab
from dpteach.widgets.charts import bar_chart
from dpteach.widgets.pictures import decode_img, loss_curve


@pytest.mark.parametrize("model", [17_668, 4_214_788])  # the cost explorer's widths 64 and 1024
@pytest.mark.parametrize("slots", [1, 2, 8])
def test_the_tallest_note_sits_below_the_legend(slots, model):
    clone, broadcast = slots * model, (slots - 1) * model
    svg = bar_chart(
        ["clone", "rewire", "broadcast"],
        [
            ("broadcast", [0, 0, broadcast], "blue"),
            ("clone", [clone, clone, 0], "red"),
            ("gather", [1_280] * 3, "grey"),
        ],
        "bytes",
        "bytes",
        notes=[f"{clone / 1e3:.1f} kB · {slots}.0×"] * 3,
        line=((slots - 1) * model, "one model copy per extra slot"),
    )
    legend_bottom = max(float(y) for y in re.findall(r'<text x="72" y="([\d.]+)" font-size="10"', svg))
    bar_tops = [float(y) for y in re.findall(r'<rect class="bar"[^>]* y="([\d.]+)"', svg)]
    note_top = min(bar_tops) - 4 - 10  # a note's baseline is 4 px above its bar; its text is 10 px high
    assert note_top > legend_bottom + 4, (note_top, legend_bottom)  # 3 px of descenders, 1 px of air


def _render(chromium, svg: str) -> dict:
    """The rendered boxes (getBBox, in the chart's pixels) of the red note's lines and of the axes: the
    union of the y axis and the grid lines."""
    page = chromium.new_page()
    try:
        page.set_content(f"<body style='margin:0'>{svg}</body>")
        return page.evaluate(
            """() => {
            const box = e => { const b = e.getBBox(); return [b.x, b.y, b.x + b.width, b.y + b.height]; };
            const axes = [...document.querySelectorAll('line[stroke="#e0e0e0"], line[stroke="#616161"]')].map(box);
            return {notes: [...document.querySelectorAll('text.off-axis')].map(box),
                    axes: [Math.min(...axes.map(b => b[0])), Math.min(...axes.map(b => b[1])),
                           Math.max(...axes.map(b => b[2])), Math.max(...axes.map(b => b[3]))]};
        }"""
        )
    finally:
        page.close()


def test_the_off_axis_note_sits_under_the_axes_inside_the_picture(chromium):
    """Rendered in Chromium, every line of the red note lies under the axes (so it covers no line), within
    their width and inside the picture, even in the widest case the explorer can make: 300 steps
    (three-digit step numbers) and the two lines leaving at different steps."""
    lab = TrainingLab("rewire", slots=2, lr=10**-0.2, steps=60)
    lab.run()
    worst = [0.2] * 120 + [1e3] * 109 + [math.inf] * 4 + [math.nan] * 68
    cases = [
        loss_curve(lab.losses, lab.reference_losses, lab.strategy, lab.steps),
        loss_curve([*worst[1:], math.nan], worst, "broadcast", 300),
    ]
    for html in cases:
        svg = decode_img(html)
        found = _render(chromium, svg)
        x0, y0, x1, y1 = found["axes"]
        height = float(re.search(r'<svg [^>]*height="([\d.]+)"', svg).group(1))
        assert len(found["notes"]) >= 2, svg  # the heading and at least one line
        for left, top, right, bottom in found["notes"]:
            assert x0 <= left and right <= x1 and y1 <= top and bottom <= height, (found, svg)
