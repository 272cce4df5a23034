"""Which thread runs each backward node of a DataParallel step: evidence that is the same on every run.

``backward_threads(module, inputs, devices)`` takes one DataParallel step (the core helper
``dpteach.data_parallel.step``, without its backward), hangs a pre-hook on every node of the step's
autograd graph, runs ``loss.backward()`` and records, for each node, the thread that ran it and the
device of the gradient it received. Threads are named by role, never by id, so the table prints
the same every time:

* ``caller thread``: the thread that called ``backward()``;
* ``autograd thread cuda:k``: one of the engine's device threads (the CUDA device it serves);
* ``another thread``: anything else (none is expected).

What to expect, from PyTorch's engine (``torch/csrc/autograd/engine.cpp``): ``execute_with_graph_task``
runs ``thread_main(graph_task)`` on the calling thread when that thread is not one of the engine's
workers, and the comment on ``local_ready_queue`` says "The CUDA, XLA threads are shared among all
invocations of backwards via device_ready_queues_, while CPU threads are dedicated to processing
CPU work for the backward they invoked" (``graph_task.h``, ``cpu_ready_queue_``, says the same). So
on CPU slots every replica's backward runs on the caller thread, one node after another, and on
CUDA each device's nodes run on that device's autograd thread.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import nn

from .._devices import DeviceLike
from ..data_parallel import mean_square, step
from ..replicate import Strategy

__all__ = ["Row", "Threads", "backward_threads", "graph_nodes"]


@dataclass(frozen=True)
class Row:
    """One backward node: its place in the walk, its name, its replica, its gradient's device, its thread's role.

    ``replica`` is ``"replica k"`` for a node only the k-th replica's output leads to, ``"shared"`` for
    one several lead to (the reduction onto the model's parameters), ``"-"`` above the gather.
    """

    index: int
    node: str
    replica: str
    device: str
    thread: str


@dataclass(frozen=True)
class Threads:
    """Every node of one step's backward, in the order the graph walk met them."""

    rows: tuple[Row, ...]

    def counts(self) -> Counter:
        """How many nodes each (replica, device, thread) ran."""
        return Counter((r.replica, r.device, r.thread) for r in self.rows)

    @property
    def roles(self) -> set[str]:
        return {r.thread for r in self.rows}

    def table(self, limit: int | None = None) -> str:
        """The nodes (the first ``limit``), numbered in the graph walk's breadth-first order, which is not the
        order they ran in, and, under them, how many nodes each thread ran on each device."""
        shown = self.rows if limit is None else self.rows[:limit]
        lines = [f"{'walk':>4} {'backward node':<20}{'replica':<11}{'gradient on':<13}thread"]
        lines += [f"{r.index:>4} {r.node:<20}{r.replica:<11}{r.device:<13}{r.thread}" for r in shown]
        if len(shown) < len(self.rows):
            lines.append(f"     ... {len(self.rows) - len(shown)} more nodes")
        lines.append("")
        lines.append(f"{'nodes':>5}  {'replica':<11}{'gradient on':<13}thread")
        lines += [
            f"{k:>5}  {rep:<11}{dev:<13}{role}" for (rep, dev, role), k in sorted(self.counts().items())
        ]
        return "\n".join(lines)


def graph_nodes(root: Any) -> list[Any]:
    """Every node reachable from ``root`` (a ``grad_fn``), breadth first in ``next_functions`` order."""
    seen, order, queue = set(), [], [root]
    while queue:
        node = queue.pop(0)
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        order.append(node)
        queue.extend(fn for fn, _ in node.next_functions)
    return order


def _replicas(nodes: list[Any]) -> dict[int, str]:
    """Which replica's output leads to each node: the branches under the gather (``GatherBackward``)."""
    gather = next((n for n in nodes if n.name() == "GatherBackward"), None)
    if gather is None:  # one slot: the module itself ran, no gather
        return {}
    reached: dict[int, set[int]] = {}
    for k, (branch, _) in enumerate(gather.next_functions):
        for node in graph_nodes(branch):
            reached.setdefault(id(node), set()).add(k)
    return {key: f"replica {min(ks)}" if len(ks) == 1 else "shared" for key, ks in reached.items()}


def _name(node: Any) -> str:
    return node.name().removeprefix("torch::autograd::")


def _role(caller: int) -> str:
    if threading.get_ident() == caller:
        return "caller thread"
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return f"autograd thread cuda:{torch.cuda.current_device()}"
    return "another thread"


def _device(grads: Sequence[Any]) -> str:
    devices = {str(g.device) for g in grads if isinstance(g, torch.Tensor)}
    return ", ".join(sorted(devices)) or "-"


def backward_threads(
    module: nn.Module,
    inputs: Any,
    devices: Sequence[DeviceLike],
    *,
    strategy: Strategy = "broadcast",
    loss_fn: Callable[[Any], torch.Tensor] = mean_square,
) -> Threads:
    """Record which thread runs each backward node of one DataParallel step of ``module`` on ``inputs``.

    The parameters' gradients are left as the backward made them (zero them before training on).
    """
    done = step(module, inputs, devices, strategy=strategy, loss_fn=loss_fn, backward=False)
    nodes = graph_nodes(done.loss.grad_fn)
    seen: dict[int, tuple[str, str]] = {}
    caller = threading.get_ident()
    lock = threading.Lock()

    def recorder(i: int):
        def hook(grad_outputs):
            with lock:  # device threads may run nodes at the same time
                seen[i] = (_device(grad_outputs), _role(caller))

        return hook

    handles = [node.register_prehook(recorder(i)) for i, node in enumerate(nodes)]
    try:
        done.loss.backward()
    finally:
        for h in handles:
            h.remove()
    replica = _replicas(nodes)
    rows = [
        Row(i, _name(node), replica.get(id(node), "-"), *seen[i]) for i, node in enumerate(nodes) if i in seen
    ]
    return Threads(tuple(rows))
