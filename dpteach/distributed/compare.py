"""Chapter 09's comparisons, each printed with where its numbers came from.

Gradients: :func:`largest_difference` and :func:`identical` compare two sets of named gradients;
:func:`difference_line` and :func:`against_one_device` print them with their provenance (which run,
which device, how many ranks and rows), read from what the runs returned.

Costs: what a step costs on one device and under DataParallel. DDP's side runs in the ranks
(:func:`dpteach.distributed.tasks.step_times` and ``traffic``); these run in the caller's process,
on the same model, batch and step, so the numbers sit side by side.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass
from typing import Mapping, Sequence

import torch

from .. import comm
from ..data_parallel import DataParallel
from ..measure import timer
from .model import loss_fn, make_data, make_model, sgd_step

__all__ = [
    "largest_difference",
    "identical",
    "one_device",
    "on_ranks",
    "constant_factor",
    "difference_line",
    "against_one_device",
    "step_times",
    "dataparallel_traffic",
    "traffic_table",
    "modelled_steps",
    "beside_published",
    "ddp_rounds",
    "Rounds",
    "cpu_rounds",
    "CpuRounds",
    "CPU_KINDS",
]

Gradients = Mapping[str, torch.Tensor]  # parameter name -> gradient, as model.named_parameters() names them


def _same_names_and_shapes(a: Gradients, b: Gradients) -> None:
    if set(a) != set(b):
        raise ValueError(f"the two sets of gradients name different tensors: {sorted(set(a) ^ set(b))}")
    if not a:
        raise ValueError("no gradients to compare")
    for name in a:  # else the subtraction below would broadcast, and compare what is not alike
        if a[name].shape != b[name].shape:
            raise ValueError(f"{name}: shapes {tuple(a[name].shape)} and {tuple(b[name].shape)} differ")


def largest_difference(a: Gradients, b: Gradients) -> tuple[str, float]:
    """The name whose gradients differ most between ``a`` and ``b``, and that largest absolute difference.

    The maximum of ``|a - b|`` over every element of every named gradient (moved to the CPU first);
    ``a`` and ``b`` must name the same tensors, of the same shapes. 0.0 when they agree everywhere."""
    _same_names_and_shapes(a, b)
    worst = {n: (a[n].detach().cpu() - b[n].detach().cpu()).abs().max().item() for n in a}
    name = max(worst, key=worst.get)
    return name, worst[name]


def identical(a: Gradients, b: Gradients) -> bool:
    """Whether ``a`` and ``b`` hold the same gradients bit for bit: same names, shapes, dtypes, values."""
    _same_names_and_shapes(a, b)
    # torch.equal alone compares values across dtypes (1.0 in float32 equals 1.0 in float64)
    return all(a[n].dtype == b[n].dtype and torch.equal(a[n].detach().cpu(), b[n].detach().cpu()) for n in a)


def one_device(grads: Gradients, rows: int) -> str:
    """Where a one-device reference came from: ``"one device (cpu), all 8 rows"``, the device read from it."""
    devices = sorted({str(g.device) for g in grads.values()})
    return f"one device ({', '.join(devices)}), all {rows} rows"


def on_ranks(results: Sequence[dict], what: str = "DDP") -> str:
    """Where a task's gradients came from, read from what each rank returned (``backend``, ``device``,
    ``rows``, as ``tasks.gradients`` returns them): ``"DDP on 2 ranks (gloo, cpu), 4 + 4 rows"``."""
    backends = sorted({r["backend"] for r in results})
    devices = [r["device"] for r in results]
    device = devices[0] if len(set(devices)) == 1 else ", ".join(devices)
    rows = " + ".join(str(r["rows"]) for r in results)
    return f"{what} on {len(results)} ranks ({'/'.join(backends)}, {device}), {rows} rows"


def constant_factor(a: Gradients, b: Gradients, atol: float = 1e-6) -> float | None:
    """The ``c`` with ``a == c * b`` in every element of every named gradient, to ``atol``; else None.

    ``c`` is read from the elements where ``b`` is largest (the median of ``a / b`` there), then
    checked on all of them: a loss divided by the wrong count gives such a factor, exactly."""
    _same_names_and_shapes(a, b)
    flat_a = torch.cat([a[n].detach().cpu().flatten().double() for n in a])
    flat_b = torch.cat([b[n].detach().cpu().flatten().double() for n in a])
    large = flat_b.abs() >= 0.1 * flat_b.abs().max()
    if not large.any() or flat_b.abs().max() == 0:
        return None
    c = (flat_a[large] / flat_b[large]).median().item()
    return c if (flat_a - c * flat_b).abs().max().item() <= atol else None


def difference_line(a_label: str, a: Gradients, b_label: str, b: Gradients) -> str:
    """One printed comparison: ``"<a> and <b>: identical, bit for bit"``, or else the largest
    ``|a - b|`` and the gradient it is in; beyond rounding, also whether ``a`` is one constant
    times ``b`` everywhere (a divisor off by that factor)."""
    if identical(a, b):
        return f"{a_label} and {b_label}: identical, bit for bit"
    name, value = largest_difference(a, b)
    line = f"largest |{a_label} - {b_label}|: {value:.1e} (in {name})"
    if value <= 1e-5:  # rounding: say how many steps between neighbouring floats it spans
        steps = steps_apart(a[name], b[name])
        kind = str(b[name].dtype).removeprefix("torch.")
        line += f", {steps} {kind} step{'' if steps == 1 else 's'} there"
    c = constant_factor(a, b) if value > 1e-5 else None
    if c is not None:
        line += f"; everywhere {c:.4g} times {b_label}'s: off by a constant factor"
    return line


def steps_apart(a: torch.Tensor, b: torch.Tensor) -> int:
    """Where ``|a - b|`` is largest (its first such element), how many times the gap between ``|b|`` there
    and the next larger number of ``b``'s dtype it is: the number of representable steps it spans."""
    a, b = a.detach().cpu().flatten(), b.detach().cpu().flatten()
    at = (a - b).abs().argmax()
    here = b[at].abs()
    step = torch.nextafter(here, torch.tensor(float("inf"), dtype=b.dtype)) - here
    return round(((a[at] - b[at]).abs() / step).item())


