"""The cost explorer's model: model size and slots against the bytes one step moves and the time it takes.

``CostLab(width, slots).measure()`` takes real DataParallel steps of the course's MLP made wider
(``Linear(2, w) → Tanh → Linear(w, w) → Tanh → Linear(w, 1)``) under each strategy. It ranks the
strategies two ways that come out the same on every run: by the bytes one step copies, counted, not
estimated (every copy dpteach makes is recorded by ``dpteach.comm.traffic()``), and by the cost model
(``dpteach.measure.costmodel``), which predicts DataParallel's and DDP's step on ``slots`` GPUs of the
profile ``gpu``. Timings are only shown beside them: each is the median of ``max_repeats`` (5) steps,
taken in turns (each strategy, then the one-device step) by the one timer, ``dpteach.measure.timer``,
with one intra-op thread per CPU slot. ``budget_s`` (1 s) caps each strategy's timed steps: where
five do not fit in it, fewer are timed and no time is shown, only a sentence saying so. 1 s leaves
room for five steps of the widest model (width 1024) on eight slots of a slow CPU, a few tenths of
a second each; a small model's five steps take milliseconds, so the widget still answers at once.
The machine's load shows in the numbers. ``timed=False`` takes the counted steps only: the lab, its
status and its report then show bytes and nothing timed (chapter 06, whose lesson is the counts).

Plain Python, no ipywidgets; ``view_cost.py`` only shows it.
"""

from __future__ import annotations

import math
import statistics
import textwrap
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import nn

from .. import comm
from ..course import story
from ..data_parallel import DataParallel
from ..measure.timer import time_in_turns
from .training import STRATEGIES, slot_devices

WIDTHS = (16, 64, 256, 1024)  # hidden width: from the course's model (16) to about a million parameters
# A time is shown only with at least this many timed steps: fewer give no spread worth the name.
MIN_TIMED = 5
BUDGET_S = 1.0  # seconds of timed steps per strategy, at most: room for five of the widest model
GPU = "A100-SXM"  # the cost model's profile the explorer predicts for (costmodel.GPUS)
NOT_MEASURED = "not measured yet: call measure() to take the steps"
# Which of dpteach's strategies the cost model's "DataParallel" is: torch.nn.DataParallel's replicate
# broadcasts the parameters and its backward sums them with reduce_add_coalesced (costmodel's docstring).
MODEL_STRATEGY = "broadcast"
# characters per line of CostLab.report(): a notebook output's width, so it reads without scrolling sideways
REPORT_WIDTH = 100
# slots on one device: backward's sums add in place (rewire.py records a reduce_add only across devices) and
# the scatter's pieces are views of the batch, so neither copies; on distinct GPUs both would add bytes
ONE_DEVICE = (
    "  (slots on one device: backward's sums and the scatter copy nothing; on distinct GPUs they copy)"
)


def us(seconds: float) -> str:
    """Seconds as microseconds, three significant figures down to the nanosecond, no powers of ten: 3.94 µs,
    0.005 µs, 400 µs, 3,480 µs. Every time the lab prints uses this one unit, so figures compare at a glance."""
    v = seconds * 1e6
    if v == 0:
        return "0 µs"
    if abs(v) < 0.0005:
        return "< 0.001 µs"
    v = float(f"{v:.3g}")  # three figures: 15,143 -> 15,100, 0.9996 -> 1.00
    digits = 2 - math.floor(math.log10(abs(v)))  # the places after the point that show them
    return f"{v:,.{min(3, max(0, digits))}f} µs"


