"""What a DataParallel step on 2, 3 and 4 CPU slots costs against the plain step, with torch's own threads.

    python scripts/cpu_slots.py [--repeats 15] [--rounds 3] [--load] [--model conv|transformer]

Each case is one training step (forward, mean-square loss, backward; ``dpteach.data_parallel.step``),
timed in turns with the plain step of the same model on the same batch, with PyTorch's own intra-op
thread setting (the one timer, ``time_in_turns(..., threads=None)``), since that is what a learner's
DataParallel runs with. Slots of one device take their turns in forward (each with a random state of
its own), so the slots do not start one thread team per slot on the same cores, and each turn, and
``step``'s backward, runs with its share of those threads (``cores_shared``). ``--load`` starts one
busy process per core for the whole measurement, so both the plain and the sliced steps run beside
other work. Printed per case: the median ratio to the plain step over the rounds, and its spread (the
lowest and highest round), with the medians in milliseconds, and the ratio of the process's CPU time
per step (all its threads, spinning ones included), which other programs on the machine stretch less. The learner's thread setting is checked
to be the same after every step.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time
from typing import Iterator

import torch
from torch import nn

from dpteach.data_parallel import step
from dpteach.measure.timer import time_in_turns

BUSY = "while True: pass"


def conv_net() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1, stride=2),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(4),
        nn.Flatten(),
        nn.Linear(512, 10),
    )


class TinyTransformer(nn.Module):
    """A small ViT-like encoder over 16 tokens of 64 features."""

    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
        self.encoder, self.head = (
            nn.TransformerEncoder(layer, 2, enable_nested_tensor=False),
            nn.Linear(64, 10),
        )

    def forward(self, x):
        return self.head(self.encoder(x).mean(1))


MODELS = {
    "conv": (conv_net, lambda batch: torch.randn(batch, 3, 32, 32)),
    "transformer": (TinyTransformer, lambda batch: torch.randn(batch, 16, 64)),
}


@contextlib.contextmanager
def busy_cores(n: int | None) -> Iterator[None]:
    """``n`` processes spinning on the CPU for as long as the block runs (none for ``None``)."""
    procs = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(n or 0)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def measure(
    model: str = "conv",
    slot_counts=(2, 3, 4),
    batch: int = 64,
    repeats: int = 15,
    rounds: int = 3,
    load: bool = False,
) -> list[dict]:
    """Per slot count: the plain step's and the sliced step's medians (s) per round, and their ratios."""
    make, data = MODELS[model]
    torch.manual_seed(0)
    net, x = make(), data(batch)
    threads = torch.get_num_threads()
    rows = []
    with busy_cores(os.cpu_count() if load else None):
        for n in slot_counts:
            slots = ["cpu"] * n

            def sliced(slots=slots):
                step(net, x, slots)
                assert torch.get_num_threads() == threads  # the learner's setting is left as it was

            def plain():
                _plain(net, x)

            per_round, cpu_rounds = [], []
            for _ in range(rounds):
                cpu: dict[str, list[float]] = {"plain": [], "sliced": []}
                fns = {name: _cpu_timed(fn, cpu[name]) for name, fn in (("plain", plain), ("sliced", sliced))}
                t = time_in_turns(fns, repeats=repeats, warmup=2, threads=None)
                per_round.append((t["plain"].median, t["sliced"].median))
                cpu_rounds.append(statistics.median(cpu["sliced"][2:]) / statistics.median(cpu["plain"][2:]))
            ratios = [s / p for p, s in per_round]
            rows.append(
                dict(
                    model=model,
                    slots=n,
                    load=load,
                    threads=threads,
                    plain_ms=statistics.median(p for p, _ in per_round) * 1e3,
                    sliced_ms=statistics.median(s for _, s in per_round) * 1e3,
                    ratio=statistics.median(ratios),
                    ratio_low=min(ratios),
                    ratio_high=max(ratios),
                    cpu_ratio=statistics.median(cpu_rounds),
                )
            )
    return rows


def _cpu_timed(fn, into: list[float]):
    """``fn``, noting the process's CPU seconds per call (every thread's, spinning included) in ``into``."""

    def timed():
        start = time.process_time()
        fn()
        into.append(time.process_time() - start)

    return timed


def _plain(net: nn.Module, x: torch.Tensor) -> None:
    """The step without DataParallel: forward, the same loss, backward."""
    net(x).float().pow(2).mean().backward()


def table(rows: list[dict]) -> str:
    lines = [
        "model        slots  load  threads  plain ms  sliced ms  ratio (lowest-highest round)  CPU-time ratio"
    ]
    for r in rows:
        lines.append(
            f"{r['model']:<12} {r['slots']:>5}  {'yes' if r['load'] else 'no':>4}  {r['threads']:>7}  "
            f"{r['plain_ms']:>8.2f}  {r['sliced_ms']:>9.2f}  {r['ratio']:.2f}x ({r['ratio_low']:.2f}-{r['ratio_high']:.2f})"
            f"{r['cpu_ratio']:>19.2f}x"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="conv")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--load", action="store_true", help="one busy process per core while measuring")
    args = ap.parse_args(argv)
    rows = measure(args.model, batch=args.batch, repeats=args.repeats, rounds=args.rounds, load=args.load)
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end")
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
