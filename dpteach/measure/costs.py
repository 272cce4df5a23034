"""What replication costs: bytes moved, counted by ``dpteach.comm``, not estimated.

Chapters 06 and 08 use these; they are small on purpose so that other measurements can reuse them.
Seconds, where a caller wants them, come from the one timer, ``dpteach.measure.timer``.

* ``state_nbytes(module)``: bytes of a module's parameters and buffers, each tensor once.
* ``step_traffic(model, x, devices, strategy)``: every copy one DataParallel step makes.
* ``check_step_counts(traffic, model, x, devices)``: those copies against the chapter's formulas,
  printed row by row.
* ``clone_then_to`` / ``to_device``: one tensor copied the pre-#20995 way (two copies, as onto another
  device) and the fixed way (one). Both always copy, even onto the tensor's own device, where torch's
  ``.to`` would copy nothing: on one device they make two copies against one, to count or to time.
* ``copy_per_tensor`` / ``copy_coalesced``: many tensors copied one by one, or in flat buckets.
* ``copy_calls(ways, counts, total_elements, device)``: how many copies each way makes, counted.
* ``CountCopies()``: a context that names every copy torch itself makes inside it (``clone``,
  ``_to_copy``, ``copy_``), for code that does not go through ``dpteach.comm``.
* ``plot_bytes(traffic, ax, model_bytes=...)``: chapter 06's bytes per step, one model's bytes dashed.
* ``between_gpus_bytes(work, n)`` / ``plot_between_gpus(work, ns, gpu)``: a cost-model workload's step
  between ``n`` distinct GPUs, by operation: its bytes by chapter 06's rule, and the moves' time
  modelled on one named GPU profile (``costmodel.predict``), labelled so.
  ``plot_timings(xs, timings, ax)``: timings drawn as medians with the middle half of the runs as the
  spread, never as a verdict.
"""

from __future__ import annotations

import copy
from typing import Callable, Mapping, Sequence

import torch
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.utils._python_dispatch import TorchDispatchMode

from .. import comm
from .._devices import as_device
from ..data_parallel import mean_square, step

__all__ = [
    "state_nbytes",
    "step_traffic",
    "check_step_counts",
    "clone_then_to",
    "to_device",
    "copy_per_tensor",
    "copy_coalesced",
    "copy_calls",
    "COPIES",
    "CountCopies",
    "OP_COLOURS",
    "OP_WORDS",
    "plot_bytes",
    "between_gpus_bytes",
    "plot_between_gpus",
    "plot_replicate",
    "plot_timings",
    "seconds_label",
]


def state_nbytes(module: nn.Module) -> dict[str, int]:
    """Bytes of ``module``'s parameters and of its buffers, each distinct tensor counted once."""
    return {
        "parameters": sum(comm.nbytes(p) for p in module.parameters()),
        "buffers": sum(comm.nbytes(b) for b in module.buffers()),
    }


