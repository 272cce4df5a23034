"""The DataParallel explorer's model: the course model trained under a strategy, beside a one-device reference.

Plain Python, no ipywidgets: ``view_explorer.py`` only shows what a ``TrainingLab`` holds, so tests and
static renders use this directly.

    lab = TrainingLab(strategy="clone", slots=2, lr=0.2, steps=60)
    lab.step()                  # one SGD step of both models, then the next step's loss and gradients
    lab.losses, lab.reference_losses
    lab.grad_rows()             # each original parameter's gradient norm against one device's, at the same weights
    lab.weight_gap()            # how far DataParallel's weights are from the one-device run's
    lab.graph                   # the autograd graph of the current step (dpteach.autograd_graph)

``losses[k]`` is the loss after ``k`` SGD steps, so ``losses[0]`` is the untrained model's loss
and ``step_count == len(losses) - 1``. Under ``"clone"`` (issue #19540) the original's ``.grad``
stays ``None``, SGD skips every parameter and the curve stays flat.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from .._devices import default_devices
from ..course import story
from ..data_parallel import DataParallel, keep_replicas
from ..replicate import STRATEGIES as _REGISTRY

STRATEGIES = tuple(_REGISTRY)  # the names, in history order, for dropdowns and checks
# The largest relative gap between the original's gradient norm and one device's that still "agrees"
# (GradRow.matches); the status line names it, as the loss chart's mark names its own 1% (pictures.APART):
# two rules, each labelled.
MATCH = 1e-4
_MATCH = f"{MATCH:.0e}".replace("e-0", "e-")  # as the status line prints it: 1e-4


@contextlib.contextmanager
def one_thread():
    """Torch's CPU ops on one intra-op thread inside the block, the setting put back after. The course model
    is too small to split: on a busy machine the extra threads only wait for each other, and a step can
    take ten times as long. One thread changes no lesson here: nothing these labs show is a time."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def slot_devices(n: int) -> list[torch.device]:
    """``n`` replica slots over the devices there are: every GPU in turn, else ``n`` slots on the one device."""
    if n < 1:
        raise ValueError(f"slots must be at least 1, got {n}")
    base = default_devices()
    return [base[i % len(base)] for i in range(n)]


def tensor_at(module: nn.Module, dotted: str) -> torch.Tensor | None:
    """``module.0.weight`` by name, even where a replica keeps it as a plain attribute (not in ``_parameters``)."""
    *path, key = dotted.split(".")
    for part in path:
        module = module._modules.get(part)
        if module is None:
            return None
    value = getattr(module, key, None)
    return value if isinstance(value, torch.Tensor) else None


def own_grad_norm(t: torch.Tensor | None) -> float | None:
    """The norm of ``t.grad``; None where ``t`` has none (never read ``.grad`` of a non-leaf: torch warns)."""
    if t is None or not t.is_leaf or t.grad is None:
        return None
    return t.grad.detach().norm().item()


@torch.no_grad()
def sgd_step(model: nn.Module, lr: float) -> None:
    """Plain SGD, as ``torch.optim.SGD(lr=lr).step()`` does it (without its first-use import of torch._dynamo,
    seconds on a busy machine): ``p -= lr * p.grad``, skipping a parameter whose ``.grad`` is None."""
    for p in model.parameters():
        if p.grad is not None:  # under "clone" every .grad is None: nothing moves (#19540)
            p.add_(p.grad, alpha=-lr)


def _number(v: float) -> str:
    """A loss as the status line shows it: four decimals, or powers of ten once a diverging run grows large."""
    return f"{v:.4f}" if not math.isfinite(v) or abs(v) < 1e4 else f"{v:.4e}"


@dataclass(frozen=True)
class GradRow:
    """One original parameter after a backward pass: where its gradient is."""

    name: str
    shape: tuple[int, ...]
    reference: float  # one device's gradient norm at the original's own weights: what the original should get
    original: float | None  # the original's .grad norm under DataParallel; None: .grad is None (the bug)
    replicas: tuple[
        float | None, ...
    ]  # each replica's own .grad norm; None: not a leaf, it passed the gradient on

    @property
    def matches(self) -> bool:
        """The original got a gradient as large as one device's: the two norms differ by at most ``MATCH``
        of one device's norm (a relative gap at every size; a zero norm must be matched exactly). It compares
        norms only, not the gradients' entries or the weights."""
        return self.original is not None and abs(self.original - self.reference) <= MATCH * abs(
            self.reference
        )


