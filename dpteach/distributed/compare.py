"""The one-process side of chapter 09's comparisons: what a step costs on one device and under DataParallel.

DDP's side runs in the ranks (:func:`dpteach.distributed.tasks.step_times` and ``traffic``); these
run in the caller's process, on the same model, batch and step, so the numbers sit side by side.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections import Counter
from typing import Iterator, Sequence

import torch

import dpteach

from .model import loss_fn, make_data, make_model, sgd_step

__all__ = ["step_times", "dataparallel_traffic"]


@contextlib.contextmanager
def _threads(n: int | None) -> Iterator[None]:
    """Run the block with ``n`` intra-op threads, then put the old number back."""
    old = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


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
    DataParallel over ``devices``). ``threads`` sets torch's intra-op threads for the run: with
    ``threads=1`` each DataParallel replica thread gets one core, as each DDP rank does.
    """
    if how not in ("single", "dataparallel"):
        raise ValueError(f"how must be 'single' or 'dataparallel', got {how!r}")
    medians = {}
    with _threads(threads):
        for hidden in hiddens:
            model = make_model(hidden, depth).to(torch.device(devices[0]))
            step_model = dpteach.DataParallel(model, list(devices)) if how == "dataparallel" else model
            x, y = (t.to(torch.device(devices[0])) for t in make_data(global_batch))
            times = []
            for i in range(warmup + repeats):
                start = time.perf_counter()
                loss_fn(step_model(x), y).backward()
                sgd_step(model, lr=0.01)
                if x.is_cuda:
                    torch.cuda.synchronize()  # GPU work is asynchronous: wait for it before reading the clock
                if i >= warmup:
                    times.append(time.perf_counter() - start)
            medians[hidden] = statistics.median(times)
    return medians


def dataparallel_traffic(hidden: int = 16, depth: int = 1, global_batch: int = 64, steps: int = 3,
                         devices: Sequence = ("cpu", "cpu")) -> dict:  # fmt: skip
    """What dpteach's DataParallel copies per training step, counted by ``dpteach.comm.traffic()``."""
    model = make_model(hidden, depth).to(torch.device(devices[0]))
    dp = dpteach.DataParallel(model, list(devices))
    with dpteach.comm.traffic() as seen:
        for step in range(steps):
            x, y = (t.to(torch.device(devices[0])) for t in make_data(global_batch, seed=step))
            loss_fn(dp(x), y).backward()
            sgd_step(model, lr=0.1)
    copies = Counter(c.op for c in seen.copies)
    return dict(
        copies_per_step={op: n // steps for op, n in copies.items()},
        bytes_per_step={op: n // steps for op, n in seen.by_op().items()},
        parameter_bytes=sum(p.numel() * p.element_size() for p in model.parameters()),
    )
