"""The course's running example: one small model, one synthetic task, trained on one device or in parallel.

Chapter 01 trains it under ``strategy="clone"`` and watches nothing happen (issue #19540);
chapter 03 trains it under ``"rewire"`` and watches it learn; the widgets and ``python -m dpteach``
use the same pieces, so every place in the course tells the same story with the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch
from torch import nn

from .._devices import as_devices, default_devices
from ..data_parallel import DataParallel, step
from ..replicate import Strategy


def make_data(n: int = 256, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Points in the square [-2, 2]² and a smooth target, ``sin(x0) * cos(x1)``, with a little noise."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 2, generator=g) * 4 - 2
    y = torch.sin(x[:, :1]) * torch.cos(x[:, 1:]) + 0.05 * torch.randn(n, 1, generator=g)
    return x, y


def make_model(seed: int = 0, hidden: int = 16) -> nn.Sequential:
    """``Linear(2, hidden) → Tanh → Linear(hidden, 1)``, the same weights for the same seed.

    Seeded inside ``torch.random.fork_rng``: the caller's global random state is left as it was.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(2, hidden), nn.Tanh(), nn.Linear(hidden, 1))


@dataclass
class Run:
    """A training run: the loss after every step and the model it trained."""

    label: str
    losses: list[float] = field(default_factory=list)
    model: nn.Module | None = None

    @property
    def learned(self) -> bool:
        """Did the loss fall by at least a quarter? (A model that never updates keeps its first loss.)"""
        return len(self.losses) > 1 and self.losses[-1] < 0.75 * self.losses[0]


def train(
    strategy: Strategy | None = None,
    devices: Sequence | None = None,
    steps: int = 60,
    lr: float = 0.2,
    seed: int = 0,
    data: tuple[torch.Tensor, torch.Tensor] | None = None,
    model: nn.Module | None = None,
) -> Run:
    """Train the course model with SGD; ``strategy=None`` trains on one device, the reference.

    ``model`` trains that module instead of a fresh ``make_model(seed)``, moved to the first slot
    (chapter 04 trains a C++-style copy of the course model).
    """
    devices = as_devices(default_devices() if devices is None else devices)
    x, y = make_data(seed=seed) if data is None else data
    x, y = x.to(devices[0]), y.to(devices[0])  # the batch starts where the module lives, as in a real loop
    model = (make_model(seed) if model is None else model).to(devices[0])
    net = model if strategy is None else DataParallel(model, devices, strategy=strategy)
    label = "one device" if strategy is None else f"DataParallel, strategy={_name(strategy)!r}"
    run = Run(label, model=model)
    for _ in range(steps):
        loss = nn.functional.mse_loss(net(x), y)
        loss.backward()
        sgd_step(model, lr)  # under "clone" every .grad is None, so every parameter is skipped
        run.losses.append(loss.item())
    return run


def sgd_step(model: nn.Module, lr: float) -> None:
    """Plain SGD, ``p -= lr * p.grad``, then clear the gradients; a parameter whose ``.grad`` is None is skipped.

    The same update as ``torch.optim.SGD`` without momentum, written out because the first
    ``torch.optim`` optimizer a process builds imports ``torch._dynamo``: seconds on a small CPU.
    """
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p.add_(p.grad, alpha=-lr)
    model.zero_grad()


@dataclass
class GradientReport:
    """One backward pass of the course model: the original's gradient against one device's."""

    strategy: str
    grads: dict[str, torch.Tensor | None]
    reference: dict[str, torch.Tensor]
    replica_grads: list[dict[str, torch.Tensor | None]]

    @property
    def missing(self) -> list[str]:
        """Original parameters whose ``.grad`` stayed ``None``."""
        return [k for k, g in self.grads.items() if g is None]

    @property
    def matches(self) -> bool:
        """Every original gradient is there and equals the one-device gradient."""
        return not self.missing and all(
            torch.allclose(self.grads[k], self.reference[k], rtol=1e-4, atol=1e-6) for k in self.reference
        )

    def summary(self) -> str:
        if self.missing:
            held = sum(1 for r in self.replica_grads if any(g is not None for g in r.values()))
            return (
                f"original .grad is None for {', '.join(self.missing)}; "
                f"{held} replica(s) hold gradients nobody reads"
            )
        diff = max((self.grads[k] - self.reference[k]).abs().max().item() for k in self.reference)
        verdict = "equal to" if self.matches else "DIFFERENT from"
        return f"gradients {verdict} one device's (largest difference {diff:.1e})"

    def __repr__(self) -> str:
        """One line a notebook can show: the verdict, not the tensors (``.grads`` and the others hold those)."""
        present = [k for k in self.reference if self.grads.get(k) is not None]
        diff = max(((self.grads[k] - self.reference[k]).abs().max().item() for k in present), default=None)
        return (
            f"GradientReport(strategy={self.strategy!r}, matches={self.matches}, "
            f"largest_difference={'n/a' if diff is None else f'{diff:.1e}'}, "
            f"grad_is_none={self.missing}, replicas={len(self.replica_grads)})"
        )


