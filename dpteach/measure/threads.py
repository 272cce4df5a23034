"""Which thread runs each backward node of a DataParallel step: evidence that is the same on every run.

``backward_threads(module, inputs, devices)`` takes one DataParallel step (the core helper
``dpteach.data_parallel.step``, without its backward), hangs a pre-hook on every node of the step's
autograd graph, runs ``loss.backward()`` and records, for each node, when it ran (1, 2, ...), the
thread that ran it and the device of the gradient it received. Threads are named by role, never by
id, so the table prints the same every time:

* ``caller thread``: the thread that called ``backward()``;
* ``autograd thread cuda:k``: one of the engine's device threads (the CUDA device it serves);
* ``another thread``: anything else (none is expected).

What to expect, from PyTorch's autograd engine (torch 2.13's headers; ``engine.cpp``):

* ``Engine::execute_with_graph_task`` has the calling thread run ``thread_main``, which pops this
  backward's own CPU queue: "CPU threads are dedicated to processing CPU work for the backward they
  invoked" (``GraphTask::cpu_ready_queue_``, ``graph_task.h``).
* ``Engine::ready_queue`` puts a node whose device is the CPU on that queue, and any other node on
  ``device_ready_queues_.at(device.index())``, served by one thread per GPU
  (``Engine::start_device_threads``). ``Node::device()`` (``node.h``) is the device of the node's
  first input not on the CPU: "Used by the engine to determine what device thread to run on".
* A queue pops the node with the highest sequence number first (``CompareNodeTaskTime``,
  ``engine.h``): "nodes corresponding to ops executed later are the first to be executed in the
  backward pass" (NOTE [ Sequence Number], ``node.h``); AccumulateGrad nodes get the highest number.

So on CPU slots every replica's backward runs on the caller thread, one node after another, the
replica whose forward ran last first (dpteach's CPU slots run their forwards in turn); on CUDA each
device's nodes run on that device's autograd thread, at the same time as the other devices'.
:meth:`Threads.on_gpus` writes out what that rule predicts for a run recorded on CPU slots, and
``threads_per_slot`` runs it: a simulation on CPU slots that cuts the same backward where the engine
would hand nodes to another GPU's thread and gives each slot's share to a Python thread of its own.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import nn

from .._devices import DeviceLike, as_devices
from ..data_parallel import DataParallel, four_moves, mean_square, step
from ..replicate import Strategy

__all__ = ["Row", "Threads", "backward_threads", "graph_nodes", "threads_per_slot"]


@dataclass(frozen=True)
class Row:
    """One backward node: its place in the walk, its name, its replica, its gradient's device, its thread's
    role, and when it ran (``ran``: 1 for the first node the engine ran, 2 for the next, ...).

    ``replica`` is ``"replica k"`` for a node only the k-th replica's output leads to, ``"shared"`` for
    one several lead to (the reduction onto the model's parameters), ``"-"`` above the gather.
    """

    index: int
    node: str
    replica: str
    device: str
    thread: str
    ran: int = 0


@dataclass(frozen=True)
class Threads:
    """Every node of one step's backward, in the order the graph walk met them. ``simulated``: the rows of
    :func:`threads_per_slot`, a split made by hand on CPU slots, which :meth:`table` labels as such."""

    rows: tuple[Row, ...]
    simulated: bool = False

    def counts(self) -> Counter:
        """How many nodes each (replica, device, thread) ran."""
        return Counter((r.replica, r.device, r.thread) for r in self.rows)

    @property
    def roles(self) -> set[str]:
        return {r.thread for r in self.rows}

    def in_order(self) -> list[Row]:
        """The rows in the order the nodes ran."""
        return sorted(self.rows, key=lambda r: r.ran)

    def runs(self) -> list[tuple[Row, ...]]:
        """The rows in the order they ran, cut where the replica or the thread changes."""
        out: list[list[Row]] = []
        for r in self.in_order():
            if out and (out[-1][-1].replica, out[-1][-1].thread) == (r.replica, r.thread):
                out[-1].append(r)
            else:
                out.append([r])
        return [tuple(run) for run in out]

    def table(self) -> str:
        """The backward, readable: one line that says which thread ran the nodes, then a short table.
        On one thread, the nodes in the order they ran, a row per stretch of one part of the step; on
        several threads (one per GPU), how many nodes each thread ran, since threads that run at the
        same time interleave differently on every run."""
        split = any(r.replica.startswith("replica ") for r in self.rows)
        devices = ", ".join(sorted({r.device for r in self.rows}))
        if self.simulated:
            return self._simulated_table()
        if len(self.roles) == 1:
            [role] = self.roles
            who = f"the {role}" + (", the one that called backward()" if role == "caller thread" else "")
            lines = [f"all {len(self.rows)} backward nodes ran on {who}, in this order:"]
            lines.append(f"  {'ran':>5}  {'part of the step':<{_WIDTH}}nodes")
            for run in self.runs():
                first, last = run[0].ran, run[-1].ran
                ran = f"{first}" if first == last else f"{first}-{last}"
                lines.append(f"  {ran:>5}  {_part(run[0].replica, split):<{_WIDTH}}{_names(run)}")
            lines.append(f"every gradient these nodes received was on {devices}")
        else:
            lines = [
                f"{len(self.rows)} backward nodes ran on {len(self.roles)} threads at the same time "
                "(how they interleave changes from run to run):",
                f"  {'nodes':>5}  {'part of the step':<{_WIDTH}}{'gradient on':<16}thread",
            ]
            lines += [
                f"  {k:>5}  {_part(rep, split):<{_WIDTH}}{dev:<16}{role}"
                for (rep, dev, role), k in sorted(self.counts().items(), key=_in_step_order)
            ]
        return "\n".join(lines)

    def _simulated_table(self) -> str:
        """:func:`threads_per_slot`'s rows: how many nodes each slot's thread ran, each part once."""
        when = {"shared": "  once every replica's are done"}
        lines = [
            "simulated on CPU slots: the same backward, each slot's share run by a thread of its own, as "
            "CUDA's engine gives each GPU's nodes to that GPU's thread:",
            f"  {'nodes':>5}  {'part of the step':<{_WIDTH}}thread",
        ]
        for (rep, _, role), k in sorted(self.counts().items(), key=_in_step_order):
            note = when.get(
                rep, "  beside replica 0's" if rep.startswith("replica ") and rep != "replica 0" else ""
            )
            lines.append(f"  {k:>5}  {_part(rep, True):<{_WIDTH}}{role}{note}")
        if "caller thread" not in self.roles:
            lines.append("the caller thread ran none of them: it waited until the slots' threads were done")
        return "\n".join(lines)

    def gpu_threads(self) -> dict[str, int]:
        """How many of this backward's nodes each GPU's engine thread would run on as many GPUs as it had
        slots, slot k on ``cuda:k``, keyed ``"cuda:k"``: the rule :meth:`on_gpus` writes out (each node on
        the thread of its gradient's GPU), not a run."""
        counts = Counter(f"cuda:{_expected_gpu(r.replica)}" for r in self.rows)
        return dict(sorted(counts.items(), key=lambda item: int(item[0].split(":")[1])))

    def on_gpus(self) -> str:
        """What this step's backward would print on as many GPUs as it had slots, slot k on ``cuda:k``:
        worked out from the engine's rule (each node on the thread of its gradient's GPU), not run.

        Replica k's nodes get their gradients on ``cuda:k``; the loss, the gather's backward and the sum
        onto the model's parameters get theirs on ``cuda:0``, the first slot's device, where the model
        and the gathered output live.
        """
        replicas = sorted({r.replica for r in self.rows if r.replica.startswith("replica ")})
        n = max(len(replicas), 1)
        counts = Counter((r.replica, _expected_gpu(r.replica)) for r in self.rows)
        when = {"replica 0": "", "shared": "  once every replica's are done"}
        lines = [
            f"on {n} GPU{'s' if n > 1 else ''} this backward would run like this (worked out from PyTorch's engine source; "
            "not run here):",
            f"  {'nodes':>5}  {'part of the step':<{_WIDTH}}thread",
        ]
        for (rep, gpu), k in sorted(counts.items(), key=_in_step_order):
            note = when.get(rep, "  at the same time as replica 0's" if rep.startswith("replica ") else "")
            lines.append(f"  {k:>5}  {_part(rep, bool(replicas)):<{_WIDTH}}autograd thread cuda:{gpu}{note}")
        lines.append("the caller thread runs none of them: it waits until the GPU threads are done")
        return "\n".join(lines)


_WIDTH = 23  # the "part of the step" column: its longest name and two spaces


def _part(replica: str, split: bool) -> str:
    """A row's part of the step in words: ``"-"`` is the loss and the gather above the replicas (the
    whole step when it ran on one slot, with no gather), ``"shared"`` the sum onto the model, ``"input"`` the scatter's backward to an input that requires grad."""
    if replica == "-":
        return "loss and gather" if split else "the whole step"
    return {"shared": "sum onto the model", "input": "gradient to the input"}.get(replica, replica)


def _in_step_order(item) -> tuple:
    """Count rows in the order the step's parts come in backward: the loss and gather, each replica, the sum."""
    (replica, *_), _ = item
    rank = {"-": 0, "shared": 2, "input": 3}.get(replica, 1)
    return (rank, item[0])


def _names(run: Sequence[Row]) -> str:
    """The node names of one run, a repeated name once with its count: ``AccumulateGrad ×4``."""
    groups: list[list[str]] = []
    for r in run:
        if groups and groups[-1][0] == r.node:
            groups[-1].append(r.node)
        else:
            groups.append([r.node])
    return ", ".join(g[0] if len(g) == 1 else f"{g[0]} ×{len(g)}" for g in groups)


def _expected_gpu(replica: str) -> int:
    """The GPU whose autograd thread runs a node of ``replica`` when slot k is ``cuda:k``."""
    return int(replica.split()[1]) if replica.startswith("replica ") else 0


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
    parts = {key: f"replica {min(ks)}" if len(ks) == 1 else "shared" for key, ks in reached.items()}
    # an input that requires grad: the scatter's backward gathers its gradient, and an AccumulateGrad
    # stores it; every replica reaches both, yet they sum nothing onto the model
    for node in nodes:
        if node.name() == "ScatterBackward":
            for below in graph_nodes(node):
                parts[id(below)] = "input"
    return parts


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


def _recorded(
    nodes: list[Any], run: Callable[[], None], role: Callable[[], str], simulated: bool = False
) -> Threads:
    """Hang a pre-hook on every node of ``nodes``, call ``run`` (which runs their backward) and return a
    row per node that ran: when, on which thread (``role()``, read inside the hook) and with gradients where."""
    seen: dict[int, tuple[str, str, int]] = {}
    lock = threading.Lock()

    def recorder(i: int):
        def hook(grad_outputs):
            with lock:  # device threads may run nodes at the same time
                seen[i] = (_device(grad_outputs), role(), len(seen) + 1)

        return hook

    handles = [node.register_prehook(recorder(i)) for i, node in enumerate(nodes)]
    try:
        run()
    finally:
        for h in handles:
            h.remove()
    replica = _replicas(nodes)
    rows = [
        Row(i, _name(node), replica.get(id(node), "-"), *seen[i]) for i, node in enumerate(nodes) if i in seen
    ]
    return Threads(tuple(rows), simulated)


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
    caller = threading.get_ident()
    return _recorded(graph_nodes(done.loss.grad_fn), done.loss.backward, lambda: _role(caller))


class _KeepOutputs(DataParallel):
    """DataParallel that keeps each replica and its output, so the backward can be cut between them."""

    def parallel_apply(self, replicas, inputs, kwargs):
        self.kept = (replicas, super().parallel_apply(replicas, inputs, kwargs))
        return self.kept[1]


def _copies(replica: nn.Module) -> list[torch.Tensor]:
    """The tensors of a replica that backward sums onto the model: its parameters, wherever the strategy
    put them (``_parameters``, or plain attributes as torch's ``replicate.py`` does), once each."""
    found: dict[int, torch.Tensor] = {}
    for m in replica.modules():
        for t in (*m._parameters.values(), *m._buffers.values(), *vars(m).values()):
            if isinstance(t, torch.Tensor) and t.requires_grad:
                found.setdefault(id(t), t)
    return list(found.values())


def threads_per_slot(
    module: nn.Module,
    inputs: Any,
    devices: Sequence[DeviceLike],
    *,
    strategy: Strategy = "broadcast",
    loss_fn: Callable[[Any], torch.Tensor] = mean_square,
) -> Threads:
    """A simulation, on slots of one device, of the split CUDA's engine makes: one DataParallel step of
    ``module`` whose backward is cut where the engine would give nodes to another GPU's thread, each slot's
    share run by a thread of its own.

    The engine runs a CPU node on the thread that called backward (``Engine::ready_queue``), so each
    thread below calls ``torch.autograd.grad`` on its share, and the engine runs that share on it. Slot
    0's thread, standing for cuda:0's, runs the loss and the gather's backward, hands each other slot's
    output gradient to that slot's thread, runs replica 0's nodes, waits for the others, then runs the sum
    onto the model. The caller thread only waits, as it does on GPUs. The model's gradients come out as
    ``loss.backward()`` makes them; zero them before training on.
    """
    slots = as_devices(devices, "devices")
    if any(d.type != "cpu" for d in slots):  # a CUDA node runs on its GPU's engine thread, not the caller's
        raise ValueError(
            "threads_per_slot simulates the split on CPU slots; on GPUs, backward_threads records the real one"
        )
    dp = _KeepOutputs(module, slots, strategy=strategy)
    out = four_moves(dp, inputs if isinstance(inputs, tuple) else (inputs,), {}, run_one_slot=False)
    loss = loss_fn(out)
    replicas, outputs = dp.kept
    if len(outputs) < 2:
        raise ValueError("threads_per_slot needs two slots or more: with one there is nothing to split")
    roles: dict[int, str] = {}

    def share(k: int, grad: torch.Tensor, got: list) -> None:  # replica k's nodes, down to its copies
        roles[threading.get_ident()] = f"slot {k}'s thread (as cuda:{k}'s)"
        copies = _copies(replicas[k])
        got[k] = (copies, torch.autograd.grad(outputs[k], copies, grad, allow_unused=True))

    def slot_0() -> None:
        roles[threading.get_ident()] = "slot 0's thread (as cuda:0's)"
        grads = torch.autograd.grad(loss, outputs)  # the loss and the gather's backward
        got: list = [None] * len(outputs)
        others = [threading.Thread(target=share, args=(k, grads[k], got)) for k in range(1, len(outputs))]
        for t in others:
            t.start()
        share(0, grads[0], got)
        for t in others:
            t.join()
        pairs = [(c, g) for copies, gs in got for c, g in zip(copies, gs) if g is not None]
        torch.autograd.backward([c for c, _ in pairs], [g for _, g in pairs])  # the sum onto the model

    def run() -> None:
        errors: list[BaseException] = []

        def guarded() -> None:
            try:
                slot_0()
            except BaseException as e:  # re-raised in the caller, as parallel_apply does
                errors.append(e)

        worker = threading.Thread(target=guarded)
        worker.start()
        worker.join()  # the caller thread waits, as it does while GPU threads run a backward
        if errors:
            raise errors[0]

    nodes = graph_nodes(loss.grad_fn)
    return _recorded(nodes, run, lambda: roles.get(threading.get_ident(), "caller thread"), simulated=True)
