"""Scaling: one training step on 1, 2, ... N slots, against the plain step, and against torch's DataParallel.

* ``slot_lists()``: what n = 1 ... N means here. Two or more GPUs: ``cuda:0`` ... ``cuda:n-1``. One
  GPU: 1 to 4 slots on ``cuda:0``, which share one card, so they show the overhead, not a speed-up.
  CPU: 1 to ``min(4, cores)`` CPU slots, each timed with one intra-op thread (``timer``'s rule).
* ``steps(model, x, lists)``: one training step per name (``"plain"``, ``"dpteach 2"``, ``"torch 2"``),
  ``torch.nn.DataParallel`` only where the slots are distinct GPUs, one replica each, as it is used.
  Two lists of one length are told apart by their slots (``names``): ``"dpteach 2 (cuda:0-1)"`` and
  ``"dpteach 2 (2 × cuda:0)"``, so neither overwrites the other.
* ``scaling(...)``: times them in turns (medians) and returns plain data, the ``"scaling"`` entry of
  ``python -m dpteach.measure.bench``'s ``bench.json``.
* ``label(env)``: where a run was measured, in words. Results measured on GPU machines are loaded by
  ``dpteach.measure.published``, beside the cost model.
* ``draw(mine)``: step time and speed-up against n, the learner's own.
* ``draw_rounds(times)`` and ``against_plain(times)``: every timed step as a dot, and each step's median
  and middle half beside the plain step's: figures with their spread, no verdict.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch import nn

from .._devices import DeviceLike, as_devices
from ..data_parallel import DataParallel, mean_square
from .timer import Timing, time_in_turns

__all__ = [
    "DATA",
    "slot_lists",
    "compact",
    "names",
    "steps",
    "result",
    "scaling",
    "table",
    "label",
    "draw",
    "step_label",
    "draw_rounds",
    "against_plain",
]

DATA = Path(__file__).with_name("data")  # GPU profiles and measurements, shipped in the wheel
MAX_SHARED_SLOTS = 4  # slots on one GPU or on the CPU: enough to see the overhead grow


def cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def slot_lists(max_slots: int | None = None) -> list[list[torch.device]]:
    """The slot lists for n = 1, 2, ...: every GPU when there are two or more, else slots sharing one device."""
    if torch.cuda.is_available() and torch.cuda.device_count() > 1:
        n, make = torch.cuda.device_count(), lambda k: [torch.device("cuda", i) for i in range(k)]
    elif torch.cuda.is_available():
        n, make = MAX_SHARED_SLOTS, lambda k: [torch.device("cuda", 0)] * k
    else:  # one core per CPU slot: more slots than cores would measure the slots waiting for each other
        n, make = min(MAX_SHARED_SLOTS, cores()), lambda k: [torch.device("cpu")] * k
    n = n if max_slots is None else min(n, max_slots)
    return [make(k) for k in range(1, max(n, 1) + 1)]


def _parse(slots: Sequence[DeviceLike]) -> list[torch.device]:
    """Devices as written, checked against nothing here: a result may come from another machine."""
    return [torch.device("cuda", d) if isinstance(d, int) else torch.device(d) for d in slots]


def compact(slots: Sequence[DeviceLike]) -> str:
    """A slot list in a few characters: ``"cpu"``, ``"2 × cpu"``, ``"cuda:0-3"``, else the devices listed."""
    devices = _parse(slots)
    text = [str(d) for d in devices]
    if len(set(text)) == 1:
        return text[0] if len(text) == 1 else f"{len(text)} × {text[0]}"
    first = devices[0].index or 0
    if all(d.type == "cuda" for d in devices) and [d.index for d in devices] == list(
        range(first, first + len(devices))
    ):
        return f"cuda:{first}-{first + len(devices) - 1}"
    return ", ".join(text)


def names(lists: Sequence[Sequence[DeviceLike]]) -> list[str]:
    """The name of each slot list's steps: its length n, with its slots where another list has length n too."""
    lists = [tuple(_parse(s)) for s in lists]
    twice = [compact(s) for s, k in Counter(lists).items() if k > 1]
    if twice:
        raise ValueError(f"slot list given more than once: {', '.join(twice)}")
    lengths = Counter(len(s) for s in lists)
    return [str(len(s)) if lengths[len(s)] == 1 else f"{len(s)} ({compact(s)})" for s in lists]


def _distinct_gpus(slots: Sequence[torch.device]) -> bool:
    return all(d.type == "cuda" for d in slots) and len({d.index for d in slots}) == len(slots)