def one_step(strategy: Strategy, devices: Sequence | None = None, seed: int = 0) -> GradientReport:
    """Run one forward and backward under ``strategy`` and compare with one device.

    The replicas are kept (``data_parallel.step``), and made even on one slot, so the report can
    show where the gradients went when they did not reach the original.
    """
    devices = as_devices(default_devices() if devices is None else devices)
    x, y = make_data(seed=seed)
    ref = make_model(seed)
    nn.functional.mse_loss(ref(x), y).backward()
    x, y = x.to(devices[0]), y.to(devices[0])
    model = make_model(seed).to(devices[0])
    done = step(model, x, devices, strategy=strategy, loss_fn=lambda out: nn.functional.mse_loss(out, y))
    grads = {k: (None if p.grad is None else p.grad.detach().cpu()) for k, p in model.named_parameters()}
    reference = {k: p.grad.detach().cpu() for k, p in ref.named_parameters()}
    replica_grads = [
        {k: (None if p.grad is None else p.grad.detach().cpu()) for k, p in r.named_parameters()}
        for r in done.replicas
    ]
    return GradientReport(_name(strategy), grads, reference, replica_grads)


def _name(strategy: Strategy) -> str:
    return strategy if isinstance(strategy, str) else getattr(strategy, "__name__", "custom")


FOUR_MOVES = ("scatter", "replicate", "parallel_apply", "gather")
FOUR_MOVES_STEPS = (
    ("x", "scatter"), ("scatter", "pieces"), ("model", "replicate"), ("replicate", "replicas"),
    ("pieces", "parallel_apply"), ("replicas", "parallel_apply"), ("parallel_apply", "outputs"),
    ("outputs", "gather"), ("gather", "output"), ("output", "loss"),
)  # fmt: skip


# The legend names what each kind of arrow means for backward, not which strategy makes the dashed one:
# chapter 00 asks that. A black arrow is a forward step with a gradient edge back along it: every arrow
# from the replicas on. A blue one is the batch's way (x, scatter, the pieces): x requires no grad, so
# none of them carries an edge. A grey one is replicate's, drawn as before PR #20910's fix, with no edge
# back of its own; the dashed ones, from each replica to the model, are the edges replicate must create.
FORWARD_EDGE = "forward; a gradient edge\nruns back along it"
BATCH_EDGE = "the batch's way: x requires\nno grad, so no edge runs back"
GRADIENT_EDGE = "the edge back that\nreplicate must create"
COPY_EDGE = "replicate as before the\nfix: no edge back of its own"
# The title says which state is drawn: replicate before PR #20910; the dashed edges are what a fixed
# replicate records (the default strategy included). It names no strategy, for the reason above.
TITLE = "One step on two slots, replicate drawn as before PR #20910's fix:\nthe red dashed edges are the ones the fix (and the default) add"
COPY_LOOK = {"color": "gray55", "fontcolor": "gray35", "penwidth": "1.6"}
BATCH_LOOK = {"color": "royalblue3", "fontcolor": "royalblue4"}

PER_SLOT = {"pieces": "piece", "replicas": "replica", "parallel_apply": "parallel_apply", "outputs": "output"}


def four_moves_lanes(slots: int = 2) -> list[tuple[str, str]]:
    """FOUR_MOVES_STEPS with one lane per slot: ``pieces`` become ``piece 0``, ``piece 1``, ... and so on.

    Everything per slot (a piece, a replica, its forward, its output) stays in its own lane; the
    moves that join the lanes (scatter, replicate, gather) are drawn once.
    """
    lanes = []
    for a, b in FOUR_MOVES_STEPS:
        if a in PER_SLOT or b in PER_SLOT:
            lanes += [
                tuple(f"{PER_SLOT[n]} {i}" if n in PER_SLOT else n for n in (a, b)) for i in range(slots)
            ]
        else:
            lanes.append((a, b))
    return lanes


def _copies(a: str, b: str) -> bool:
    """Whether the arrow a -> b is replicate's: a copy, with a gradient edge back only if replicate records one."""
    return "replicate" in (a, b)


def _batch(a: str, b: str) -> bool:
    """Whether the arrow a -> b carries the batch (x, scatter, a piece): no edge back, as x requires no grad."""
    return a == "x" or any(n.startswith("piece ") for n in (a, b))


def _look(a: str, b: str) -> dict[str, str]:
    """How the picture draws the arrow a -> b: grey for replicate's, blue for the batch's, else black."""
    return COPY_LOOK if _copies(a, b) else BATCH_LOOK if _batch(a, b) else {}


