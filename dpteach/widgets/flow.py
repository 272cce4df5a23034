"""The gradient-flow stepper's model: one backward pass, node by node, with the gradients it really hands on.

``GradientFlow(strategy, slots)`` takes one step of the course model by hand (scatter, replicate,
parallel_apply, gather: ``dpteach.data_parallel.step``), walks its graph once into the drawn
nodes and the live ``grad_fn`` behind each (``graph/walk.py``), hooks those (``register_hook``)
and runs ``backward()``. Each ``FlowStep`` is one node running, in the order autograd's
engine ran them: what it received, and which gradient (shape, norm) it handed to which node. The
engine runs a leaf's ``AccumulateGrad`` as soon as its gradient is ready (its sequence number is
UINT64_MAX, the highest priority, ``node.h``), so under ``"clone"`` a replica's ``AccumulateGrad``,
where the gradient stops (issue #19540), can run before other nodes. Under ``"broadcast"`` the
originals' ``AccumulateGrad`` come last: they wait for the one ``BroadcastBackward``, which needs
every replica parameter's gradient. Under ``"rewire"`` each parameter's ``ReduceAddBackward`` is
ready once that parameter's gradients from every replica have arrived, but being ready is not
enough: among the ready nodes the engine runs the highest sequence number first
(``CompareNodeTaskTime``, ``engine.h``), and sequence numbers are thread-local (``node.h``, NOTE
[ Sequence Number ]).
Slots that share a device (the stepper's CPU slots) run their forwards one after the other on the
caller's thread, after ``replicate`` made the ``ReduceAddBackward`` nodes there, so every replica node
outnumbers them and every ``ReduceAddBackward`` runs after all of the replicas' nodes. torch's
``parallel_apply`` runs each replica's forward in a new thread, whose count starts from 0: once the
caller's count is past the replicas' (in a training loop, after some steps), the ``ReduceAddBackward`` nodes
are the higher, and each runs as soon as it is ready; on a fresh count each ties with the replica nodes of its
number, the heap breaks those ties, and the order changes (``join_order`` prints these; chapter 12, the Going deeper after 2a).

Plain Python, no ipywidgets; ``view_stepper.py`` only shows it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch
from torch import nn

from ..course import story
from ..replicate import replicate
from ..scatter_gather import gather, scatter
from .highlight import caption, highlight, legend_line
from .training import STRATEGIES, one_thread, slot_devices


@dataclass(frozen=True)
class Grad:
    """A gradient as the stepper shows it: its shape and its norm."""

    shape: tuple[int, ...]
    norm: float
    source: str = ""  # a join's received gradient: whose it is, e.g. "replica 1 · 2.weight" ("" elsewhere)

    @classmethod
    def of(cls, t: torch.Tensor, source: str = "") -> "Grad":
        return cls(tuple(t.shape), t.detach().double().norm().item(), source)

    def __str__(self) -> str:
        shape = "scalar" if not self.shape else "×".join(map(str, self.shape))
        return f"{shape}, ‖g‖ = {self.norm:.4g}"

    def __repr__(self) -> str:  # a printed tuple of gradients reads as the stepper's table does
        return f"{self} from {self.source}" if self.source else str(self)


@dataclass(frozen=True)
class Handoff:
    """One gradient a node hands on: to which node of the graph, and what it is."""

    to: str  # the receiving node's id in the graph
    label: str  # what a learner reads for it
    grad: Grad | None  # None: autograd handed on no gradient (undefined) along this edge

    def __str__(self) -> str:
        return f"to {self.label}: {self.grad if self.grad is not None else 'no gradient'}"

    __repr__ = __str__  # a printed tuple of handoffs reads as the stepper's table does


@dataclass(frozen=True)
class FlowStep:
    """One node of the backward pass running."""

    node: str  # its id in the graph (dpteach.autograd_graph)
    label: str
    kind: str  # the graph node's kind: "output", "op", "join", "original", "replica", "leaf"
    received: tuple[Grad, ...]  # the gradients it received, one per output of its forward
    handoffs: tuple[Handoff, ...]
    text: str  # one sentence on what happens

    @property
    def edges(self) -> list[tuple[str, str]]:
        return [(self.node, h.to) for h in self.handoffs]


# Where each strategy's summing node comes from (read in /work/shared/seed-pr-20910.txt and torch/nn/parallel/):
# short, since the stepper's status line ends with it. A torch.autograd.Function F's node is named FBackward.
JOIN_CREDIT = {
    "rewire": "the edge PR #20910 added (C++ calls the node ReduceAdd)",
    "broadcast": "the edge Broadcast makes, as in torch/nn/parallel/_functions.py",
}


class GradientFlow:
    """One backward pass of the course model under ``strategy``, node by node."""

    @one_thread()
    def __init__(self, strategy: str = "clone", slots: int = 2, seed: int = 0):
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
        from ..data_parallel import step
        from ..graph.autograd import walked_graph

        self.strategy, self.slots, self.seed = strategy, slots, seed
        devices = slot_devices(slots)
        x, y = story.make_data(seed=seed)
        self.model = story.make_model(seed).to(devices[0])

        def loss_fn(out):
            return nn.functional.mse_loss(out, y.to(devices[0]))

        done = step(self.model, x.to(devices[0]), devices, strategy=strategy, loss_fn=loss_fn, backward=False)
        loss, self.replicas = done.loss, done.replicas
        ran: list[tuple[object, tuple, tuple]] = []  # (node, what it handed on, what it received), in order
        title = f"strategy={strategy!r}, {slots} slot{'s' * (slots != 1)}"
        # one walk gives the drawn graph and the live grad_fn behind each of its nodes: hook those, then run
        self.graph, handles = walked_graph(loss, self.model, self.replicas, title=title, handles=True)
        for nid, fn in handles.fns.items():
            fn.register_hook(
                lambda grad_inputs, grad_outputs, nid=nid: ran.append((nid, grad_inputs, grad_outputs))
            )
        loss.backward()
        targets = handles.entries  # node -> (index into its next_functions, the node that entry leads to)
        first = self.graph.children("output")[0]
        self.steps = [
            FlowStep(
                "output",
                "output",
                "output",
                (),
                (Handoff(first, self._label(first), Grad((), 1.0)),),
                f"backward() starts at the loss: its gradient, 1, goes to {self._label(first)}.",
            )
        ]
        sources = self._sources(handles.fns)
        for nid, handed, received in ran:
            whose = sources.get(nid, {})
            got = tuple(Grad.of(g, whose.get(k, "")) for k, g in enumerate(received) if g is not None)
            handoffs = tuple(
                Handoff(child, self._target(child), None if handed[i] is None else Grad.of(handed[i]))
                for i, child in targets[nid]
            )
            self.steps.append(
                FlowStep(
                    nid,
                    self._label(nid),
                    self.graph.nodes[nid].kind,
                    got,
                    handoffs,
                    self._sentence(nid, got, handoffs),
                )
            )

    def _sources(self, fns) -> dict[str, dict[int, str]]:
        """For each join node: its output number -> the replica parameter that output is, in module order.

        A replica's copy of a parameter is one output of its join node (``grad_fn``, ``output_nr``), so
        the gradient the join receives for that output is that replica parameter's.
        """
        joins = {id(fns[nid]): nid for nid, n in self.graph.nodes.items() if n.kind == "join" and nid in fns}
        sources: dict[str, dict[int, str]] = {}
        for slot, replica in enumerate(self.replicas):
            for name, _ in self.model.named_parameters():
                path, _, key = name.rpartition(".")
                t = getattr(replica.get_submodule(path), key, None)
                if isinstance(t, torch.Tensor) and id(t.grad_fn) in joins:
                    sources.setdefault(joins[id(t.grad_fn)], {})[t.output_nr] = f"replica {slot} · {name}"
        return sources

    def _label(self, nid: str) -> str:
        n = self.graph.nodes[nid]
        return f"{n.label} (replica {n.slot})" if n.kind == "op" and n.slot is not None else n.label

    def _target(self, nid: str) -> str:
        """What a handoff's receiver is called; a replica parameter that is not a leaf says where it leads."""
        n = self.graph.nodes[nid]
        if n.kind == "replica" and not n.leaf:
            return f"{n.label} (not a leaf: on to {self._label(self.graph.children(nid)[0])})"
        return self._label(nid)

    def _sentence(self, nid: str, got: tuple[Grad, ...], handoffs: tuple[Handoff, ...]) -> str:
        """One short sentence on what the node does; the shapes and norms are in the stepper's table."""
        n, label = self.graph.nodes[nid], self._label(nid)
        if n.kind == "original":
            return f"AccumulateGrad writes the .grad of {label}, the gradient SGD reads: this path ends here."
        if n.kind == "replica":
            return f"AccumulateGrad writes the .grad of {label}: a dead end, thrown away with the replica (#19540)."
        if n.kind == "leaf":
            return f"AccumulateGrad writes the .grad of {label}."
        into = ", ".join(dict.fromkeys(h.label for h in handoffs))  # module order, as the graph and the table
        if n.kind == "join":
            each = "replica" if len(handoffs) == 1 else "replica parameter"
            credit = JOIN_CREDIT.get(self.strategy, "the edge back to the original")
            return f"{label} sums {len(got)} gradients, one per {each}, into {into}: {credit}."
        plural = "s" * (len(got) != 1)
        return f"{label} receives {len(got)} gradient{plural} and hands on {len(handoffs)}."

    def __len__(self) -> int:
        return len(self.steps)

    def done_before(self, i: int) -> list[str]:
        """The nodes that ran before step ``i``."""
        return [s.node for s in self.steps[:i]]

    def svg(self, i: int, base_svg: str | None = None) -> str:
        """The drawn graph with step ``i`` marked (see ``highlight.py`` for the marks); needs Graphviz."""
        from .pictures import graph_svg

        step = self.steps[i]
        svg = highlight(base_svg or graph_svg(self.graph), [step.node], step.edges, self.done_before(i))
        return caption(svg, legend_line())

    def summary(self) -> str:
        """Where the gradients ended: the originals that got one, the replica leaves that kept theirs."""
        originals = [s for s in self.steps if s.kind == "original"]
        stuck = [s for s in self.steps if s.kind == "replica"]
        total = len(self.graph.originals)
        # step 0 is backward() starting at the loss; the backward steps are the nodes that ran (the stepper's 1..N)
        line = f"{len(self.steps) - 1} backward steps; {len(originals)} of {total} original parameters got a gradient"
        return f"{line}; {len(stuck)} replica parameters kept theirs (dead ends)" if stuck else line

    def __repr__(self) -> str:
        return f"<GradientFlow strategy={self.strategy!r} slots={self.slots}: {self.summary()}>"


