"""Where the time of one DataParallel step goes: scatter, replicate, parallel apply, gather, backward.

Timed by ``dpteach.measure.timer.Phases``: CUDA events on GPU slots (one pair per device and phase,
the phase taking the longest device's time), the wall clock on CPU slots with one intra-op thread per
slot. Every figure is a median over repeats, because a shared machine is noisy. The bytes each step
copies come from ``dpteach.comm.traffic``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
from torch import nn

from .. import comm
from .._devices import DeviceLike, as_devices
from ..data_parallel import mean_square, step
from ..replicate import Strategy, strategy_name
from .timer import Phases, threads_per_slot

PHASES = ("scatter", "replicate", "parallel_apply", "gather", "backward")

__all__ = ["PHASES", "StepProfile", "profile_step"]


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

    def table(self) -> str:
        med, total = self.medians, self.total
        lines = [f"{'phase':<15} {'median ms':>10} {'share*':>7}"]
        for p in PHASES:
            lines.append(f"{p:<15} {med[p] * 1e3:>10.2f} {med[p] / total:>7.0%}")
        lines.append(f"{'step':<15} {total * 1e3:>10.2f}")
        lines.append("* share of the median step: the phases' medians need not add up to it")
        return "\n".join(lines)


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
    name = strategy_name(strategy)
    profile = StepProfile(name, [str(d) for d in slots])
    with threads_per_slot(slots):
        for i in range(warmup + repeats):
            module.zero_grad(set_to_none=True)
            timer = Phases(slots)
            with comm.traffic() as traffic:
                step(
                    module,
                    x,
                    slots,
                    strategy=strategy,
                    loss_fn=loss_fn,
                    replicate_one_slot=False,
                    phase=timer.phase,
                )
            seconds = {p: 0.0 for p in PHASES} | timer.seconds()  # one slot: nothing is replicated
            if i >= warmup:
                profile.steps.append(seconds)
                profile.bytes_by_op = traffic.by_op()
    return profile