def four_moves_picture(slots: int = 2):
    """Chapter 00's picture of one DataParallel step: boxes are moves, ovals are data, up to the loss.

    One lane (a column) per slot holds that slot's piece, replica, forward and output, so the replicas
    stand side by side. The labels name no strategy: which replica shares the model's storage, and
    which has the dashed edge backward needs from each replica to the model, are chapter 00's
    predictions, answered by its cells.
    A ``graphviz.Digraph`` when ``dot`` and the ``graphviz`` package are there, else the same edges as
    text. Drawn top to bottom with the legend beside it, so that it fits a notebook column (about
    900 px) at full size.

    The README's figure, ``docs/four_moves.png``, is this picture at 144 dpi::

        picture = four_moves_picture(); picture.graph_attr["dpi"] = "144"
        picture.render("docs/four_moves", format="png", cleanup=True)
    """
    import importlib.util
    import shutil

    edges = four_moves_lanes(slots)
    if not (shutil.which("dot") and importlib.util.find_spec("graphviz")):
        solid, grey, blue, dashed = (
            label.replace("\n", " ") for label in (FORWARD_EDGE, COPY_EDGE, BATCH_EDGE, GRADIENT_EDGE)
        )
        notes = [
            f"   ({grey})" if _copies(a, b) else f"   ({blue})" if _batch(a, b) else "" for a, b in edges
        ]
        lines = [f"{a:>16} -> {b}{note}" for (a, b), note in zip(edges, notes)]
        return "\n".join(
            [
                TITLE.replace("\n", " "),
                f"(each arrow without a note: {solid}; replicate is where the bug lives)",
            ]
            + lines
            + [f"{f'replica {i}':>16} -> model    (dashed: {dashed})" for i in range(slots)]
        )
    import graphviz

    picture = graphviz.Digraph(graph_attr={"rankdir": "TB", "ranksep": "0.3", "nodesep": "0.15", "label": TITLE,
                                           "labelloc": "t", "fontsize": "12"})  # fmt: skip
    for i in range(slots):  # one lane per slot: its piece and replica side by side, its forward, its output
        with picture.subgraph(name=f"cluster_slot{i}") as lane:
            # the label at the lane's foot: at its head, scatter's arrow and the dashed ones would cross it
            lane.attr(label=f"slot {i}", labelloc="b", style="rounded,filled", fillcolor="gray95",
                      color="gray60")  # fmt: skip
            lane.node(f"piece {i}", shape="ellipse", style="filled", fillcolor="white")
            lane.node(f"replica {i}", shape="ellipse", style="filled", fillcolor="white")
            lane.node(f"parallel_apply {i}", f"parallel_apply:\nreplica {i} on piece {i}", shape="box",
                      style="filled", fillcolor="lightblue")  # fmt: skip
            lane.node(f"output {i}", shape="ellipse", style="filled", fillcolor="white")
    for name in dict.fromkeys(n for edge in edges for n in edge):  # first-seen order: stable
        if name[-1].isdigit():
            continue  # drawn in its lane above
        bug = name == "replicate"
        picture.node(
            name,
            "replicate\n(the bug lives here)" if bug else "output\n(on slot 0)" if name == "output" else name,
            shape="box" if name in FOUR_MOVES else "ellipse",
            style="filled",
            fillcolor="salmon" if bug else "lightblue" if name in FOUR_MOVES else "white",
        )
    with picture.subgraph(name="cluster_legend") as legend:  # the legend, inside the picture
        legend.attr(label="legend", fontsize="10")
        legend.node("a move", shape="box", style="filled", fillcolor="lightblue")
        legend.node("data", shape="ellipse")
        legend.node(
            "the move with the bug", "the move\nwith the bug", shape="box", style="filled", fillcolor="salmon"
        )
        dashed = {"style": "dashed", "color": "red", "fontcolor": "red"}
        rows = (
            ("solid", FORWARD_EDGE, {}),
            ("blue", BATCH_EDGE, BATCH_LOOK),
            ("grey", COPY_EDGE, COPY_LOOK),
            ("dash", GRADIENT_EDGE, dashed),
        )
        for end, label, look in rows:
            with legend.subgraph() as row:  # a short arrow, drawn level, with its meaning above it
                row.attr(rank="same")
                row.node(f"{end}_from", "", shape="point", width="0.03")
                row.node(f"{end}_to", "", shape="point", width="0.03")
                row.edge(f"{end}_from", f"{end}_to", label=label, fontsize="10", minlen="2", **look)
        legend.edge("a move", "data", style="invis")  # invisible edges stack the legend in a column
        legend.edge("data", "the move with the bug", style="invis")
        legend.edge("the move with the bug", "solid_from", style="invis")
        legend.edge("solid_from", "blue_from", style="invis")
        legend.edge("blue_from", "grey_from", style="invis")
        legend.edge("grey_from", "dash_from", style="invis")
    for a, b in edges:
        picture.edge(a, b, **_look(a, b))
    for i in range(slots):  # backward's way from each replica to the model: the edge C++'s clones lacked
        # drawn against the forward arrows, and left out of the layout, which keeps slot 0's lane on the left
        picture.edge("model", f"replica {i}", style="dashed", color="red", dir="back", constraint="false")
    return picture
