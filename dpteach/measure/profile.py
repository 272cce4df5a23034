"""Where the time of one DataParallel step goes: scatter, replicate, parallel apply, gather, backward.

Timed by ``dpteach.measure.timer.Phases``: CUDA events on GPU slots (one pair per device and phase,
the phase taking the longest device's time), the wall clock on CPU slots with one intra-op thread per
slot. Every figure is a median over repeats, because a shared machine is noisy. The bytes each step
copies come from ``dpteach.comm.traffic``.

* ``profile_step(module, x, devices, strategy)``: the steps of one strategy, one after another.
* ``profile_in_turns(module, x, devices, strategies)``: the steps of several strategies taken in
  turns (clone, rewire, broadcast, clone, ...), so that a busy moment on the machine falls on all of
  them alike; a ``StepProfile`` per strategy.
* ``StepProfile.shares()``: each move's share of its own step, with the spread over the steps;
  ``plot_shares(profiles)`` draws them, the learner's own figure.
"""

from __future__ import annotations

import gc
import statistics
from dataclasses import dataclass, field
from typing import Callable, Mapping, NamedTuple, Sequence

import torch
from torch import nn

from .. import comm
from .._devices import DeviceLike, as_devices
from ..data_parallel import mean_square, step
from ..replicate import STRATEGIES, Strategy, strategy_name
from .timer import Phases, threads_per_slot

PHASES = ("scatter", "replicate", "parallel_apply", "gather", "backward")

__all__ = ["PHASES", "Share", "StepProfile", "profile_step", "profile_in_turns", "plot_shares"]


class Share(NamedTuple):
    """One move's share of a step (0.25: a quarter of it), over the timed steps: the median, and the
    first and third quartiles (``low``, ``high``), between which the middle half of the steps lies."""

    low: float
    median: float
    high: float


@dataclass
class StepProfile:
    """Per-phase seconds of every timed step, and the bytes one step copied."""

    strategy: str
    devices: list[str]
    steps: list[dict[str, float]] = field(default_factory=list)
    bytes_by_op: dict[str, int] = field(default_factory=dict)

    @property
    def medians(self) -> dict[str, float]:
        return {p: statistics.median(s[p] for s in self.steps) for p in PHASES}

    @property
    def total(self) -> float:
        """Median of the whole step (not the sum of the phase medians)."""
        return statistics.median(sum(s[p] for p in PHASES) for s in self.steps)

    def shares(self) -> dict[str, Share]:
        """Each move's share of its own step, per phase: ``Share(low, median, high)`` over the steps.

        A share is taken within one step (the phase's seconds over that step's), so a step that ran
        slow as a whole moves no share; the medians of the shares need not add up to 1.
        """
        per_step = [{p: s[p] / (sum(s[q] for q in PHASES) or 1.0) for p in PHASES} for s in self.steps]
        out = {}
        for p in PHASES:
            values = sorted(s[p] for s in per_step)
            low, high = (
                statistics.quantiles(values, n=4, method="inclusive")[::2]
                if len(values) > 1
                else (values[0], values[0])
            )
            out[p] = Share(low, statistics.median(values), high)
        return out

    def table(self) -> str:
        med, total = self.medians, self.total
        lines = [f"{'phase':<15} {'median ms':>10} {'share*':>7}"]
        for p in PHASES:
            lines.append(f"{p:<15} {med[p] * 1e3:>10.2f} {med[p] / total:>7.0%}")
        lines.append(f"{'step':<15} {total * 1e3:>10.2f}")
        lines.append("* share of the median step: the phases' medians need not add up to it")
        return "\n".join(lines)


def _timed_step(module, x, slots, strategy, loss_fn) -> tuple[dict[str, float], dict[str, int]]:
    """One step, each move timed: its seconds per phase, and the bytes it copied by operation."""
    module.zero_grad(set_to_none=True)
    timer = Phases(slots)
    with comm.traffic() as traffic:
        step(
            module, x, slots, strategy=strategy, loss_fn=loss_fn, replicate_one_slot=False, phase=timer.phase
        )
    return {p: 0.0 for p in PHASES} | timer.seconds(), traffic.by_op()  # one slot: nothing is replicated


