"""Where the time of one DataParallel step goes: scatter, replicate, parallel apply, gather, backward.

Timed by ``dpteach.measure.timer.Phases``: CUDA events on GPU slots (one pair per device and phase,
the phase taking the longest device's time), the wall clock on CPU slots with one intra-op thread per
slot. Every figure is a median over repeats, because a shared machine is noisy. The bytes each step
copies come from ``dpteach.comm.traffic``.

* ``profile_step(module, x, devices, strategy)``: the steps of one strategy, one after another.
* ``StepProfile.shares()``: each move's share of its own step, with the spread over the steps.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Sequence

import torch
from torch import nn

from .. import comm
from .._devices import DeviceLike, as_devices
from ..data_parallel import mean_square, step
from ..replicate import Strategy, strategy_name
from .timer import Phases, threads_per_slot

PHASES = ("scatter", "replicate", "parallel_apply", "gather", "backward")

__all__ = ["PHASES", "Share", "StepProfile", "profile_step"]


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
