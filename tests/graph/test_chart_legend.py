"""The bar chart's legend (top left, inside the plot) never collides with the tallest bar's note."""

import re

import pytest

from dpteach.widgets.charts import bar_chart


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