def steps(
    model: nn.Module, x: torch.Tensor, lists: Sequence[Sequence[DeviceLike]], loss_fn: Callable = mean_square
) -> dict[str, Callable[[], None]]:
    """One training step of ``model`` on ``x`` per name: ``"plain"``, ``"dpteach n"``, and ``"torch n"`` on distinct GPUs."""

    def step(net: nn.Module) -> Callable[[], None]:
        def run() -> None:
            model.zero_grad(set_to_none=True)
            loss_fn(net(x)).backward()

        return run

    fns = {"plain": step(model)}
    for name, slots in zip(names(lists), map(as_devices, lists)):
        fns[f"dpteach {name}"] = step(DataParallel(model, slots))
        if _distinct_gpus(slots):
            fns[f"torch {name}"] = step(nn.DataParallel(model, device_ids=[d.index for d in slots]))
    return fns


def _kind(lists: Sequence[Sequence[torch.device]]) -> str:
    """``"cpu"``, ``"one gpu"`` or ``"gpus"``: the GPUs of every list together, so ``[[0, 1], [0, 0]]`` is ``"gpus"``."""
    gpus = {d.index for slots in lists for d in slots if d.type == "cuda"}
    return "cpu" if not gpus else ("gpus" if len(gpus) > 1 else "one gpu")


def result(
    times: dict[str, Timing], lists: Sequence[Sequence[DeviceLike]], model: nn.Module, x: torch.Tensor
) -> dict:
    """The medians of ``times`` as plain data (what ``bench.json`` records under ``"scaling"``)."""
    keys = names(lists)
    lists = [as_devices(s) for s in lists]
    ns = [len(s) for s in lists]
    return {
        "kind": _kind(lists),
        "params": sum(p.numel() for p in model.parameters()),
        "batch": x.shape[0],
        "slots": ns,
        "devices": [[str(d) for d in s] for s in lists],
        "repeats": len(times["plain"].samples),
        "plain_s": times["plain"].median,
        "dpteach_s": [times[f"dpteach {k}"].median for k in keys],
        "torch_dp_s": [times[f"torch {k}"].median if f"torch {k}" in times else None for k in keys],
    }


def scaling(
    model: nn.Module,
    x: torch.Tensor,
    lists: Sequence[Sequence[DeviceLike]] | None = None,
    repeats: int = 9,
    threads: int | None = 1,
) -> dict:
    """Time one step on every slot list, plain and torch's included, in turns; medians as plain data."""
    lists = slot_lists() if lists is None else lists
    every = list(dict.fromkeys(d for s in lists for d in as_devices(s)))  # each device once, to sync
    times = time_in_turns(steps(model, x, lists), every, repeats, threads=threads)
    return result(times, lists, model, x)


def table(result: dict) -> str:
    """The medians of a run as a table: n, slots (``compact``), dpteach's and torch's ms, speed-up over the plain step."""
    plain = result["plain_s"]
    lines = [
        f"{'n':>2}  {'slots':<26}{'dpteach ms':>11}{'torch ms':>10}{'speed-up':>10}",
        f"{'':>2}  {'plain step, ' + result['devices'][0][0]:<26}{plain * 1e3:>11.2f}",
    ]
    for n, slots, ours, theirs in zip(
        result["slots"], result["devices"], result["dpteach_s"], result["torch_dp_s"]
    ):
        torch_ms = "-" if theirs is None else f"{theirs * 1e3:.2f}"
        lines.append(f"{n:>2}  {compact(slots):<26}{ours * 1e3:>11.2f}{torch_ms:>10}{plain / ours:>9.2f}x")
    return "\n".join(lines)


def label(env: dict) -> str:
    """``measured on 4 x NVIDIA A100, torch 2.5.1, CUDA 12.4`` (the CPU's description, without CUDA)."""
    where = env["device"] if env.get("gpus", 0) < 2 else f"{env['gpus']} x {env['device']}"
    cuda = f", CUDA {env['cuda']}" if env.get("cuda") else ""
    return f"measured on {where}, torch {env['torch']}{cuda}"


