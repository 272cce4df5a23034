"""The step profile (``dpteach.measure.profile``: each move's share, strategies taken in turns) and how
chapter 06 times.

The seconds are never asserted (they are the learner's own figure); what is asserted is how they are
taken and drawn: the strategies' steps alternate, a share is taken within its own step, the spread
is the middle half of the steps. Chapter 06 no longer draws the shares (a timing taught no lesson
that repeats); the profile stays library API (docs/library.md). Cells are found by their tags.
"""

from __future__ import annotations

import gc
import re
from pathlib import Path

import nbformat
import pytest
import torch
from torch import nn

from dpteach.measure import costs, profile

ROOT = Path(__file__).resolve().parents[2]
CELLS = nbformat.read(ROOT / "notebooks" / "06_the_cost_of_copies.ipynb", as_version=4).cells


def tagged(tag: str) -> int:
    return next(i for i, c in enumerate(CELLS) if tag in c.metadata.get("tags", []))


def make_model():
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))


def test_profile_in_turns_gives_every_strategy_its_steps_and_bytes():
    model, x = make_model(), torch.randn(8, 8)
    profiles = profile.profile_in_turns(model, x, ["cpu", "cpu"], repeats=3, warmup=1)
    assert list(profiles) == ["clone", "rewire", "broadcast"]
    for name, p in profiles.items():
        assert isinstance(p, profile.StepProfile) and p.strategy == name
        assert len(p.steps) == 3 and all(set(s) == set(profile.PHASES) for s in p.steps)
        model.zero_grad()
        assert (
            p.bytes_by_op == costs.step_traffic(model, x, ["cpu", "cpu"], name).by_op()
        )  # counted, not timed


def test_the_strategies_steps_are_taken_in_turns(monkeypatch):
    order = []

    def fake(module, x, slots, strategy, loss_fn):
        order.append(strategy)
        return {p: 1.0 for p in profile.PHASES}, {}

    monkeypatch.setattr(profile, "_timed_step", fake)
    profiles = profile.profile_in_turns(make_model(), torch.randn(4, 8), ["cpu"] * 2, repeats=2, warmup=1)
    assert order == ["clone", "rewire", "broadcast"] * 3  # a, b, c, a, b, c: noise falls on all alike
    assert all(len(p.steps) == 2 for p in profiles.values())  # the warm-up round is not kept


def test_profile_in_turns_times_without_the_garbage_collector_and_restores_it(monkeypatch):
    seen = []

    def fake(module, x, slots, strategy, loss_fn):
        seen.append(gc.isenabled())
        return {p: 1.0 for p in profile.PHASES}, {}

    monkeypatch.setattr(profile, "_timed_step", fake)
    profile.profile_in_turns(make_model(), torch.randn(4, 8), ["cpu"] * 2, ["broadcast"], repeats=1)
    assert seen and not any(seen) and gc.isenabled()


def test_a_share_is_taken_within_its_own_step():
    fast = {"scatter": 1.0, "replicate": 2.0, "parallel_apply": 3.0, "gather": 0.0, "backward": 4.0}
    slow = {p: 5 * s for p, s in fast.items()}  # a busy moment: the whole step five times slower
    p = profile.StepProfile("broadcast", ["cpu", "cpu"], steps=[fast, slow, fast])
    shares = p.shares()
    assert shares["backward"] == profile.Share(0.4, 0.4, 0.4)  # a uniformly slow step moves no share
    assert shares["replicate"].median == pytest.approx(0.2) and shares["gather"].median == 0.0


def test_the_spread_of_a_share_is_the_middle_half_of_the_steps():
    steps = [
        {**{p: 0.0 for p in profile.PHASES}, "replicate": r, "backward": 1 - r}
        for r in (0.1, 0.2, 0.3, 0.4, 0.5)
    ]
    share = profile.StepProfile("clone", ["cpu"], steps=steps).shares()["replicate"]
    assert share == pytest.approx(profile.Share(0.2, 0.3, 0.4))  # first quartile, median, third quartile
    one = profile.StepProfile("clone", ["cpu"], steps=steps[:1]).shares()["replicate"]
    assert one == pytest.approx(profile.Share(0.1, 0.1, 0.1))  # one step: no spread


def test_plot_shares_draws_a_bar_per_move_and_strategy_with_its_whisker_in_plain_text():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    from matplotlib import cbook, text

    steps = [{p: 1.0 + k * (p == "backward") for p in profile.PHASES} for k in range(4)]
    profiles = {s: profile.StepProfile(s, ["cpu", "cpu"], steps=steps) for s in ("clone", "broadcast")}
    ax = profile.plot_shares(profiles, title="t")
    assert len(ax.patches) == 2 * len(profile.PHASES)  # one bar per strategy and move
    assert len(ax.containers) == 2 * 2  # each strategy: its bars and their whiskers
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["clone", "broadcast"]  # no step times: on a busy CPU they can rank either way
    ax.figure.canvas.draw()
    shown = [t.get_text() for t in ax.figure.findobj(text.Text) if t.get_text()]
    assert "middle half" in ax.get_ylabel() and not [s for s in shown if cbook.is_math_text(s)]
    assert not [s for s in shown if re.search(r"\d\s*(ms|µs|s)\b", s)]  # no time anywhere in the figure
    assert profile.plot_shares(profiles["clone"]).get_legend().get_texts()[0].get_text().startswith("clone")


def test_the_coalescing_lesson_rests_on_the_counts():
    """On one device a timing cannot show what coalescing saves: the chapter counts the copy calls and
    times no coalescing, and the text under the counts says why."""
    at = tagged("copy-calls")
    code = "\n".join(c.source for c in CELLS if c.cell_type == "code")
    assert "copy_coalesced" in CELLS[at].source and "time_in_rounds" not in code
    assert not any("coalesce-timings" in c.metadata.get("tags", []) for c in CELLS)
    after = " ".join(CELLS[at + 1].source.split())
    assert CELLS[at + 1].cell_type == "markdown" and "On one device" in after and "synchronisation" in after


def test_the_methods_of_timing_get_one_collapsed_note():
    summaries = [
        s
        for c in CELLS
        if c.cell_type == "markdown"
        for s in re.findall(r"<summary>(.*?)</summary>", c.source)
    ]
    assert sum("tim" in s.lower() for s in summaries) == 1, summaries