def profile_step(
    module: nn.Module,
    x: torch.Tensor,
    devices: Sequence[DeviceLike],
    strategy: Strategy = "broadcast",
    loss_fn: Callable = mean_square,
    repeats: int = 10,
    warmup: int = 2,
) -> StepProfile:
    """Time each phase of ``repeats`` DataParallel steps of ``module`` on batch ``x``.

    The steps are the core helper's (``dpteach.data_parallel.step``: the four moves, then the loss
    and ``loss.backward()``), each move timed; backward includes the reduction of the replicas'
    gradients. One slot runs the module itself, as ``DataParallel`` does.
    """
    slots = as_devices(devices)
    profile = StepProfile(strategy_name(strategy), [str(d) for d in slots])
    with threads_per_slot(slots):
        for i in range(warmup + repeats):
            seconds, profile.bytes_by_op = _timed_step(module, x, slots, strategy, loss_fn)
            if i >= warmup:
                profile.steps.append(seconds)
    return profile


def profile_in_turns(
    module: nn.Module,
    x: torch.Tensor,
    devices: Sequence[DeviceLike],
    strategies: Sequence[Strategy] = tuple(STRATEGIES),
    loss_fn: Callable = mean_square,
    repeats: int = 15,
    warmup: int = 2,
) -> dict[str, StepProfile]:
    """``profile_step`` for several strategies, their steps taken in turns: a ``StepProfile`` each.

    Round after round, one step of each strategy, every move timed (clone, rewire, broadcast, clone,
    ...), as ``timer.time_in_turns`` times the things it compares: a busy moment on a shared machine
    falls on every strategy and every move alike, not on one of them. ``warmup`` rounds are not kept.
    Python's garbage collector is off while it times, as in ``timer.time_in_rounds``: a collection
    would fall on whichever move made the last of the objects that started it. Gradients are left in
    ``module`` (as after any step); BatchNorm's running statistics move with every step.
    """
    slots = as_devices(devices)
    profiles = {strategy_name(s): StepProfile(strategy_name(s), [str(d) for d in slots]) for s in strategies}
    collecting = gc.isenabled()
    gc.disable()
    try:
        with threads_per_slot(slots):
            for i in range(warmup + repeats):
                for strategy, profile in zip(strategies, profiles.values()):
                    seconds, profile.bytes_by_op = _timed_step(module, x, slots, strategy, loss_fn)
                    if i >= warmup:
                        profile.steps.append(seconds)
    finally:
        if collecting:
            gc.enable()
    return profiles


def plot_shares(profiles: StepProfile | Mapping[str, StepProfile], ax=None, title: str = ""):
    """Bars: each move's share of one step, one bar per strategy and move, the learner's own timing.

    A bar is the median share over the timed steps (``StepProfile.shares``); its whisker runs from the
    first to the third quartile, the middle half of the steps. Where two whiskers overlap the run does
    not tell which move took the larger share. The legend names the strategies and gives no step
    times: on a busy CPU their spread covers the gaps between strategies, and a figure that printed
    them would invite a ranking the run cannot support (``StepProfile.total`` has them).
    """
    import matplotlib.pyplot as plt

    if isinstance(profiles, StepProfile):
        profiles = {profiles.strategy: profiles}
    ax = ax or plt.subplots(figsize=(8, 3.4))[1]
    width = 0.8 / len(profiles)
    for k, (name, profile) in enumerate(profiles.items()):
        shares = profile.shares()
        xs = [i + (k - (len(profiles) - 1) / 2) * width for i in range(len(PHASES))]
        medians = [shares[p].median for p in PHASES]
        spread = [
            [shares[p].median - shares[p].low for p in PHASES],
            [shares[p].high - shares[p].median for p in PHASES],
        ]
        ax.bar(xs, medians, width, yerr=spread, capsize=3, label=name, hatch=["", "//", ".."][k % 3])
    ax.set_xticks(range(len(PHASES)), [p.replace("_", "\n") for p in PHASES])
    ax.yaxis.set_major_formatter(lambda v, _: f"{v:.0%}")
    ax.set_ylabel("share of the step (median;\nwhiskers: middle half of the steps)")
    ax.set_title(title)
    ax.legend(title="strategy", loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.figure.tight_layout()
    return ax