def wide_model(width: int, seed: int = 0) -> nn.Sequential:
    """The course's MLP with a square hidden layer: about ``width**2`` parameters."""
    with torch.random.fork_rng(devices=[]):  # the caller's random state is left alone
        torch.manual_seed(seed)
        return nn.Sequential(
            nn.Linear(2, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(), nn.Linear(width, 1)
        )


def width_numel(width: int) -> int:
    """The number of scalars in ``wide_model(width)``'s parameters, without building it."""
    return 2 * width + width + width * width + width + width + 1


def tied_ranks(keys) -> list[str]:
    """Ranks of ``keys``, already in order: equal keys share a rank marked "=" ("1.", "2=", "2="), so a tie
    never reads as an order. Pass what is shown (bytes, or a time as printed), not more digits than that."""
    keys = list(keys)
    return [f"{keys.index(k) + 1}{'=' if keys.count(k) > 1 else '.'}" for k in keys]


@dataclass(frozen=True)
class StrategyCost:
    """What one strategy's step cost: bytes copied, by operation, and seconds per step."""

    strategy: str
    bytes_by_op: dict[str, int]
    seconds: tuple[float, ...]

    @property
    def bytes(self) -> int:
        return sum(self.bytes_by_op.values())

    def by_op(self) -> str:
        """The bytes per operation that make up the total: "broadcast 801,804 + gather 1,024"."""
        return " + ".join(f"{op} {n:,}" for op, n in self.bytes_by_op.items()) or "no copies"

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    def shown(self, budget_s: float | None = None) -> str:
        """The median and the middle half of the timed steps, in µs; or why no time is shown (and, given the
        budget the steps were timed in, how to get one)."""
        n = len(self.seconds)
        if n < MIN_TIMED:
            within = f"{budget_s:g} s" if budget_s is not None else "the time budget"
            more = f"{max(1, 4 * budget_s):g}" if budget_s is not None else "4"
            return (  # the call chapters 06 and 12 make; CostLab takes the same budget_s
                f"timed {n} step{'s' * (n != 1)} in {within}; for a spread, time at least {MIN_TIMED}: "
                f"cost_explorer(budget_s={more})"
            )
        q1, _, q3 = statistics.quantiles(self.seconds, n=4)
        return f"{us(self.median)} (median of {n}, middle half {us(q1)[:-3]}-{us(q3)})"


@lru_cache(maxsize=16)
def _workload(width: int, seed: int):
    """The cost model's inputs for ``wide_model(width)`` on the course batch, counted by hand: the figures
    ``costmodel.workload`` gets from ``FlopCounterMode`` (test_ch12_lab.py checks every width), without
    its first use in a process, which imports ``torch._dynamo``: seconds on a small CPU."""
    from ..measure import costmodel

    x, y = story.make_data(seed=seed)
    rows, layers = x.shape[0], [(x.shape[1], width), (width, width), (width, y.shape[1])]
    sizes = [n for i, o in layers for n in (o * i, o)]  # weight, bias of each Linear, in parameters() order
    return costmodel.Workload(
        flops_fwd=float(sum(2 * rows * i * o for i, o in layers)),  # one matrix product per Linear
        # backward: each Linear's weight gradient, and its input's gradient but for the first (x needs none)
        flops_bwd=float(sum(2 * rows * i * o * (1 + (k > 0)) for k, (i, o) in enumerate(layers))),
        param_bytes=4 * sum(sizes),
        param_tensors=len(sizes),
        input_bytes=x.numel() * x.element_size(),
        output_bytes=y.numel() * y.element_size(),
        batch=rows,
        grad_bytes=tuple(4 * n for n in reversed(sizes)),
    )


# What the modelled figures leave out, said wherever they are shown: at the explorer's sizes a step's
# counted work takes less than one kernel launch, so only the ranking means anything. The two
# packing copies are the ones costmodel's docstring lists as left out: torch's broadcast_coalesced flattens
# the parameters into one buffer per chunk before it broadcasts them (torch/csrc/cuda/comm.cpp), and DDP's
# hooks copy each gradient into its bucket and back (reducer.cpp).
LEFT_OUT = (
    "kernel launches and two packing copies: DataParallel's of the parameters before "
    "its broadcast, DDP's of each gradient into its bucket and back"
)
LEFT_OUT_NOTE = (
    "the model counts FLOPs, bytes and NCCL's latency estimate per message (it leaves out {left_out}, which "
    "a real GPU step also pays, µs each): at these sizes only its ranking means anything, not its figures"
)

_PLAIN = object()  # the one-device step's key: never a strategy's name


def _thread_starts(prediction) -> float:
    """Seconds of a modelled step that are its assumed thread starts (``costmodel.PYTHON_THREAD_S`` each)."""
    return sum(p.seconds for p in prediction.parts if p.name.startswith("start thread"))


class CostLab:
    """Bytes and seconds of one DataParallel step, per strategy, for a model width and a number of slots."""

    def __init__(
        self,
        width: int = 64,
        slots: int = 2,
        strategies=STRATEGIES,
        budget_s: float = BUDGET_S,
        max_repeats: int = 5,
        seed: int = 0,
        gpu: str = GPU,
        timed: bool = True,
    ):
        self.width, self.slots, self.strategies, self.gpu = width, slots, tuple(strategies), gpu
        self.timed = timed  # False: count the bytes of one step per strategy, time nothing
        self.budget_s, self.max_repeats, self.seed = budget_s, max_repeats, seed
        self.costs: list[StrategyCost] = []
        self.reference_s: float | None = None
        self.reference: StrategyCost | None = None

    def configure(self, width: int | None = None, slots: int | None = None) -> None:
        if width is not None:
            self.width = int(width)
        if slots is not None:
            if int(slots) < 1:
                raise ValueError(f"slots must be at least 1, got {slots}")
            self.slots = int(slots)

    @property
    def model_bytes(self) -> int:
        """Bytes of the model's parameters: what one full copy of it moves."""
        return width_numel(self.width) * 4

    def measure(self) -> list[StrategyCost]:
        """One counted step per strategy, then (unless ``timed=False``) timed steps within the budget and one
        device's step timed beside them."""
        devices = slot_devices(self.slots)
        x, y = (t.to(devices[0]) for t in story.make_data(seed=self.seed))
        steps, meters = {}, {}
        for strategy in self.strategies:
            model = wide_model(self.width, self.seed).to(devices[0])
            dp = DataParallel(model, devices, strategy=strategy)

            def step(model=model, dp=dp):
                model.zero_grad(set_to_none=True)
                nn.functional.mse_loss(dp(x), y).backward()

            with comm.traffic() as meters[strategy]:  # every copy dpteach makes in this step, both passes
                step()  # also the warm-up: the first step pays for allocations
            steps[strategy] = step
        if not self.timed:  # the counts alone: no seconds, no one-device step
            self.costs = [StrategyCost(s, meters[s].by_op(), ()) for s in self.strategies]
            self.reference, self.reference_s = None, None
            return self.costs
        model = wide_model(self.width, self.seed).to(devices[0])

        def plain():
            model.zero_grad(set_to_none=True)
            nn.functional.mse_loss(model(x), y).backward()

        plain()
        steps[_PLAIN] = plain
        timed = time_in_turns(steps, devices, self.max_repeats, warmup=0, budget_s=self.budget_s)
        costs = [StrategyCost(s, meters[s].by_op(), timed[s].samples) for s in self.strategies]
        self.reference = StrategyCost("one device", {}, timed[_PLAIN].samples)
        self.reference_s = timed[_PLAIN].median
        self.costs = costs
        return costs

    def by_bytes(self) -> list[StrategyCost]:
        """The measured strategies, fewest bytes copied first (ties by name): a ranking that never moves."""
        return sorted(self.costs, key=lambda c: (c.bytes, c.strategy))

    def modelled(self) -> dict:
        """The cost model's prediction of one step under DataParallel and DDP on ``slots`` GPUs of ``gpu``,
        fastest first: FLOPs and bytes of this width's model and the course batch, and NCCL's latency per
        message, not a clock."""
        from ..measure import costmodel

        work = _workload(self.width, self.seed)
        # latency=True: each message pays NCCL's own latency estimate (costmodel's docstring). Without it a
        # step of this tiny model is a few ns of bytes and FLOPs, which no real GPU step is
        predictions = [
            costmodel.predict(work, self.gpu, self.slots, strategy=s, latency=True)
            for s in ("DataParallel", "DDP")
        ]
        return {p.strategy: p for p in sorted(predictions, key=lambda p: (p.total_s, p.strategy))}

    def without_thread_starts(self) -> dict[str, float]:
        """The cost model's totals in seconds with DataParallel's assumed thread starts taken out, fastest
        first: what its ranking of DataParallel against DDP rests on besides ``PYTHON_THREAD_S``.

        The model starts the threads one after another before the last forward, so every later part
        waits for them: taking them out takes their sum off DataParallel's total.
        """
        modelled = self.modelled()
        totals = {s: p.total_s - _thread_starts(p) for s, p in modelled.items()}
        return dict(sorted(totals.items(), key=lambda item: (item[1], item[0])))

    def assumption_line(self) -> str:
        """One line: how much of DataParallel's modelled step is assumed thread starts, and what the model
        leaves out (the explorer shows it under the model's table, whose last column is the step without
        them)."""
        from ..measure import costmodel

        dp = self.modelled()["DataParallel"]
        starts = _thread_starts(dp)
        if not starts:
            return (
                "with 1 slot neither wrapper replicates: the model's two steps are the plain step; "
                f"{LEFT_OUT_NOTE.format(left_out=LEFT_OUT)}"
            )
        return (
            f"{starts / dp.total_s:.1%} of DataParallel's {us(dp.total_s)} is {self.slots} thread starts "
            f"at an assumed {us(costmodel.PYTHON_THREAD_S)} each (costmodel.PYTHON_THREAD_S, not "
            f"measured); {LEFT_OUT_NOTE.format(left_out=LEFT_OUT)}"
        )

    def report(self, modelled: bool = True) -> list[str]:
        """The bytes ranking, this machine's times under it (a lab made with ``timed=False`` has none), then
        the cost model's ranking in words, ``modelled_line()`` (left out with ``modelled=False``): lines of
        at most ``REPORT_WIDTH`` characters, so a notebook cell's output reads without scrolling sideways."""
        if not self.costs:
            return [NOT_MEASURED]
        lines = [
            f"width {self.width} ({width_numel(self.width):,} parameters, {self.model_bytes:,} bytes), "
            f"{self.slots} slot{'s' * (self.slots != 1)}",
            "bytes copied per step, counted by comm.traffic() (exact, the same on every run; = marks a tie):",
        ]
        order = self.by_bytes()
        for rank, c in zip(tied_ranks(c.bytes for c in order), order):
            lines.append(
                f"  {rank:<3} {c.strategy:<10} {c.bytes:>10,} bytes  {c.bytes / self.model_bytes:.1f}x the model"
                f"  ({c.by_op()})"
            )
        if len(set(slot_devices(self.slots))) == 1:
            lines.append(ONE_DEVICE)
        if self.timed:
            lines.append("this run's time per step, only beside them (noisy: it ranks nothing):")
            timed = [*self.costs, *([self.reference] if self.reference is not None else [])]
            lines += [f"  {c.strategy:<10} {c.shown(self.budget_s)}" for c in timed]
        if modelled:  # its figures: modelled_figures(), modelled_lines()
            lines.append(self.modelled_line())
        return lines

    def _modelled_parts(self):
        """The model's steps, DataParallel's, the "modelled, <n> x <gpu>" label and its thread starts."""
        modelled = self.modelled()
        dp = modelled["DataParallel"]
        return modelled, dp, f"modelled, {self.slots} x {self.gpu}", _thread_starts(dp)

    def modelled_line(self) -> str:
        """The cost model's ranking of torch's DataParallel against DDP in words, one line labelled
        "modelled, not measured, <profile>": whose step is the shorter ("wins"), and that most of
        DataParallel's is its assumed thread starts (within ``REPORT_WIDTH`` at every setting). No figure: a modelled step of a few µs beside an assumed 100 µs per thread reads as
        a measurement, which it is not. The figures: ``modelled_figures()`` and ``modelled_lines()``."""
        modelled, dp, head, starts = self._modelled_parts()
        if not starts:
            return f"{head}: neither wrapper replicates, both are the plain step"
        first, bare = next(iter(modelled)), next(iter(self.without_thread_starts()))
        share = "most" if starts > dp.total_s / 2 else f"{starts / dp.total_s:.0%}"
        head = head.replace("modelled, ", "modelled, not measured, ", 1)
        line = f"{head}: {first} wins; {share} of DataParallel's step is assumed thread starts"
        # the same ranking without the starts at every setting of the explorer (test_ch12_lab checks it)
        return line if bare == first else f"{line}, without which {bare} wins"

    def tiny(self) -> str:
        """What the modelled figures are of, said beside them: a model tiny by GPU standards, whose modelled
        step is mostly NCCL's latency per message and the assumed thread starts, so that a figure such as
        15.6 µs never reads as a real GPU step."""
        return f"a model of {width_numel(self.width):,} parameters, tiny for a GPU: only the ranking means anything"

    def modelled_figures(self) -> str:
        """The cost model's ranking as one line of figures: each wrapper's modelled step without
        DataParallel's assumed thread starts, then those starts added on, so the assumed constant never
        hides in the figure; then, in the same line, the model's size ("modelled, 4 x A100-SXM: DDP 32.7 µs
        < DataParallel 134 µs + 400 µs assumed thread starts (a model of 66,817 parameters, ...)")."""
        modelled, dp, head, starts = self._modelled_parts()
        if not starts:
            return f"{head}: neither wrapper replicates, both are the plain step, {us(dp.total_s)}"
        ranked = " < ".join(
            f"{s} {us(t)}" + (f" + {us(starts)} assumed thread starts" if s == dp.strategy else "")
            for s, t in self.without_thread_starts().items()
        )
        return f"{head}: {ranked} ({self.tiny()})"

    def modelled_rows(self) -> list[tuple[str, str, str, str, str]]:
        """The cost model's table, fastest first, as shown: (rank, wrapper, its step, its assumed thread
        starts, the step without them). Equal steps share a rank."""
        from ..measure import costmodel

        modelled, without = self.modelled(), self.without_thread_starts()
        rows = []
        for rank, (strategy, p) in zip(
            tied_ranks(us(p.total_s) for p in modelled.values()), modelled.items()
        ):
            starts = sum(part.name.startswith("start thread") for part in p.parts)
            assumed = f"{starts} x {us(costmodel.PYTHON_THREAD_S)}" if starts else "none"
            rows.append((rank, strategy, us(p.total_s), assumed, us(without[strategy])))
        return rows

    def modelled_lines(self) -> list[str]:
        """The cost model's ranking as one table: each wrapper's step, its assumed thread starts, and the step
        without them; then what the figures leave out."""
        from ..measure import costmodel

        lines = [
            f"torch's DataParallel against DDP on {self.slots} x {self.gpu}, by the cost model "
            "(modelled, not measured):",
            f"  {self.tiny()}",
            f"  {'rank':<5} {'wrapper':<13} {'per step':>10}   {'assumed thread starts':>21}   {'without them':>12}",
        ]
        lines += [
            f"  {r:<5} {s:<13} {step:>10}   {starts:>21}   {rest:>12}"
            for r, s, step, starts, rest in self.modelled_rows()
        ]
        flops = self.modelled()["DataParallel"].gpu.flops  # predict's default dtype is fp32
        return lines + [
            f"  assumed: {us(costmodel.PYTHON_THREAD_S)} to start each replica's thread (a round figure),",
            f"  {costmodel.EFFICIENCY:.0%} of the {self.gpu}'s FP32 peak, {flops['fp32'] / 1e12:g} TFLOP/s "
            f"(not TF32's {flops['tf32'] / 1e12:g}); neither is measured",
            "  each message: NCCL's own latency estimate (src/graph/tuning.cc), not a measurement",
            *textwrap.wrap(
                f"left out (µs each on a real GPU): {LEFT_OUT}: at these sizes only its ranking means "
                "anything, not its absolute figures",
                REPORT_WIDTH,
                initial_indent="  ",
                subsequent_indent="  ",
            ),
            f"  its DataParallel is torch.nn.DataParallel, which copies as strategy {MODEL_STRATEGY!r} does",
        ]

    def rows(self) -> list[tuple[str, int, float, float | None]]:
        """(strategy, bytes, bytes / model size, median µs or None when untimed) per strategy."""
        return [
            (c.strategy, c.bytes, c.bytes / self.model_bytes, c.median * 1e6 if c.seconds else None)
            for c in self.costs
        ]

    def status(self) -> str:
        if not self.costs:
            return NOT_MEASURED
        slots = f"{self.slots} slot{'s' * (self.slots != 1)}"
        order = self.by_bytes()
        ranked = f"{order[0].strategy!r} {order[0].bytes:,}"
        for before, c in zip(order, order[1:]):  # equal counts say so: clone and rewire copy the same bytes
            ranked += f" {'=' if c.bytes == before.bytes else '<'} {c.strategy!r} {c.bytes:,}"
        head = f"width {self.width} ({width_numel(self.width):,} parameters, {self.model_bytes:,} bytes) on {slots}"
        if not self.timed:
            return f"{head}: bytes per step, fewest first: {ranked} (counted, the same on every run; nothing timed)"
        timed = [*self.costs, *([self.reference] if self.reference is not None else [])]
        if all(len(c.seconds) < MIN_TIMED for c in timed):  # one sentence, not one per strategy
            times = min(timed, key=lambda c: len(c.seconds)).shown(self.budget_s)
        else:
            times = ", ".join(f"{c.strategy!r} {c.shown(self.budget_s)}" for c in self.costs)
            if self.reference is not None:
                times += f", one device {self.reference.shown(self.budget_s)}"
        return f"{head}: bytes per step, fewest first: {ranked}; beside them, a step on this machine: {times}"

    def headline(self) -> str:
        """The cost explorer's status, one line: the setting and which strategy copies the fewest bytes;
        every figure is in the table under it (``status()`` says them all in text)."""
        if not self.costs:
            return NOT_MEASURED
        order = self.by_bytes()
        tied = [repr(c.strategy) for c in order if c.bytes == order[0].bytes]
        names = tied[0] if len(tied) == 1 else ", ".join(tied[:-1]) + " and " + tied[-1]
        if len(tied) == len(order) and order[0].bytes == 0:
            verdict = "no strategy copies a byte" if len(tied) > 1 else f"{names} copies no bytes"
        elif len(tied) == len(order):
            verdict = f"{names} all copy {order[0].bytes:,} bytes"
        elif len(tied) > 1:
            verdict = f"{names} tie, copying the fewest bytes"
        else:
            verdict = f"{names} copies the fewest bytes"
        slots = f"{self.slots} slot{'s' * (self.slots != 1)}"
        line = (
            f"width {self.width} ({width_numel(self.width):,} parameters) on {slots}: {verdict} "
            "(counted); the table has each figure"
        )
        timed = [*self.costs, *([self.reference] if self.reference is not None else [])]
        if not self.timed:
            return line + "; nothing timed"
        if all(len(c.seconds) < MIN_TIMED for c in timed):  # how to get times: said once
            line += f"; {min(timed, key=lambda c: len(c.seconds)).shown(self.budget_s)}"
        return line

    def __repr__(self) -> str:
        return f"<CostLab {self.status()}>"
