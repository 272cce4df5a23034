"""Chapter 09's step-time figure draws each point's spread over the rounds: a bar from the fastest round
to the slowest, so a reader sees how far apart the three setups' rounds were."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
from matplotlib.collections import LineCollection  # noqa: E402

from dpteach.distributed import plots  # noqa: E402


def test_error_bars_span_the_fastest_to_the_slowest_round():
    rounds = [
        {"one": {32: 1e-3, 128: 2e-3}, "two": {32: 3e-3, 128: 4e-3}},
        {"one": {32: 5e-3, 128: 1.5e-3}, "two": {32: 2e-3, 128: 8e-3}},
        {"one": {32: 2e-3, 128: 3e-3}, "two": {32: 2.5e-3, 128: 6e-3}},
    ]
    medians = {k: {h: float(np.median([r[k][h] for r in rounds])) for h in (32, 128)} for k in ("one", "two")}
    fig = plots.step_times(medians, rounds=rounds)
    bars = [c for c in fig.axes[0].collections if isinstance(c, LineCollection)]
    spans = sorted((round(min(s[:, 1]), 6), round(max(s[:, 1]), 6)) for c in bars for s in c.get_segments())
    expected = sorted(
        (round(min(r[k][h] for r in rounds) * 1e3, 6), round(max(r[k][h] for r in rounds) * 1e3, 6))
        for k in medians
        for h in (32, 128)
    )
    assert spans == expected


def test_without_rounds_no_bars():
    fig = plots.step_times({"one": {32: 1e-3, 128: 2e-3}})
    assert not [c for c in fig.axes[0].collections if isinstance(c, LineCollection)]
