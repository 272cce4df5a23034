"""The gradient-flow stepper's model: one backward pass, node by node, with the gradients it really hands on.

``GradientFlow(strategy, slots)`` takes one step of the course model by hand (scatter, replicate,
parallel_apply, gather: ``dpteach.graph.replicated_forward``), puts a hook on every backward node
(``grad_fn.register_hook``), runs ``backward()``, and lines the nodes up with the drawn graph
(``dpteach.autograd_graph``). Each ``FlowStep`` is one node running, in the order autograd's
engine ran them: what it received, and which gradient (shape, norm) it handed to which node. The
engine runs a leaf's ``AccumulateGrad`` as soon as its gradient is ready (its sequence number is
UINT64_MAX, the highest priority, ``node.h``), so under ``"clone"`` a replica's ``AccumulateGrad``,
where the gradient stops (issue #19540), can run before other nodes. Under ``"broadcast"`` the
originals' ``AccumulateGrad`` come last: they wait for the one ``BroadcastBackward``, which needs
every replica parameter's gradient. Under ``"rewire"`` each parameter's ``ReduceAddBackward``, and
then its original's ``AccumulateGrad``, runs as soon as that parameter's gradients from every
replica have arrived, in between the replicas' other nodes (a node runs once all its inputs have
arrived; sequence numbers only order nodes that are ready).

Plain Python, no ipywidgets; ``view_stepper.py`` only shows it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .. import story
from .highlight import caption, highlight, legend_line
from .training import STRATEGIES, slot_devices, tensor_at


class AlignmentError(RuntimeError):
    """The drawn graph and the live autograd graph did not line up (a bug: please report it)."""


@dataclass(frozen=True)
class Grad:
    """A gradient as the stepper shows it: its shape and its norm."""

    shape: tuple[int, ...]
    norm: float

    @classmethod
    def of(cls, t: torch.Tensor) -> "Grad":
        return cls(tuple(t.shape), t.detach().double().norm().item())

    def __str__(self) -> str:
        shape = "scalar" if not self.shape else "×".join(map(str, self.shape))
        return f"{shape}, ‖g‖ = {self.norm:.4g}"


@dataclass(frozen=True)
class Handoff:
    """One gradient a node hands on: to which node of the graph, and what it is."""

    to: str  # the receiving node's id in the graph
    label: str  # what a learner reads for it
    grad: Grad | None  # None: autograd handed on no gradient (undefined) along this edge


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


def _backward_nodes(fn) -> list:
    """Every backward node reachable from ``fn`` (grad_fn objects, AccumulateGrad included)."""
    seen, stack, out = set(), [fn], []
    while stack:
        f = stack.pop()
        if f is None or id(f) in seen:
            continue
        seen.add(id(f))
        out.append(f)
        stack.extend(g for g, _ in f.next_functions)
    return out


def align(graph, loss: torch.Tensor, replicas) -> tuple[dict[str, object], dict[str, list[tuple[int, str]]]]:
    """Which grad_fn each graph node stands for, and where each of its ``next_functions`` entries leads.

    Follows the rule ``dpteach.graph`` walks by: a node's children are the distinct targets of its
    ``next_functions`` in order; an entry ``(fn, nr)`` that is a named replica parameter (a non-leaf
    under "rewire" and "broadcast") leads to that parameter's node, and from there to ``fn``'s node.
    Returns ``{node id: grad_fn}`` and ``{node id: [(entry index, child id), ...]}``.
    """
    sites = {}
    for n in graph.nodes.values():
        if n.kind == "replica" and not n.leaf:
            t = tensor_at(replicas[n.param.slot], n.param.name)
            sites[(id(t.grad_fn), t.output_nr)] = n.id
    fn_of: dict[str, object] = {}
    node_of: dict[int, str] = {}
    targets: dict[str, list[tuple[int, str]]] = {}

    def bind(nid: str, fn) -> None:
        node = graph.nodes[nid]
        want = "AccumulateGrad" if node.leaf else node.op
        if type(fn).__name__ != want or node_of.setdefault(id(fn), nid) != nid or fn_of.setdefault(nid, fn) is not fn:
            raise AlignmentError(f"graph node {nid} ({want}) does not match {type(fn).__name__}")

    (first,) = graph.children("output")
    start = sites.get((id(loss.grad_fn), loss.output_nr))
    queue = [graph.children(start)[0] if start else first]
    bind(queue[0], loss.grad_fn)
    while queue:
        nid = queue.pop()
        if nid in targets:
            continue
        children, local, out = iter(graph.children(nid)), {}, []
        for i, (f, nr) in enumerate(fn_of[nid].next_functions):
            if f is None:
                continue
            site = sites.get((id(f), nr))
            key = ("site", id(f), nr) if site else ("fn", id(f))
            if key not in local:
                local[key] = next(children, None)
            child = local[key]
            if child is None or (site and child != site):
                raise AlignmentError(f"entry {i} of {nid}'s next_functions leads nowhere in the graph")
            target = graph.children(child)[0] if site else child  # a named parameter leads on to its grad_fn
            bind(target, f)
            out.append((i, child))
            queue.append(target)
        targets[nid] = out
    return fn_of, targets


class GradientFlow:
    """One backward pass of the course model under ``strategy``, node by node."""

    def __init__(self, strategy: str = "clone", slots: int = 2, seed: int = 0):
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
        from ..graph import autograd_graph, replicated_forward

        self.strategy, self.slots, self.seed = strategy, slots, seed
        devices = slot_devices(slots)
        x, y = story.make_data(seed=seed)
        self.model = story.make_model(seed).to(devices[0])
        loss, self.replicas = replicated_forward(
            self.model, x.to(devices[0]), devices, strategy, lambda out: nn.functional.mse_loss(out, y.to(devices[0])))
        ran: list[tuple[object, tuple, tuple]] = []  # (node, what it handed on, what it received), in order
        for fn in _backward_nodes(loss.grad_fn):
            fn.register_hook(lambda grad_inputs, grad_outputs, fn=fn: ran.append((fn, grad_inputs, grad_outputs)))
        loss.backward()
        title = f"strategy={strategy!r}, {slots} slot{'s' * (slots != 1)}"
        self.graph = autograd_graph(loss, module=self.model, replicas=self.replicas, title=title)
        fn_of, targets = align(self.graph, loss, self.replicas)
        node_of = {id(fn): nid for nid, fn in fn_of.items()}
        first = self.graph.children("output")[0]
        self.steps = [FlowStep("output", "output", "output", (), (Handoff(first, self._label(first), Grad((), 1.0)),),
                               f"backward() starts at the loss: d loss / d loss = 1 goes to {self._label(first)}.")]
        for fn, handed, received in ran:
            nid = node_of[id(fn)]
            got = tuple(Grad.of(g) for g in received if g is not None)
            handoffs = tuple(Handoff(child, self._target(child), None if handed[i] is None else Grad.of(handed[i]))
                             for i, child in targets[nid])
            self.steps.append(FlowStep(nid, self._label(nid), self.graph.nodes[nid].kind, got, handoffs,
                                       self._sentence(nid, got, handoffs)))

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
        n, label = self.graph.nodes[nid], self._label(nid)
        if n.kind == "original":
            return (f"AccumulateGrad writes the .grad of {label} ({got[0]}): the end of this path, "
                    "and the gradient the optimizer reads.")
        if n.kind == "replica":
            return (f"AccumulateGrad writes the .grad of {label} ({got[0]}): a dead end. The replica is thrown away "
                    "after the step, and the original's .grad stays None (#19540).")
        if n.kind == "leaf":
            return f"AccumulateGrad writes the .grad of {label} ({got[0]})."
        into = ", ".join(sorted({h.label for h in handoffs}))
        if n.kind == "join":
            return (f"{label} receives {len(got)} gradients, one per replica parameter, and sums them into "
                    f"{into}: the edge back to the original (PR #20910 / replicate.py).")
        return f"{label} runs: it received {', '.join(map(str, got))} and hands {len(handoffs)} gradient(s) on."

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
        line = f"{len(self.steps)} steps; {len(originals)} of {total} original parameters got a gradient"
        return f"{line}; {len(stuck)} replica parameters kept theirs (dead ends)" if stuck else line

    def __repr__(self) -> str:
        return f"<GradientFlow strategy={self.strategy!r} slots={self.slots}: {self.summary()}>"