class TrainingLab:
    """One DataParallel run of the course model and its one-device reference, stepped by hand."""

    def __init__(
        self, strategy: str = "clone", slots: int = 2, lr: float = 0.2, steps: int = 60, seed: int = 0
    ):
        self.strategy, self.slots, self.lr, self.steps, self.seed = strategy, slots, lr, steps, seed
        self._check()
        self.reset()

    def _check(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {self.strategy!r}; choose one of {', '.join(STRATEGIES)}")
        if int(self.slots) < 1 or int(self.steps) < 1 or not self.lr > 0:
            raise ValueError(
                f"slots and steps must be at least 1 and lr positive, got {self.slots}, {self.steps}, {self.lr}"
            )

    def configure(self, **changes) -> bool:
        """Change settings; a new strategy, slot count, learning rate or seed starts a fresh run (returns True then)."""
        unknown = set(changes) - {"strategy", "slots", "lr", "steps", "seed"}
        if unknown:
            raise TypeError(
                f"unknown setting(s) {sorted(unknown)}; settings are strategy, slots, lr, steps, seed"
            )
        old = {k: getattr(self, k) for k in changes}
        for k, v in changes.items():
            setattr(self, k, v)
        try:
            self._check()
        except ValueError:
            for k, v in old.items():
                setattr(self, k, v)
            raise
        fresh = any(k != "steps" and old[k] != v for k, v in changes.items())
        if fresh:
            self.reset()
        return fresh

    def reset(self) -> None:
        """Fresh models from the seed, no steps taken; computes step 0's loss, gradients and graph."""
        self.devices = slot_devices(int(self.slots))
        x, y = story.make_data(seed=self.seed)
        self.x, self.y = x.to(self.devices[0]), y.to(self.devices[0])
        self.model = story.make_model(self.seed).to(self.devices[0])
        self.reference = story.make_model(self.seed).to(self.devices[0])
        # one device at DataParallel's weights, for the gradient table: like for like even where the two
        # runs have parted ("clone" never moves; a large learning rate magnifies rounding)
        self.twin = story.make_model(self.seed).to(self.devices[0])
        self.dp = DataParallel(self.model, self.devices, strategy=self.strategy)
        self.losses: list[float] = []
        self.reference_losses: list[float] = []
        self._evaluate()

    @one_thread()
    def _evaluate(self) -> None:
        """Forward and backward at the current weights: this step's losses, gradients and replicas."""
        self.model.zero_grad(set_to_none=True)
        self.reference.zero_grad(set_to_none=True)
        with keep_replicas(self.dp) as replicas:  # keep the replicas this forward makes, to read their .grad
            loss = nn.functional.mse_loss(self.dp(self.x), self.y)
        loss.backward()
        ref_loss = nn.functional.mse_loss(self.reference(self.x), self.y)
        ref_loss.backward()  # the one-device run's own gradient: its next SGD step
        with torch.no_grad():
            for mine, theirs in zip(self.twin.parameters(), self.model.parameters()):
                mine.copy_(theirs)
        self.twin.zero_grad(set_to_none=True)
        nn.functional.mse_loss(self.twin(self.x), self.y).backward()
        self.loss, self.replicas = (
            loss,
            list(replicas),
        )  # no replicas with one slot: DataParallel runs the module itself
        self.losses.append(loss.item())
        self.reference_losses.append(ref_loss.item())
        self._graph = None

    @property
    def step_count(self) -> int:
        return len(self.losses) - 1

    @property
    def done(self) -> bool:
        """All ``steps`` steps taken."""
        return self.step_count >= self.steps

    def step(self) -> None:
        """One SGD step of both models, then the next step's loss, gradients and graph."""
        for model in (self.model, self.reference):
            sgd_step(model, self.lr)
        self._evaluate()

    def run(self, callback: Callable[["TrainingLab"], None] | None = None, every: int = 10) -> int:
        """Step until ``steps`` steps are done, calling ``callback(self)`` every ``every`` steps; returns steps taken."""
        taken = 0
        while not self.done:
            self.step()
            taken += 1
            if callback is not None and every and taken % every == 0 and not self.done:
                callback(self)
        return taken

    def weight_gap(self) -> float:
        """The largest difference between a DataParallel weight and the one-device run's same weight."""
        pairs = zip(self.model.parameters(), self.reference.parameters())
        return max((p - q).abs().max().item() for p, q in pairs)

    def grad_rows(self) -> list[GradRow]:
        """Every original parameter's gradient norm, one device's at the same weights, and each replica's own
        (read after backward): like for like at every step, whatever the two runs' weights have become."""
        ref = dict(self.twin.named_parameters())
        rows = []
        for name, p in self.model.named_parameters():
            replicas = tuple(own_grad_norm(tensor_at(r, name)) for r in self.replicas)
            rows.append(
                GradRow(name, tuple(p.shape), ref[name].grad.norm().item(), own_grad_norm(p), replicas)
            )
        return rows

    @property
    def graph(self):
        """The autograd graph of the current step's loss, its leaves named after the model and the replicas."""
        if self._graph is None:
            from ..graph import autograd_graph

            title = f"strategy={self.strategy!r}, {self.slots} slot{'s' * (self.slots != 1)}"
            self._graph = autograd_graph(
                self.loss, module=self.model, replicas=self.replicas or None, title=title
            )
        return self._graph

    @property
    def learned(self) -> bool:
        """The loss fell by at least a quarter (``story.Run.learned``'s rule)."""
        return story.Run("", list(self.losses)).learned

    def status(self) -> str:
        """One line: the step, both losses, a warning while the loss is above its start (or not finite),
        and what happened to the original's gradient."""
        k, loss, ref = self.step_count, self.losses[-1], self.reference_losses[-1]
        line = f"step {k} of {self.steps} · loss {_number(loss)} · one device {_number(ref)}"
        if not (math.isfinite(loss) and math.isfinite(ref)):
            return f"{line} · the loss diverged: the learning rate is too large for this model"
        rows = self.grad_rows()
        if any(r.original is None for r in rows):
            return f"{line} · the original's .grad is None: SGD skips every parameter"
        # SGD on the whole data set: a loss above its start means the steps overshoot (the gradients can
        # still agree: one device blows up alike)
        if loss > self.losses[0]:
            line = f"{line} · the loss is above its start: the learning rate is too large"
        # what it compares is each parameter's gradient norm (GradRow.matches), not the weights, and it
        # says its relative tolerance, so it never reads as the loss chart's 1% mark (pictures.APART)
        if all(r.matches for r in rows):
            return f"{line} · the original's gradient norms agree with one device's (relative gap ≤ {_MATCH})"
        return f"{line} · the original's gradient norms DIFFER from one device's (relative gap > {_MATCH})"

    def __repr__(self) -> str:
        return f"<TrainingLab strategy={self.strategy!r} slots={self.slots} lr={self.lr}: {self.status()}>"


class DriftTable:
    """Section 1a's table of two runs that drift apart: every step up to ``every_to``, then only the steps
    where something first happens. Each run's events are its own (``DataParallel inf``, ``one device nan``),
    so a run that overflows a step later than the other is said at its own step."""

    HEAD = "step  DataParallel  one device    weight gap  gradients at the same weights"

    def __init__(self, every_to: int = 10):
        self.every_to, self.rows, self.seen = every_to, [], set()
        self.firsts: dict[str, int] = {}  # each event's first step

    def add(self, step: int, dp: float, one: float, gap: float, grads: list[GradRow]) -> list[str]:
        """One step: both losses, the weight gap, the gradient rows; returns the events that first happen here."""
        events = {
            "losses 1% apart": abs(dp - one) > 0.01 * abs(one),
            "DataParallel inf": math.isinf(dp),
            "one device inf": math.isinf(one),
            "DataParallel nan": math.isnan(dp),
            "one device nan": math.isnan(one),
        }
        new = [name for name, now in events.items() if now and name not in self.seen]
        self.seen.update(new)
        self.firsts.update((name, step) for name in new)
        numbers = [r.reference for r in grads] + [r.original for r in grads if r.original is not None]
        if not all(math.isfinite(v) for v in numbers):
            verdict = "not finite"
        else:
            verdict = "agree" if all(r.matches for r in grads) else "DIFFER"
        if step <= self.every_to or new:
            note = f"  <- first: {', '.join(new)}" if new else ""
            self.rows.append(f"{step:4d}  {dp:<12.6g}  {one:<12.6g}  {gap:<10.1e}  {verdict}{note}")
        return new

    def ends(self) -> str | None:
        """One line: where each run first turns inf and nan, said once where both runs do so at the same steps."""
        said = {
            run: ", ".join(
                f"{what} at step {self.firsts[f'{run} {what}']}"
                for what in ("inf", "nan")
                if f"{run} {what}" in self.firsts
            )
            for run in ("DataParallel", "one device")
        }
        if not any(said.values()):
            return None
        if said["DataParallel"] == said["one device"]:
            return f"both runs: {said['DataParallel']}"
        return "; ".join(f"{run}: {text or 'finite throughout'}" for run, text in said.items())

    def lines(self) -> list[str]:
        ends = self.ends()
        return [self.HEAD, *self.rows, *([ends] if ends else [])]
