"""The one timer: every second dpteach prints is read from the clock here, by the same rules.

* **Medians** over repeats, after untimed warm-up calls: a shared machine is noisy, and the median
  shrugs off the odd slow run.
* **In turns**: things that are compared are timed a, b, a, b, ... so that drift on the machine
  (other jobs, clocks, caches) falls on all of them alike; ratios are of medians.
* **CUDA synchronised**: GPU work is asynchronous, so ``time_in_turns`` waits for every GPU among the
  slots before and after each timed call; without it the clock would measure kernel launches.
  ``Phases`` (the step profile) records CUDA events around each phase instead, and waits for the
  GPUs only when ``seconds()`` reads them.
* **The garbage collector** is off only in ``time_in_rounds``, as in ``timeit``; ``time_in_turns``
  leaves it as it is.
* **One intra-op thread per CPU slot**: while it times, the timer sets ``torch.set_num_threads(1)``
  (and restores the old value after). A CPU slot stands for one device, while PyTorch's default gives
  every large operation (a copy of more than 32768 elements, a matmul) a team of threads, one per core;
  ``parallel_apply`` runs one slot per thread, each with its own team, and the teams (and anything else
  running) wait for each other's cores, so on a small or busy machine the clock measures that wait
  instead of the work. ``parallel_apply``'s worker threads start their teams from this setting
  (``tests/core/test_timer.py`` checks it), so one call covers every slot.

``time_in_turns({"a": fa, "b": fb}, devices)`` gives a ``Timing`` per name; ``time_in_rounds`` does
it in rounds after a throw-away one and says how far the rounds differed (the noise a chapter prints
beside its verdicts); ``time_it(fn, devices)`` one; ``Phases`` times the named phases of one step (CUDA events on GPUs, the wall clock on CPU).
"""

from __future__ import annotations

import contextlib
import gc
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, Sequence

import torch

from .._devices import DeviceLike, as_devices

__all__ = ["Timing", "time_in_turns", "time_in_rounds", "time_it", "sync", "threads_per_slot", "Phases"]


@dataclass(frozen=True)
class Timing:
    """Seconds per call: every sample, and their median."""

    samples: tuple[float, ...]

    def __init__(self, samples):
        object.__setattr__(self, "samples", tuple(samples))

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def quartiles(self) -> tuple[float, float]:
        """The first and third quartiles of the samples: the middle half of the runs lies between them.

        A figure draws them as the spread around the median; one sample has no spread.
        """
        if len(self.samples) < 2:
            return (self.samples[0], self.samples[0])
        q1, _, q3 = statistics.quantiles(self.samples, n=4, method="inclusive")
        return (q1, q3)

    def __repr__(self) -> str:
        return f"{self.median * 1e3:.3f} ms (median of {len(self.samples)})"


def _cuda_indices(slots: Sequence[torch.device]) -> list[int]:
    return sorted({d.index for d in slots if d.type == "cuda"})  # as_devices gives every CUDA slot its index


def sync(devices: Sequence[DeviceLike]) -> None:
    """Wait for every CUDA device in ``devices`` (nothing to wait for on CPU)."""
    for index in _cuda_indices(as_devices(devices)):
        torch.cuda.synchronize(index)


@contextlib.contextmanager
def threads_per_slot(devices: Sequence[DeviceLike], n: int | None = 1) -> Iterator[None]:
    """``torch.set_num_threads(n)`` while inside, when any slot is a CPU; the old value restored after.

    ``n=None`` leaves PyTorch's setting alone (every core for each operation).
    """
    if n is None or not any(d.type == "cpu" for d in as_devices(devices)):
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def time_in_turns(
    fns: Mapping[str, Callable[[], object]],
    devices: Sequence[DeviceLike] = ("cpu",),
    repeats: int = 10,
    warmup: int = 2,
    budget_s: float | None = None,
    threads: int | None = 1,
) -> dict[str, Timing]:
    """Time each function ``repeats`` times, in turns, after ``warmup`` untimed rounds.

    With ``budget_s``, stop early (after at least one round) once another round would take any
    function past ``budget_s`` seconds in all. ``threads``: intra-op threads per CPU slot while
    timing (None: PyTorch's own setting, to see what the default costs).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    slots = as_devices(devices)
    samples: dict[str, list[float]] = {name: [] for name in fns}
    with threads_per_slot(slots, threads):
        for _ in range(warmup):
            for fn in fns.values():
                fn()
        for _ in range(repeats):
            if budget_s is not None and any(s and sum(s) + s[-1] > budget_s for s in samples.values()):
                break
            for name, fn in fns.items():
                sync(slots)
                start = time.perf_counter()
                fn()
                sync(slots)
                samples[name].append(time.perf_counter() - start)
    return {name: Timing(s) for name, s in samples.items()}


def time_in_rounds(
    fns: Mapping[str, Callable[[], object]],
    devices: Sequence = ("cpu",),
    repeats: int = 15,
    rounds: int = 3,
) -> tuple[dict[str, Timing], float]:
    """Time ``fns`` in turns, ``rounds`` times after one round that is thrown away.

    Returns a ``Timing`` per name holding the samples of every kept round (its median is of all of
    them), and the spread: the largest ratio, over the names, of a name's slowest round median to its
    fastest. A busy moment on a shared machine moves one round; the spread says how much.

    Python's garbage collector is off while it times (as ``timeit`` does by default), and restored
    after. A collection starts when enough new objects have piled up, whichever call made the last
    of them, and a full one walks every object of the process (a notebook kernel has many): in
    chapter 06 they fell on ``copy_coalesced`` at 1024 tensors, which makes the most objects per
    call (a view per tensor, then a tensor per ``.data``), and its median came out several times the
    sum of its steps timed in the same turns.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    collecting = gc.isenabled()
    gc.disable()
    try:
        time_in_turns(fns, devices, repeats=repeats)  # thrown away: one-time costs (threads, memory)
        kept = [time_in_turns(fns, devices, repeats=repeats) for _ in range(rounds)]
    finally:
        if collecting:
            gc.enable()
    pooled = {name: Timing([s for r in kept for s in r[name].samples]) for name in fns}
    spread = max(max(r[name].median for r in kept) / min(r[name].median for r in kept) for name in fns)
    return pooled, spread


def time_it(
    fn: Callable[[], object],
    devices: Sequence[DeviceLike] = ("cpu",),
    repeats: int = 10,
    warmup: int = 2,
    budget_s: float | None = None,
    threads: int | None = 1,
) -> Timing:
    """``time_in_turns`` of one function."""
    return time_in_turns({"fn": fn}, devices, repeats, warmup, budget_s, threads)["fn"]


class Phases:
    """Times the named phases of one step: CUDA events on every GPU slot's current stream (a phase
    takes the longest device's time), or the wall clock. Use inside ``threads_per_slot``."""

    def __init__(self, devices: Sequence[DeviceLike]):
        self.cuda = _cuda_indices(as_devices(devices))
        self._events: list[tuple[str, dict, dict]] = []
        self._wall: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
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