def draw(mine: dict, title: str = ""):
    """Two panels: ms per step against n, and speed-up over the plain step against n (this machine).

    The ideal "n times faster" line is drawn only where a result ran on n separate GPUs; slots that
    share one device have no such ideal.
    """
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    ns = mine["slots"]
    left.axhline(mine["plain_s"] * 1e3, color="#777777", ls="--", label="plain step, one device")
    left.plot(ns, [t * 1e3 for t in mine["dpteach_s"]], "o-", color="#2b83ba", label="dpteach.DataParallel")
    right.plot(
        ns, [mine["plain_s"] / t for t in mine["dpteach_s"]], "o-", color="#2b83ba", label="dpteach, here"
    )
    theirs = [(n, t) for n, t in zip(ns, mine["torch_dp_s"]) if t is not None]
    if theirs:
        left.plot(
            *zip(*[(n, t * 1e3) for n, t in theirs]), "s-", color="#d7191c", label="torch.nn.DataParallel"
        )
        right.plot(
            *zip(*[(n, mine["plain_s"] / t) for n, t in theirs]), "s-", color="#d7191c", label="torch, here"
        )
    top = max(ns)
    right.axhline(1.0, color="#777777", ls="--", lw=1, label="as fast as the plain step")
    speedups = [y for line in right.lines for y in line.get_ydata()]
    separate = [max(mine["slots"])] if mine.get("kind") == "gpus" else []
    if separate:  # only n separate devices can be n times faster
        right.plot(
            [1, max(separate)],
            [1, max(separate)],
            color="#bbbbbb",
            lw=1,
            label="n times faster (n separate GPUs)",
        )
    left.set_ylim(bottom=0)
    right.set_ylim(0, max(2.0, *speedups) * 1.15)
    for ax, ylabel, last in (
        (left, "ms per step (median)", max(ns)),
        (right, "plain step's time / DataParallel's", top),
    ):
        ax.set_xlabel("slots (n)")
        ax.set_ylabel(ylabel)
        ax.set_xticks(range(1, last + 1))
    left.legend(fontsize=8, loc="best")
    kind = {"cpu": "CPU slots", "one gpu": "slots on one GPU", "gpus": "GPUs"}[mine["kind"]]
    left.set_title(f"{kind}: {mine['params'] / 1e6:.1f}M parameters, batch {mine['batch']}", fontsize=10)
    right.set_title(title or "speed-up over the plain step", fontsize=10)
    right.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


def step_label(key: str) -> str:
    """A step's name from ``steps`` in words: ``"dpteach 2 (cuda:0-1)"`` -> ``"dpteach, 2 slots (cuda:0-1)"``."""
    kind, _, rest = key.partition(" ")
    n, _, where = rest.partition(" ")
    return f"{kind}, {n} slot{'s' * (n != '1')} {where}".strip() if rest else "plain step"


def draw_rounds(times: dict[str, Timing], ax=None):
    """Every timed step of ``times`` (from ``timer.time_in_turns``) as a dot, one column per step's name,
    and each median as a black line: the dots' spread is the machine's noise, which a gap must beat.
    The dots take their strategy's colour (``costmodel.STRATEGY_COLOURS``): the plain step grey, every
    DataParallel step, dpteach's or torch's, DataParallel's colour."""
    import matplotlib.pyplot as plt

    from .costmodel import STRATEGY_COLOURS

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3))
    for i, (name, t) in enumerate(times.items()):
        colour = STRATEGY_COLOURS["plain" if name == "plain" else "DataParallel"]
        ax.plot([i] * len(t.samples), [s * 1e3 for s in t.samples], "o", color=colour, alpha=0.45)
        ax.plot([i - 0.25, i + 0.25], [t.median * 1e3] * 2, color="black", lw=2)
    ax.set_xticks(range(len(times)), [step_label(k) for k in times], fontsize=8)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("ms per step")
    rounds = len(next(iter(times.values())).samples)
    ax.set_title(f"your steps, {rounds} rounds each (dots: every step; black: the median)", fontsize=9)
    return ax.figure


def against_plain(times: dict[str, Timing]) -> str:
    """Each step's median and middle half (quartiles) beside the plain step's, and the gap between medians.

    It states no verdict: from a few rounds on a shared machine, whether two middle halves overlap can
    change from run to run, so the reader judges the gap against the spread in the figure."""
    plain = times["plain"]
    (a, b) = plain.quartiles
    lines = [f"plain step: median {plain.median * 1e3:.1f} ms, middle half {a * 1e3:.1f}-{b * 1e3:.1f} ms"]
    for name, t in times.items():
        if name == "plain":
            continue
        (c, d) = t.quartiles
        lines.append(
            f"{step_label(name)}: median {t.median * 1e3:.1f} ms, middle half {c * 1e3:.1f}-{d * 1e3:.1f} ms "
            f"({(t.median - plain.median) * 1e3:+.1f} ms between medians)"
        )
    return "\n".join(lines)