def step_traffic(
    model: nn.Module,
    x: torch.Tensor,
    devices: Sequence,
    strategy="broadcast",
    loss_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> comm.Traffic:
    """Every copy dpteach makes in one DataParallel step of ``model`` on ``x``: forward and backward.

    The loss is ``loss_fn(output)`` (default: mean of squares); gradients are left in ``model``.
    """
    with comm.traffic() as meter:  # one slot runs the module itself, as DataParallel does
        step(model, x, devices, strategy=strategy, loss_fn=loss_fn or mean_square, replicate_one_slot=False)
    return meter


def check_step_counts(
    traffic: Mapping[str, comm.Traffic], model: nn.Module, x: torch.Tensor, devices: Sequence
) -> None:
    """Check one step per strategy (``traffic[strategy]``, from ``step_traffic``) against chapter 06's
    formulas, and print each row checked. Raises ``AssertionError`` naming the strategy, the operation
    and what differs.

    A model copy is one copy per tensor: ``T`` tensors, ``P + B`` bytes. Of the ``N`` slots, ``away``
    are on another device than ``devices[0]``.

    * ``"broadcast"``: ``(N - 1)·(P + B)`` bytes in ``(N - 1)·T`` copies; slot 0 shares the model. Between
      devices it copies per bucket, not per tensor, so only its bytes are checked.
    * ``"clone"``, ``"rewire"``: ``N·(P + B)`` bytes of ``"clone"`` in ``N·T`` copies, slot 0 included;
      then ``away·(P + B)`` of ``"to"`` in ``away·T`` copies.
    * all three: ``"gather"``, the output's bytes in ``N`` pieces, one per slot.
    * nothing else on one device; between devices, only the batch's pieces (``"scatter"``), the
      gradients' sums (``"reduce_add"``) and their packing (``"pack"``).
    """
    slots = [as_device(d) for d in devices]
    n, away = len(slots), sum(d != slots[0] for d in slots)
    params, buffers = list(model.parameters()), list(model.buffers())
    T, size = len(params) + len(buffers), sum(state_nbytes(model).values())
    out = copy.deepcopy(model).to("meta")(x.to("meta"))  # the output's shape, without running the model
    gathered = comm.nbytes(out)
    print(
        f"one model copy: T = {T} tensors ({len(params)} parameters + {len(buffers)} buffers), "
        f"P + B = {size:,} bytes; N = {n} slots"
    )
    for strategy, t in traffic.items():
        made = {op: [c for c in t.copies if c.op == op] for op in t.by_op()}
        # (operation, bytes formula, bytes, copies formula, copies); None: per bucket, not checked
        if strategy == "broadcast":
            per_tensor = None if away else (n - 1) * T
            rows = [("broadcast", "(N - 1)·(P + B)", (n - 1) * size, "(N - 1)·T", per_tensor)]
        else:
            rows = [("clone", "N·(P + B)", n * size, "N·T", n * T)]
            rows += [("to", "away·(P + B)", away * size, "away·T", away * T)] if away else []
        rows.append(("gather", "the output", gathered, "N", n))
        for i, (op, formula, nbytes, counted, count) in enumerate(rows):
            got = made.pop(op, [])
            moved = sum(c.nbytes for c in got)
            assert moved == nbytes, f"{strategy} {op!r}: {moved:,} bytes, {formula} gives {nbytes:,}"
            assert count is None or len(got) == count, (
                f"{strategy} {op!r}: {len(got)} copies, {counted} gives {count}"
            )
            copies = "per bucket" if count is None else f"in {counted} = {count} copies"
            print(f"{strategy if i == 0 else '':<10} {op!r:<12} {formula:<16} = {nbytes:>9,} bytes {copies}")
        crossing = {"scatter", "reduce_add", "pack"} if away else set()
        assert set(made) <= crossing, f"{strategy}: unexpected copies {sorted(set(made) - crossing)}"
    if away:
        print(
            f"{away} of the {n} slots are on another device than {slots[0]}, so clone and rewire also copied "
            f"{away * size:,} bytes with .to, and the batch's pieces and the gradients' sums crossed"
        )
    else:
        print(
            f"nothing else: all {n} slots are on {slots[0]}, so no copy crossed devices "
            '(no "to", "scatter" or "reduce_add" rows)'
        )
    print("in all: " + ", ".join(f"{s} {len(t.copies)} copies" for s, t in traffic.items()))


def clone_then_to(tensor: torch.Tensor, device) -> torch.Tensor:
    """``Cloneable::clone`` before PR #20995: a full copy where the tensor is, then a second onto ``device``.

    The destination is always treated as another memory, even on the same device, so the second
    copy (the transfer) happens and can be timed on a laptop.
    """
    data = comm.copy_to(tensor, tensor.device, "clone")  # COST (#20995): this copy is thrown away ...
    return comm.copy_to(data, as_device(device), "to")  # ... once this one exists


def to_device(tensor: torch.Tensor, device) -> torch.Tensor:
    """``Cloneable::clone`` after PR #20995: one copy, straight onto ``device``.

    Always a real copy: onto the tensor's own device it clones, where torch's ``.to`` would hand back
    the tensor itself. So beside ``clone_then_to`` it times two copies against one on any machine.
    """
    return comm.copy_to(tensor, as_device(device), "to")


def copy_per_tensor(tensors: Sequence[torch.Tensor], device) -> list[torch.Tensor]:
    """Copy each tensor on its own: one copy per tensor."""
    device = as_device(device)
    return [comm.copy_to(t, device, "per_tensor") for t in tensors]


def copy_coalesced(
    tensors: Sequence[torch.Tensor], device, buffer_size: int = comm.BUFFER_SIZE
) -> list[torch.Tensor]:
    """Copy tensors in flat buckets of up to ``buffer_size`` bytes (a larger tensor is a bucket of its
    own, never split): per bucket one local ``"pack"`` pass (flattening) and one ``"coalesced"`` copy. A
    bucket of one contiguous tensor needs no pack: torch's flatten returns it as a view.

    ``torch.cuda.comm.broadcast_coalesced`` does this between GPUs (10 MiB buckets): fewer, larger
    copies, paid for by flattening first (one more pass over the data).
    """
    device = as_device(device)
    tensors = list(tensors)
    out: list[torch.Tensor | None] = [None] * len(tensors)
    for bucket in comm._buckets(tensors, buffer_size):  # by dtype, by index: safe from CPU to GPU and back
        chunk = [tensors[i] for i in bucket]
        packed = _flatten_dense_tensors(chunk)  # a full local copy: recorded, so it can be counted ...
        if comm._packs(chunk):  # ... unless the bucket is one contiguous tensor, flattened into a view
            comm.record("pack", comm.nbytes(packed), packed.device, packed.device)
        flat = comm.copy_to(packed, device, "coalesced")
        for i, t in zip(bucket, _unflatten_dense_tensors(flat, chunk)):
            out[i] = t.data  # .data: own version counters
    return out


def copy_calls(
    ways: Sequence[Callable], counts: Sequence[int], total_elements: int, device, dtype=torch.float32
) -> dict[str, list[int]]:
    """For each way of copying and each count ``k``: the copies it sends of ``k`` tensors holding
    ``total_elements`` together (``Traffic.transfers``: packing passes are local and not counted
    here), counted by ``comm.traffic()``. The same on every run."""
    calls: dict[str, list[int]] = {way.__name__: [] for way in ways}
    for k in counts:
        tensors = [torch.zeros(total_elements // k, dtype=dtype) for _ in range(k)]
        for way in ways:
            with comm.traffic() as meter:
                way(tensors, device)
            calls[way.__name__].append(len(meter.transfers))
    return calls


COPIES = ("clone", "_to_copy", "copy_")  # the aten operations that write a tensor's data somewhere new


class CountCopies(TorchDispatchMode):
    """Sees every aten operation run inside it; keeps the names of the ones that copy data.

    ``with CountCopies() as counted: tensor.clone().to("meta")`` leaves ``counted.copies ==
    ["clone", "_to_copy"]``. It counts what torch runs, where ``comm.traffic()`` counts what dpteach
    records: ``tensor.to(tensor.device)`` runs no copy (torch hands back the tensor itself).
    """

    def __init__(self) -> None:
        super().__init__()
        self.copies: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in COPIES:
            self.copies.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


# One colour per copying operation (``comm.traffic()``'s ops), in every figure of the copies: the bug's
# extra copy, "clone", in red; the moves the cost model also draws in its colours (costmodel.PARTS). The
# widgets' bar charts (widgets/pictures.py) use these too.
OP_COLOURS = {
    "clone": "#d62728",
    "to": "#f4a3a3",
    "broadcast": "#1f77b4",
    "scatter": "#ff7f0e",
    "gather": "#8c564b",
    "reduce_add": "#17becf",
    "pack": "#999999",
}
# What each operation copies, as a legend says it: the operation's own name first, then what it carries,
# so that a colour called "clone" or "broadcast" reads as an operation, never as the strategy of that name
OP_WORDS = {
    "clone": "clone(): a copy on the tensor's own device",
    "to": ".to(): a copy onto another device",
    "broadcast": "broadcast: model copies onto the other slots",
    "scatter": "scatter: the batch, cut into pieces",
    "gather": "gather: each slot's output onto slot 0",
    "reduce_add": "reduce_add: gradients summed onto slot 0",
    "pack": "pack: flattening into buckets, locally",
}


def plot_bytes(traffic: dict[str, comm.Traffic], ax=None, title: str = "", model_bytes: int | None = None):
    """Stacked bars: the bytes one step copied, per strategy, by operation (kB), coloured by ``OP_COLOURS``.

    ``model_bytes``: one model's bytes, ``P + B``, drawn as a dashed line, so that each bar reads as so
    many model copies."""
    import matplotlib.pyplot as plt

    ax = ax or plt.subplots(figsize=(8.5, 3.2))[1]
    ops = sorted({op for t in traffic.values() for op in t.by_op()})
    bottom = [0.0] * len(traffic)
    words = {}  # each bar container's label (the operation) -> its legend entry (what it copies)
    for op in ops:
        heights = [t.by_op().get(op, 0) / 1e3 for t in traffic.values()]
        thin = max(heights) < 0.01 * max(bottom + heights)  # a few kB on a bar of hundreds: named, not seen
        label = f"{op} ({max(heights):.1f} kB, too thin to see)" if thin else op
        words[label] = OP_WORDS.get(op, op) + (f"\n({max(heights):.1f} kB, too thin to see)" if thin else "")
        ax.bar(list(traffic), heights, bottom=bottom, color=OP_COLOURS.get(op), label=label)
        bottom = [b + h for b, h in zip(bottom, heights)]
    if model_bytes is not None:
        ax.axhline(
            model_bytes / 1e3,
            color="black",
            linestyle="--",
            linewidth=1.2,
            label=f"one model, P + B ({model_bytes / 1e3:,.1f} kB)",
        )
    ax.set_ylabel("kB copied in one step")
    ax.set_xlabel("strategy (one bar each)")
    ax.set_title(title)
    handles, labels = ax.get_legend_handles_labels()
    bars = [i for i, h in enumerate(handles) if h in ax.containers]  # the operations, then the dashed line
    order = bars + [i for i in range(len(handles)) if i not in bars]
    ax.legend(
        [handles[i] for i in order],
        [words.get(labels[i], labels[i]) for i in order],
        title="colour: the copying operation",
        loc="upper left",
        bbox_to_anchor=(1.01, 1),
    )
    ax.figure.tight_layout()
    return ax


# The moves of a step between distinct GPUs, in step order, with the cost model's name for each
# (costmodel.PARTS) where it differs from comm.traffic()'s: replicate's copies are "broadcast",
# the gradients' sum "reduce_add", reduce_add_coalesced's flattening "pack"
_BETWEEN = {
    "scatter": "scatter",
    "broadcast": "replicate",
    "gather": "gather",
    "scatter grad": "scatter grad",
    "pack": "flatten",
    "reduce_add": "reduce",
}
_BETWEEN_WORDS = OP_WORDS | {"scatter grad": "scatter grad: the output's gradient, back out"}


def between_gpus_bytes(work, n: int) -> dict[str, int]:
    """The bytes one DataParallel step of ``work`` (a ``costmodel.Workload``) moves between ``n`` distinct
    GPUs, by operation, all links together: chapter 06's rule, ``(N - 1)·P`` of model copies and
    ``(N - 1)·P`` of gradients (a workload counts parameters only: no buffers), plus what the rule leaves
    out, the batch's and the output's pieces that are not GPU 0's own, ``(N - 1)/N`` of them, and the
    output's gradient sent back. The local ``"pack"`` crosses no link and is not here."""
    away = (n - 1) / n  # every piece but GPU 0's own crosses a link
    return {
        "scatter": round(work.input_bytes * away),
        "broadcast": (n - 1) * work.param_bytes,
        "gather": round(work.output_bytes * away),
        "scatter grad": round(work.output_grad_bytes * away),
        "reduce_add": (n - 1) * work.param_bytes,
    }


def plot_between_gpus(work, ns: Sequence[int] = (4, 8), gpu: str = "A100-SXM", title: str = ""):
    """One DataParallel step of ``work`` between distinct GPUs, one bar per ``n`` in ``ns``, stacked by
    operation in ``OP_COLOURS``: on the left its bytes (``between_gpus_bytes``), on the right the time
    of those moves, modelled on the profile ``gpu`` by ``costmodel.predict`` (one GPU's share of the
    flattening, which runs on every GPU side by side). The compute, forward and backward, is not drawn:
    its modelled time is written above each bar. Every label of the right panel says "modelled" and
    names the profile."""
    import matplotlib.pyplot as plt

    from . import costmodel

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 4.6))
    names = [f"N = {n}" for n in ns]
    preds = [costmodel.predict(work, gpu, n) for n in ns]
    sizes = [between_gpus_bytes(work, n) for n in ns]
    per_gpu = {"flatten", "forward", "backward"}  # parts each GPU runs at once: one GPU's share counts
    seconds = [
        {op: p.seconds(part) / (p.n if part in per_gpu else 1) for op, part in _BETWEEN.items()}
        for p in preds
    ]
    handles = {}
    for ax, values, scale in ((left, sizes, 1e9), (right, seconds, 1e-3)):
        bottom = [0.0] * len(ns)
        tallest = max(sum(v.values()) for v in values) / scale
        for op in _BETWEEN:
            heights = [v.get(op, 0) / scale for v in values]
            if not any(heights):
                continue
            bars = ax.bar(names, heights, bottom=bottom, color=OP_COLOURS.get(op, "#e377c2"), width=0.6)
            thin = max(heights) < 0.01 * tallest  # under 1% of the tallest bar: named, not seen
            if op not in handles or not thin:
                handles[op] = (bars, _BETWEEN_WORDS[op] + (" (too thin to see)" if thin else ""))
            bottom = [b + h for b, h in zip(bottom, heights)]
        ax.set_ylim(0, 1.25 * tallest)
    for i, p in enumerate(preds):  # the compute the right panel leaves out, above each bar
        compute = (p.seconds("forward") + p.seconds("backward")) / p.n
        right.annotate(f"+ {compute * 1e3:,.0f} ms of compute\n(modelled, not drawn)", (i, bottom[i]),
                       xytext=(0, 4), textcoords="offset points", ha="center", fontsize=7)  # fmt: skip
    left.set_ylabel("GB across the links, one step")
    left.set_title("bytes of each move, all links together", fontsize=9)
    profile = costmodel.GPUS[gpu]
    right.set_ylabel("ms (modelled)")
    right.set_title(f"time of those moves, modelled on {gpu} ({profile.link})", fontsize=9)
    order = [op for op in _BETWEEN if op in handles]
    fig.legend([handles[op][0] for op in order], [handles[op][1] for op in order],
               title="colour: the operation", loc="lower center", bbox_to_anchor=(0.5, 0.05), ncol=2, fontsize=8)  # fmt: skip
    fig.text(
        0.5,
        0.01,
        f"time modelled on {gpu}, {costmodel.LEFT_OUT}: broadcast and reduce_add as NCCL rings, about P\n"
        "out of or into GPU 0 at any N; gather as plain copies into GPU 0; compute at an assumed "
        f"{costmodel.EFFICIENCY:.0%} of fp32 peak",
        ha="center",
        fontsize=7,
    )
    if title:
        fig.suptitle(f"{title} (bytes by the rule; time modelled on {gpu})", fontsize=10)
    fig.tight_layout(rect=(0, 0.27, 1, 1))
    return fig


def plot_replicate(
    slot_counts: Sequence[int], per_slots: Mapping[str, Sequence[int]], mark: int = 4, ax=None
):
    """Bytes ``replicate`` alone copied against the number of slots, one line per strategy, coloured by
    ``OP_COLOURS`` (``"clone"``'s line stands for ``"rewire"`` too), and the gap between the lines at
    ``mark`` slots marked: the one model copy ``"clone"`` makes for slot 0 and ``"broadcast"`` does not,
    the same at every number of slots. The title names the slots, not the answer the figure shows."""
    import matplotlib.pyplot as plt

    ax = ax or plt.subplots(figsize=(6, 3.2))[1]
    for strategy, values in per_slots.items():
        label = "clone and rewire" if strategy == "clone" else strategy
        ax.plot(slot_counts, [v / 1e3 for v in values], marker="o", label=label, color=OP_COLOURS[strategy])
    if {"clone", "broadcast"} <= set(per_slots) and mark in slot_counts:
        at = list(slot_counts).index(mark)
        high, low = per_slots["clone"][at] / 1e3, per_slots["broadcast"][at] / 1e3
        ax.annotate("", xy=(mark, high), xytext=(mark, low), arrowprops={"arrowstyle": "<->"})
        ax.annotate(
            f"slot 0's copy: {high - low:,.0f} kB,\nthe same gap at every N",
            xy=(mark, (high + low) / 2),
            xytext=(mark + 0.6, low / 2),
            arrowprops={"arrowstyle": "->"},
        )
    ax.set_xlabel("number of slots N")
    ax.set_ylabel("kB copied by replicate() alone")
    ax.set_title(f"replicate() alone, on {min(slot_counts)} to {max(slot_counts)} slots")
    ax.legend(loc="upper left")
    ax.figure.tight_layout()
    return ax


def plot_timings(
    xs: Sequence,
    timings: dict[str, Sequence],
    ax=None,
    xlabel: str = "",
    title: str = "",
    log: bool = True,
    xticklabels: Sequence[str] | None = None,
):
    """Median seconds per call against ``xs``, one line per name, with the middle half of the runs
    (``Timing.quartiles``) as error bars: the learner's own figure, with its spread.

    On log axes the ticks are labelled in plain text: the x ticks sit at ``xs`` (labelled
    ``xticklabels``, or the numbers), the y ticks read "20 µs", "1 ms". matplotlib's own log labels
    are mathtext (``$10^{-4}$``), and drawing any mathtext looks up the STIX fonts: where those are
    not installed, every such figure printed findfont warnings."""
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    ax = ax or plt.subplots(figsize=(6, 3.2))[1]
    for (name, series), style in zip(timings.items(), ["-", "--", ":", "-."]):
        medians = [t.median for t in series]
        low = [t.median - t.quartiles[0] for t in series]
        high = [t.quartiles[1] - t.median for t in series]
        ax.errorbar(xs, medians, yerr=[low, high], ls=style, marker="o", lw=2, capsize=3, label=name)
    if log:
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(list(xs), xticklabels or [f"{x:,}" for x in xs])
        ax.xaxis.set_minor_locator(ticker.NullLocator())
        ax.yaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda s, _: seconds_label(s)))
        ax.yaxis.set_minor_formatter(ticker.NullFormatter())
    ax.set_xlabel(xlabel)
    ax.set_ylabel("time per call (median;\nbars: middle half of the runs)")
    ax.set_title(title)
    ax.legend()
    ax.figure.tight_layout()
    return ax


def seconds_label(seconds: float) -> str:
    """A duration as a short plain-text label: ``2e-05`` -> ``"20 µs"``, ``0.0015`` -> ``"1.5 ms"``."""
    unit, scale = ("s", 1.0) if seconds >= 1 else ("ms", 1e-3) if seconds >= 1e-3 else ("µs", 1e-6)
    return f"{seconds / scale:.3g} {unit}"