def against_one_device(results: Sequence[dict], reference: Gradients, rows: int, what: str = "DDP") -> str:
    """Every rank's gradients (``results``, one dict per rank with ``grads``) against one device's
    ``reference`` over all ``rows``, then each rank against rank 0; headed by where both came from."""
    lines = [f"{on_ranks(results, what)}, against {one_device(reference, rows)}:"]
    for rank, result in enumerate(results):
        lines.append(difference_line(f"{what}, rank {rank}", result["grads"], "one device", reference))
    for rank, result in enumerate(results[1:], 1):
        lines.append(difference_line("rank 0", results[0]["grads"], f"rank {rank}", result["grads"]))
    return "\n  ".join(lines)


def step_times(
    how: str,
    hiddens: Sequence[int] = (32, 128, 512),
    depth: int = 3,
    global_batch: int = 64,
    repeats: int = 12,
    warmup: int = 3,
    devices: Sequence = ("cpu", "cpu"),
    threads: int | None = None,
) -> dict[int, float]:
    """Median seconds per training step (forward, loss, backward, plain SGD step) in this process.

    ``how`` is ``"single"`` (one model, the whole batch) or ``"dataparallel"`` (dpteach's
    DataParallel over ``devices``). Timed by ``dpteach.measure.timer``; ``threads`` sets torch's
    intra-op threads per CPU slot for the run: with ``threads=1`` each DataParallel replica gets one
    intra-op thread, as each DDP rank does (which cores those threads run on is the operating
    system's choice); ``None`` leaves PyTorch's setting (by default one intra-op thread per
    physical core).
    """
    if how not in ("single", "dataparallel"):
        raise ValueError(f"how must be 'single' or 'dataparallel', got {how!r}")
    medians = {}
    for hidden in hiddens:
        model = make_model(hidden, depth).to(torch.device(devices[0]))
        step_model = DataParallel(model, list(devices)) if how == "dataparallel" else model
        x, y = (t.to(torch.device(devices[0])) for t in make_data(global_batch))

        def step(step_model=step_model, model=model, x=x, y=y):
            loss_fn(step_model(x), y).backward()
            sgd_step(model, lr=0.01)

        medians[hidden] = timer.time_it(
            step, devices, repeats, warmup, threads=threads
        ).median  # the one timer
    return medians