def backward_order(loss: torch.Tensor) -> list:
    """The ``grad_fn`` of every node below ``loss``, in the order backward runs them (a pre-hook on each)."""
    order, seen, todo = [], set(), [loss.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        fn.register_prehook(lambda grads, fn=fn: order.append(fn))
        todo.extend(nxt for nxt, _ in fn.next_functions)
    loss.backward()
    return order


@dataclass(frozen=True)
class JoinOrder:
    """Where each ``ReduceAddBackward`` ran in one ``"rewire"`` backward, against the replicas' own nodes."""

    order: tuple  # every node's grad_fn, in the order backward ran them
    joins: tuple[int, ...]  # positions (from 0) of the ReduceAddBackward nodes
    ops: tuple[int, ...]  # positions of the replicas' own nodes (after GatherBackward, no joins or leaves)
    # what the stepper calls each node: "TBackward0 (replica 1)", "ReduceAddBackward", "original 2.bias"
    labels: tuple[str, ...] = ()

    def number(self, i: int) -> str:
        """The sequence number of the node at position ``i``; "max" for an AccumulateGrad (UINT64_MAX)."""
        nr = self.order[i]._sequence_nr()
        return "max" if nr >= 2**63 else str(nr)

    @property
    def early(self) -> tuple[int, ...]:
        """Positions of the ReduceAddBackward nodes that ran before the replicas' last node."""
        return tuple(i for i in self.joins if i < self.ops[-1])

    def numbers(self) -> tuple[list[int], list[list[int]]]:
        """The sequence numbers the rule reads: the ReduceAddBackward nodes', then each replica's own nodes',
        replica by replica, each list ascending, so no list's order tells the order backward ran them."""
        sums = sorted(self.order[i]._sequence_nr() for i in self.joins)
        owners = [int(self.labels[i].rsplit("replica ", 1)[1].rstrip(")")) for i in self.ops]
        replicas = [
            sorted(self.order[i]._sequence_nr() for i, who in zip(self.ops, owners) if who == r)
            for r in range(max(owners) + 1)
        ]
        return sums, replicas

    @property
    def first_replica(self) -> int:
        """The replica whose node ran first of the replicas' own nodes, as recorded."""
        return int(self.labels[self.ops[0]].rsplit("replica ", 1)[1].rstrip(")"))

    def summary(self, name: str) -> str:
        """One line: the steps (from 1, as the stepper counts) the ReduceAddBackward nodes ran at."""
        steps = ", ".join(str(i + 1) for i in self.joins)
        return f"{name}: ReduceAddBackward at steps {steps}; the replicas' last node ran at step {self.ops[-1] + 1}"


def order_table(named: dict[str, JoinOrder]) -> list[str]:
    """The orders side by side, one row per step: each node and its sequence number. A legend first,
    so the marks are read before the rows; each order's one-line summary last."""
    width = max(len(text) for found in named.values() for text in (*found.labels, "node"))
    width = max(width, *(len(name) for name in named))
    legend = [
        "the nodes in the order backward ran them; nr: each node's sequence number (among the nodes",
        "whose gradients have all arrived, the highest runs first)",
        "  max: an AccumulateGrad's number, UINT64_MAX: it runs as soon as its gradient arrives",
        "  ◀  : a ReduceAddBackward that ran while replica nodes were still to run",
        "",
    ]
    names = "      " + "".join(f"{name:<{width + 10}}" for name in named).rstrip()
    head = "step  " + "".join(f"{'node':<{width}} {'nr':>4}     " for _ in named).rstrip()
    rows = []
    for i in range(max(len(found.order) for found in named.values())):
        cells = [
            f"{found.labels[i]:<{width}} {found.number(i):>4} {'◀' if i in found.early else ' '}   "
            for found in named.values()
        ]
        rows.append(f"{i + 1:>4}  " + "".join(cells).rstrip())
    return [*legend, names, head, *rows, ""] + [found.summary(name) for name, found in named.items()]


def _replica_of(outs: list, stop: tuple[str, ...]) -> dict:
    """Each node a replica's forward made -> that replica's index: the nodes below its output, down to
    the nodes named in ``stop`` (the ReduceAddBackward nodes and leaves, made before the replicas ran)."""
    owner: dict = {}
    for i, out in enumerate(outs):
        todo = [out.grad_fn]
        while todo:
            fn = todo.pop()
            if fn is None or fn in owner or type(fn).__name__ in stop:
                continue
            owner[fn] = i
            todo.extend(nxt for nxt, _ in fn.next_functions)
    return owner


def join_order(threaded: bool, slots: int = 2, steps_before: int = 1, forward_order=None) -> JoinOrder:
    """The stepper's ``"rewire"`` step (same model, same loss), with the replicas' forwards run each in
    a new thread of its own (``threaded=True``), as dpteach's threaded slots run them, or one after the
    other on the calling thread, as dpteach runs slots that share a device.

    The step runs on a new thread of its own, whose sequence-number counter starts at 0, after
    ``steps_before`` such steps there, as a training loop's earlier steps: so its numbers are the same in
    every kernel, whatever the kernel's own thread has counted. With ``steps_before=0`` the
    ``ReduceAddBackward`` nodes (made by ``replicate`` on the calling thread, before the replicas run)
    count from 0 too, and each ties with the threaded replicas' nodes of its number.

    ``forward_order``: the order the replicas' forwards run in, on one thread (replica 0 first unless
    given): chapter 12's exercise 4 checks the rule on an order that no chapter printed.

    ``_sequence_nr()`` is a private method of PyTorch's nodes: fine for looking, not for code that must
    keep working.
    """
    found: list = []

    def steps() -> None:
        for _ in range(steps_before):
            _join_order(threaded, slots, forward_order)  # a step before: only the counter it leaves matters
        found.append(_join_order(threaded, slots, forward_order))

    caller = threading.Thread(target=steps)
    caller.start()
    caller.join()
    if not found:
        raise RuntimeError("join_order's step failed on its thread: its error is printed above")
    return found[0]


def _join_order(threaded: bool, slots: int, forward_order=None) -> JoinOrder:
    """One ``"rewire"`` step and its backward, on the thread that calls this (see ``join_order``)."""
    devs = slot_devices(slots)
    x, y = (t.to(devs[0]) for t in story.make_data(seed=0))
    net = story.make_model(0).to(devs[0])
    replicas = replicate(net, devs, strategy="rewire")
    pieces = scatter(x, devs)
    outs: list = [None] * len(replicas)

    def run(i: int) -> None:
        outs[i] = replicas[i](pieces[i])

    if threaded:
        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(replicas))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    else:
        for i in range(len(replicas)) if forward_order is None else forward_order:
            run(i)
    owner = _replica_of(outs, ("ReduceAddBackward", "AccumulateGrad"))
    names = {id(p): name for name, p in net.named_parameters()}
    order = backward_order(nn.functional.mse_loss(gather(outs, devs[0]), y))
    node_types = [type(fn).__name__ for fn in order]
    labels = tuple(
        f"original {names[id(fn.variable)]}"
        if kind == "AccumulateGrad"
        else f"{kind} (replica {owner[fn]})"
        if fn in owner
        else kind
        for fn, kind in zip(order, node_types)
    )
    joins = tuple(i for i, n in enumerate(node_types) if n == "ReduceAddBackward")
    after_gather = node_types.index("GatherBackward")
    ops = tuple(
        i
        for i, n in enumerate(node_types)
        if i > after_gather and n not in ("ReduceAddBackward", "AccumulateGrad")
    )
    return JoinOrder(tuple(order), joins, ops, labels)
