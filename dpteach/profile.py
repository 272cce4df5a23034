"""Where the time of one DataParallel step goes: scatter, replicate, parallel apply, gather, backward.

Timed with CUDA events on GPU slots (one pair per device and phase, the phase taking the longest
device's time) and with the wall clock on CPU slots. Every figure is a median over repeats,
because a shared machine is noisy. The bytes each step copies come from ``dpteach.comm.traffic``.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
from torch import nn

from . import comm
from ._devices import DeviceLike, as_devices
from .data_parallel import Moves, four_moves
from .replicate import Strategy, strategy_name

PHASES = ("scatter", "replicate", "parallel_apply", "gather", "backward")

__all__ = ["PHASES", "Timer", "StepProfile", "profile_step", "median_seconds", "median_times", "sync"]


def sync(devices: Sequence[torch.device]) -> None:
    """Wait for every CUDA device in ``devices`` (nothing to wait for on CPU)."""
    for index in sorted({d.index for d in devices if d.type == "cuda"}):
        torch.cuda.synchronize(index)


class Timer:
    """Times named phases: CUDA events on every GPU slot's current stream, or the wall clock."""

    def __init__(self, devices: Sequence[torch.device]):
        self.cuda = sorted({d.index for d in devices if d.type == "cuda"})
        self._events: list[tuple[str, dict, dict]] = []
        self._wall: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str):
        if not self.cuda:
            start = time.perf_counter()
            yield
            self._wall[name] = self._wall.get(name, 0.0) + time.perf_counter() - start
            return
        starts, ends = {}, {}
        for i in self.cuda:
            starts[i] = torch.cuda.Event(enable_timing=True)
            starts[i].record(torch.cuda.current_stream(i))
        yield
        for i in self.cuda:
            ends[i] = torch.cuda.Event(enable_timing=True)
            ends[i].record(torch.cuda.current_stream(i))
        self._events.append((name, starts, ends))

    def seconds(self) -> dict[str, float]:
        """Each phase's time in seconds (synchronises the GPUs first)."""
        if not self.cuda:
            return dict(self._wall)
        for i in self.cuda:
            torch.cuda.synchronize(i)
        out: dict[str, float] = {}
        for name, starts, ends in self._events:
            out[name] = out.get(name, 0.0) + max(starts[i].elapsed_time(ends[i]) for i in self.cuda) / 1e3
        return out


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
        lines = [f"{'phase':<15} {'median ms':>10} {'share':>7}"]
        for p in PHASES:
            lines.append(f"{p:<15} {med[p] * 1e3:>10.2f} {med[p] / total:>7.0%}")
        lines.append(f"{'step':<15} {total * 1e3:>10.2f}")
        return "\n".join(lines)


def _default_loss(out):
    return out.float().pow(2).mean()


def profile_step(
    module: nn.Module,
    x: torch.Tensor,
    devices: Sequence[DeviceLike],
    strategy: Strategy = "broadcast",
    loss_fn: Callable = _default_loss,
    repeats: int = 10,
    warmup: int = 2,
) -> StepProfile:
    """Time each phase of ``repeats`` DataParallel steps of ``module`` on batch ``x``.

    The steps are the ones ``DataParallel.forward`` and ``loss.backward()`` take (``four_moves``,
    each move timed); backward includes the reduction of the replicas' gradients.
    """
    slots = as_devices(devices)
    moves = Moves(module, slots, strategy=strategy)
    name = strategy_name(strategy)
    profile = StepProfile(name, [str(d) for d in slots])
    for i in range(warmup + repeats):
        module.zero_grad(set_to_none=True)
        timer = Timer(slots)
        with comm.traffic() as traffic:
            out = four_moves(moves, (x,), {}, phase=timer.phase)
            with timer.phase("backward"):
                loss_fn(out).backward()
        seconds = {p: 0.0 for p in PHASES} | timer.seconds()  # one slot: the module runs, nothing is replicated
        if i >= warmup:
            profile.steps.append(seconds)
            profile.bytes_by_op = traffic.by_op()
    return profile


def median_seconds(
    fn: Callable[[], object], devices: Sequence[DeviceLike] = ("cpu",), repeats: int = 10, warmup: int = 2
) -> float:
    """Median wall-clock seconds of ``fn()`` as a float, the GPUs synchronised around each call
    (``costs.median_time`` gives a ``Timing`` with every sample instead)."""
    slots = as_devices(devices)
    times = []
    for i in range(warmup + repeats):
        sync(slots)
        start = time.perf_counter()
        fn()
        sync(slots)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def median_times(
    fns: dict[str, Callable[[], object]], devices: Sequence[DeviceLike] = ("cpu",), repeats: int = 10, warmup: int = 2
) -> dict[str, float]:
    """Median seconds of each function, timed in turns (a, b, a, b, ...) so drift on a shared
    machine (other jobs, clocks, caches) falls on all of them alike; use this for ratios."""
    slots = as_devices(devices)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for i in range(warmup + repeats):
        for name, fn in fns.items():
            sync(slots)
            start = time.perf_counter()
            fn()
            sync(slots)
            if i >= warmup:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}
