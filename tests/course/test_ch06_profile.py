"""The step profile (``dpteach.measure.profile``: each move's share of its step), and chapter 06 times nothing.

The seconds are never asserted (they are the learner's own figure); what is asserted is how a share
is taken: within its own step, its spread the middle half of the steps. Chapter 06 draws no shares
and no timings (a timing taught no lesson that repeats); the profile stays library API (docs/library.md). Cells are
found by their tags.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from dpteach.measure import profile

ROOT = Path(__file__).resolve().parents[2]
CELLS = nbformat.read(ROOT / "notebooks" / "06_the_cost_of_copies.ipynb", as_version=4).cells


def tagged(tag: str) -> int:
    return next(i for i, c in enumerate(CELLS) if tag in c.metadata.get("tags", []))


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


def test_the_coalescing_lesson_rests_on_the_counts():
    """On one device a timing cannot show what coalescing saves: the chapter counts the copy calls and
    times no coalescing, and the text under the counts says why."""
    at = tagged("coalesce-counts")
    code = "\n".join(c.source for c in CELLS if c.cell_type == "code")
    assert "copy_coalesced" in CELLS[at].source and "time_in_rounds" not in code
    assert not any("coalesce-timings" in c.metadata.get("tags", []) for c in CELLS)
    after = " ".join(CELLS[at + 1].source.split())
    assert CELLS[at + 1].cell_type == "markdown" and "On one device" in after and "synchronisation" in after
    assert "copy calls" in after


def test_the_chapter_times_nothing():
    """Chapter 06's lessons are counts: no cell reads a clock, so no collapsed note on how it times."""
    code = "\n".join(c.source for c in CELLS if c.cell_type == "code")
    assert "timer" not in code and "time_in_turns" not in code and "timed=False" in code
    summaries = [
        s
        for c in CELLS
        if c.cell_type == "markdown"
        for s in re.findall(r"<summary>(.*?)</summary>", c.source)
    ]
    assert not [s for s in summaries if "tim" in s.lower()], summaries