def dataparallel_traffic(
    hidden: int = 16,
    depth: int = 1,
    global_batch: int = 64,
    steps: int = 3,
    devices: Sequence = ("cpu", "cpu"),
) -> dict:
    """What dpteach's DataParallel copies per training step, counted by ``dpteach.comm.traffic()``."""
    model = make_model(hidden, depth).to(torch.device(devices[0]))
    dp = DataParallel(model, list(devices))
    with comm.traffic() as seen:
        for step in range(steps):
            x, y = (t.to(torch.device(devices[0])) for t in make_data(global_batch, seed=step))
            loss_fn(dp(x), y).backward()
            sgd_step(model, lr=0.1)
    copies = Counter(c.op for c in seen.copies)
    return dict(
        copies_per_step={op: n // steps for op, n in copies.items()},
        bytes_per_step={op: n // steps for op, n in seen.by_op().items()},
        parameter_bytes=sum(p.numel() * p.element_size() for p in model.parameters()),
        rows=global_batch,  # the rows whose outputs gather moves
    )


def traffic_table(dp: dict, ddp: dict, world_size: int) -> str:
    """DataParallel's copies (``dataparallel_traffic``) and DDP's all-reduces (``tasks.traffic``) in one
    step, for N = ``world_size`` slots or ranks and a model of P bytes (``dp["parameter_bytes"]``): two
    small tables of counted bytes and calls, then, in lines of their own, what a formula computes.

    The first table: the bytes one slot or one rank moves. DataParallel's ``broadcast`` copies the model
    into each slot but slot 0 (the column says so), P bytes per slot; on GPUs its ``reduce_add`` takes P
    bytes of gradients from each onto slot 0, while CPU slots share one device and sum in place, moving
    nothing ("0 (CPU slots)"). A DDP rank's P bytes handed to all-reduce are counted (one call per
    bucket); what the backend then sends is not. The second table: the whole step, the gathered outputs
    on slot 0 and the copy calls, each count spelled out (one broadcast per parameter tensor per slot
    after slot 0, one gather call per slot's output). Under them, labelled computed: what a ring
    all-reduce sends and receives per rank, 2(N-1)P/N (nccl-tests' ``doc/PERFORMANCE.md``; a backend may
    pick another algorithm), with its value at N = 4 when N = 2, where it equals P; on CPU slots, what
    separate GPUs would send instead. A last line says what to read across the rows.
    """
    n, p = world_size, dp["parameter_bytes"]
    counted, handed = dp["bytes_per_step"], ddp["allreduce_bytes_per_step"]
    into, back = counted.get("broadcast", 0) // (n - 1), counted.get("reduce_add", 0) // (n - 1)

    def ring(ranks: int) -> int:  # what a ring all-reduce of P bytes sends, and receives, per rank
        return 2 * (ranks - 1) * handed // ranks

    def spelled(op: str, k: int) -> str:  # a copy call count beside what it counts
        if op in ("broadcast", "reduce_add") and k % (n - 1) == 0:
            return f"{op} {k} = {k // (n - 1)} params x {n - 1} slot{'s' * (n > 2)}"
        if op == "gather" and k % n == 0:
            return f"gather {k} = {k // n} per slot"
        return f"{op} {k}"

    batch = f"all {dp['rows']} rows" if dp.get("rows") else "the whole batch"
    calls = [spelled(op, k) for op, k in dp["copies_per_step"].items()]
    buckets = ddp["allreduce_calls_per_step"]
    # every cell of the two tables is counted (dpteach.comm.traffic(), DDP's comm hook); the ring's
    # bytes are a formula, so they stand in lines of their own under the tables, said to be computed
    per_rank = [
        ("counted, bytes per slot/rank", "DataParallel, each slot but 0", "DDP, each rank"),
        ("model copied in", f"P = {into:,}", "0"),
        ("gradients into all-reduce", "-", f"P = {handed:,}"),  # what the rank hands over, counted
        # what leaves a slot: DataParallel's reduce_add onto slot 0 (none between CPU slots, which
        # share a device and sum in place); what leaves a DDP rank is the backend's, not counted
        ("gradients sent", f"P = {back:,}" if back else "0 (CPU slots)", "not counted"),
    ]
    at_four = f"; at N = 4: {ring(4):,}" if n == 2 else ""
    formula = [
        "computed, not counted: a ring all-reduce of P sends 2(N-1)P/N per rank,",
        f"and receives as much: {ring(n):,} bytes at N = {n}{at_four}",
        *(["on separate GPUs each DataParallel slot would send its P to slot 0"] if not back else []),
    ]
    whole = [
        ("counted, per step", "DataParallel", "DDP, each rank"),
        ("outputs onto slot 0", f"{counted.get('gather', 0):,} bytes ({batch})", "0"),
        (
            "copy calls",
            calls[0] if calls else "0",
            f"all_reduce {buckets} = {buckets} bucket{'s' * (buckets != 1)}",
        ),
        *(("", call, "") for call in calls[1:]),
    ]

    def block(rows):  # each table aligned on its own columns
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]

    lines = [f"one step: N = {n} slots or ranks, P = {p:,} bytes of parameters", ""]
    lines += [*block(per_rank), "", *block(whole), "", *formula, ""]
    lines.append("so: DataParallel alone copies the model in and gathers the outputs, every step")
    return "\n".join(lines)


def modelled_steps(predictions: Mapping, work) -> str:
    """Modelled steps (``costmodel.predict``, by strategy) in words: each total, the part of it that is
    not GPU 0's forward and backward, and for DataParallel the gather, beside the bytes it brings.

    DataParallel's ``gather`` (``torch/nn/parallel/scatter_gather.py``) gathers every tensor of the
    output onto ``device_ids[0]``; ``work.output_bytes`` counts them all (for GPT-2 its logits and keys
    and values, ``costmodel.count_gpt2``). DDP gathers nothing: each rank computes its own loss.
    """
    mib, ms, lines = 2**20, 1e3, []
    for name, pred in predictions.items():
        compute = sum(
            p.seconds for p in pred.parts if p.lane == "GPU 0" and p.name in ("forward", "backward")
        )
        lines.append(
            f"{name}, modelled: {pred.total_s * ms:.4g} ms, of which {(pred.total_s - compute) * ms:.3g} ms"
            " is not GPU 0's forward and backward"
        )
        gather = sum(p.seconds for p in pred.parts if p.name == "gather")
        if gather:
            lines.append(
                f"  of those, {gather * ms:.3g} ms the gather of {work.output_bytes / mib:,.0f} MiB of"
                f" outputs onto GPU 0 (the model: {work.param_bytes / mib:,.0f} MiB)"
            )
    dp, ddp = predictions["DataParallel"], predictions["DDP"]
    lines.append(f"DataParallel / DDP step, modelled: {dp.total_s / ddp.total_s:.3f}")
    return "\n".join(lines)


def beside_published(m) -> str:
    """A published measurement (``dpteach.measure.published.Measurement``) beside the cost model: first
    how close the model came, then the rows (``published.compare``), then where it came from, in one
    short footnote line; the source's full note stays in ``m.hardware`` and ``m.citation``."""
    from ..measure import published

    rows = published.compare(m)
    ratios = [r.ratio for r in rows if r.ratio is not None]
    per = f"{m.batch} per GPU" if m.scaling == "weak" else f"{m.batch} in all"
    lines = [f"{m.model}, {m.strategy}, batch {per}, measured [1] beside the model:"]
    if ratios:
        worst = max(abs(x - 1) for x in ratios)
        lines.append(f"  the model's step is within {worst:.0%} of every measured one")
    width = max(len(m.n_label(r.n)) for r in rows)
    lines.append(f"  {'n':>{width}}  {'measured ms':>12}  {'modelled ms':>12}  {'measured/modelled':>18}")
    for r in rows:
        model = "-" if r.modelled_s is None else f"{r.modelled_s * 1e3:12.1f}"
        ratio = "-" if r.ratio is None else f"{r.ratio:17.2f}x"
        lines.append(f"  {m.n_label(r.n):>{width}}  {r.measured_s * 1e3:12.1f}  {model:>12}  {ratio:>18}")
    if m.ddp_one_gpu_s is not None:
        plain = dict(m.points)[1]
        lines.append(f"  DDP on 1 GPU: {m.ddp_one_gpu_s * 1e3:.1f} ms measured, {m.ddp_one_gpu_s / plain - 1:+.1%}"
                     " over the plain step (the model adds nothing at n = 1)")  # fmt: skip
    machine = m.hardware.split(" (")[0].split(";")[0]  # the machine in a few words; the rest is in m.hardware
    gpu = f"{m.gpu} (inferred: not stated beside these figures)" if "inferred" in m.hardware else m.gpu
    software = m.hardware.rsplit("; ", 1)[-1]
    software = f"; {software}" if software.startswith("torch") else ""
    lines.append(f"[1] {m.citation.split(' (')[0]}; {machine}{software}; modelled as {gpu}")
    return "\n".join(lines)


@dataclass(frozen=True)
class Rounds:
    """Per-round median step seconds of one process and of DDP, timed in turns, and their ratio.

    One statistic throughout: the per-round ratio (both sides timed in the same round), summed up by its
    median and its range. The median is a real round's (the lower middle one for an even count), and the
    milliseconds printed beside it are that round's, so they divide to the ratio printed.
    """

    single: tuple[float, ...]
    ddp: tuple[float, ...]
    ranks: int = 2

    @property
    def ratios(self) -> tuple[float, ...]:
        """One process's step over DDP's, round by round: above 1, DDP's step took less time."""
        return tuple(s / d for s, d in zip(self.single, self.ddp))

    @property
    def as_long(self) -> tuple[float, ...]:
        """DDP's step over one process's, round by round: how many times as long DDP's step took."""
        return tuple(d / s for s, d in zip(self.single, self.ddp))

    @property
    def median_round(self) -> int:
        """The index of the round whose ratio is the median (the lower middle one for an even count)."""
        return self.as_long.index(statistics.median_low(self.as_long))

    def _median_round_ms(self) -> str:
        i = self.median_round
        return (
            f"one process {self.single[i] * 1e3:.1f} ms, DDP on {self.ranks} ranks {self.ddp[i] * 1e3:.1f} ms"
        )

    def summary(self) -> str:
        """The median per-round ratio, their smallest and largest, and the median round's steps: figures only.

        No verdict: on a shared or small machine the rounds move with its load, and a spread says how far
        they moved, not why.
        """
        r, i = sorted(self.ratios), self.median_round
        return (
            f"one process / DDP step time: median {self.ratios[i]:.2f}x over {len(r)} rounds, "
            f"from {r[0]:.2f}x to {r[-1]:.2f}x (the median round: {self._median_round_ms()})"
        )

    def in_words(self) -> str:
        """The direction, in words: the median per-round ratio of DDP's step to one process's, the rounds'
        spread, and the median round's two steps. A figure of this machine, not a verdict on DDP."""
        r, i = sorted(self.as_long), self.median_round
        return (
            f"DDP on {self.ranks} ranks took {self.as_long[i]:.2f}x as long as one process"
            f" (median of {len(r)} per-round ratios, from {r[0]:.2f}x to {r[-1]:.2f}x;"
            f" the median round: {self._median_round_ms()})"
        )


def ddp_rounds(
    ranks, hidden: int = 512, depth: int = 3, global_batch: int = 128, rounds: int = 5, repeats: int = 3
) -> Rounds:
    """One process of one intra-op thread against DDP's ranks of one intra-op thread each, in turns.

    Each round times ``repeats`` steps of one process (the whole batch) and then ``repeats`` DDP steps
    on ``ranks`` (each rank its shard), after a thrown-away round. The same model, batch and step as
    ``step_times``; a DDP step is the slowest rank's.
    """
    single, ddp = [], []
    for i in range(rounds + 1):
        one = step_times(
            "single", (hidden,), depth, global_batch, repeats, warmup=1, devices=["cpu"], threads=1
        )
        many = ranks.run("step_times", (hidden,), depth, global_batch, repeats, warmup=1)[0]
        if i:  # round 0 is thrown away: the first steps pay for memory and threads starting
            single.append(one[hidden])
            ddp.append(many[hidden])
    return Rounds(tuple(single), tuple(ddp), ranks=ranks.world_size)


# The four ways of running one step on this machine's CPU that cpu_rounds times, in this order in
# every round; the first is the one the others are measured against.
CPU_KINDS = (
    "one process, 1 thread",
    "DataParallel, 2 CPU slots",
    "DDP, 2 ranks",
    "one process, 2 threads",
)
# how step_times runs the kinds that run in this process: how, devices, intra-op threads
_IN_THIS_PROCESS = {
    CPU_KINDS[0]: ("single", ["cpu"], 1),
    CPU_KINDS[1]: ("dataparallel", ["cpu", "cpu"], 1),  # the slots take turns on the calling thread
    CPU_KINDS[3]: ("single", ["cpu"], 2),
}


@dataclass(frozen=True)
class CpuRounds:
    """Per-round median step seconds of each of :data:`CPU_KINDS`, timed in turns, and their ratios.

    ``seconds`` maps a kind to one median per round. The statistic is per round, both sides timed in
    the same round: the first kind's step over the other's (above 1, the other's step took less time),
    summed up by its median and its range. The range alone decides what a kind's rounds show
    (:meth:`reading`): a gap counts only when every round lies on one side of 1.
    """

    seconds: Mapping[str, tuple[float, ...]]
    hidden: int
    depth: int
    global_batch: int

    @property
    def baseline(self) -> str:
        return next(iter(self.seconds))

    def ratios(self, kind: str) -> tuple[float, ...]:
        """The baseline's step over ``kind``'s, round by round."""
        return tuple(b / k for b, k in zip(self.seconds[self.baseline], self.seconds[kind]))

    def verdict(self, kind: str) -> str:
        """What ``kind``'s rounds show against the baseline, read from their whole range, not the median:
        ``"faster"`` when every round's ratio is above 1, ``"slower"`` when every one is below 1, each
        read as :meth:`lines` prints it (two decimals: 1.004 is 1.00, no side of 1),
        ``"no difference"`` when the range covers 1 (the spread is as large as the gap), and
        ``"one round"`` when there is no spread to judge by."""
        r = self.ratios(kind)
        if len(r) < 2:
            return "one round"
        # read at the two decimals :meth:`lines` prints, so a round shown as 1.00x is never "above 1"
        if round(min(r), 2) > 1:
            return "faster"
        if round(max(r), 2) < 1:
            return "slower"
        return "no difference"

    def reading(self, kind: str) -> str:
        """:meth:`verdict` in words, with the reason it rests on."""
        return {
            "faster": "faster: all rounds above 1",
            "slower": "slower: all rounds below 1",
            "no difference": "no difference measurable: its range covers 1",
            "one round": "one round only: no spread to judge by",
        }[self.verdict(kind)]

    def lines(self) -> list[str]:
        """Each kind's median step in ms over the rounds and its range; then, per kind beside the
        baseline, the median per-round ratio, its range, and what that range shows (:meth:`reading`)."""
        n = len(next(iter(self.seconds.values())))
        width = max(len(kind) for kind in self.seconds) + 2
        what = f"MLP {self.depth} x {self.hidden}, batch {self.global_batch}"
        out = [f"median step over {n} rounds (and range), {what}:"]
        for kind, secs in self.seconds.items():
            ms = sorted(s * 1e3 for s in secs)
            out.append(f"  {kind:<{width}}{statistics.median(ms):7.1f} ms ({ms[0]:.1f} to {ms[-1]:.1f})")
        out.append(f"{self.baseline}'s step / each way's, per round (above 1: that way took less time):")
        for kind in self.seconds:
            if kind != self.baseline:
                r = sorted(self.ratios(kind))
                out.append(
                    f"  {kind:<{width}}{statistics.median(r):5.2f}x ({r[0]:.2f}x to {r[-1]:.2f}x)  "
                    f"{self.reading(kind)}"
                )
        return out


def cpu_rounds(
    ranks, hidden: int = 512, depth: int = 3, global_batch: int = 4096, rounds: int = 5, repeats: int = 3
) -> CpuRounds:
    """Time :data:`CPU_KINDS` in turns, ``rounds`` times, after a thrown-away round of one step each.

    In each round every kind takes ``repeats`` steps (forward, loss, backward, SGD step; after one
    warm-up step) of the same model on the same ``global_batch`` rows: one process with one intra-op
    thread; dpteach's DataParallel on two CPU slots, one thread (its slots take turns on the calling
    thread); DDP on ``ranks``, one intra-op thread per rank, each rank its shard, a step the slowest
    rank's (``tasks.step_times``); one process with two intra-op threads. Each kind's median step is
    one round's figure.
    """

    def timed(kind: str, n: int) -> float:
        if kind == "DDP, 2 ranks":
            return ranks.run("step_times", (hidden,), depth, global_batch, n, warmup=1)[0][hidden]
        how, devices, threads = _IN_THIS_PROCESS[kind]
        return step_times(how, (hidden,), depth, global_batch, n, 1, devices, threads=threads)[hidden]

    seconds: dict[str, list[float]] = {kind: [] for kind in CPU_KINDS}
    for kind in CPU_KINDS:  # a thrown-away round: the first steps pay for memory and threads starting
        timed(kind, 1)
    for _ in range(rounds):
        for kind in CPU_KINDS:
            seconds[kind].append(timed(kind, repeats))
    return CpuRounds({k: tuple(v) for k, v in seconds.items()}, hidden, depth, global_batch)
