"""The tiny models every check runs, and what one device computes for each (the reference).

Three models cover what goes wrong in replication: an MLP (plain parameters), a conv net with BatchNorm
(buffers updated in place), and two layers sharing one weight (one copy per replica, both uses' gradient).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

BATCH = 8  # rows per check; 1-4 slots split it into 1-4 pieces


class TiedNet(nn.Module):
    """Two layers sharing one weight (their biases are their own), then a head."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.b.weight = self.a.weight  # tied: one Parameter in two places
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.b(torch.tanh(self.a(x)))))


def conv_bn() -> nn.Module:
    # Tanh, not ReLU, so second derivatives are not zero (double backward has something to check);
    # no conv bias: BatchNorm cancels it, so its gradient is rounding noise
    return nn.Sequential(
        nn.Conv2d(1, 3, 3, bias=False), nn.BatchNorm2d(3), nn.Tanh(), nn.Flatten(), nn.Linear(27, 2)
    )


@dataclass(frozen=True)
class Case:
    """A model and the shape of its input."""

    name: str
    build: Callable[[], nn.Module]
    input_shape: tuple[int, ...]

    def make(self, seed: int = 0) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
        """The model, a batch and the weights of the loss ``(out * w).sum()``, the same for the same seed."""
        with torch.random.fork_rng(devices=[]):  # the learner's global random state is left alone
            torch.manual_seed(seed)
            model = self.build()
            x = torch.randn(BATCH, *self.input_shape)
            w = torch.randn(BATCH, 2)
        return model, x, w


CASES = (
    Case("the MLP", lambda: nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2)), (4,)),
    Case("the conv net with BatchNorm", conv_bn, (1, 5, 5)),
    Case("the tied-weight model", TiedNet, (4,)),
)


@dataclass
class Reference:
    """What one device computes for the same pieces of the batch DataParallel runs."""

    output: torch.Tensor
    grads: dict[str, torch.Tensor]
    second: dict[str, torch.Tensor] | None  # gradients of the gradient penalty, when asked for
    buffers: dict[str, torch.Tensor]  # the module's buffers after slot 0's piece went through it


def reference(
    model: nn.Module, x: torch.Tensor, w: torch.Tensor, slots: int, double: bool = False
) -> Reference:
    """Run a copy of ``model`` on each of ``x.chunk(slots)`` in turn, as DataParallel's replicas would.

    In training mode BatchNorm normalises each piece with that piece's statistics, so the reference
    runs piece by piece too. Only slot 0's replica shares the original's buffers, so the buffers to
    expect are those of a copy that saw piece 0 alone.
    """
    ref = copy.deepcopy(model)
    pieces = x.chunk(slots)
    out = torch.cat([ref(p) for p in pieces])
    grads, second = gradients((out * w).sum(), dict(ref.named_parameters()), double)
    seen = copy.deepcopy(model)
    with torch.no_grad():
        seen(pieces[0])
    return Reference(out.detach(), grads, second, {k: b.detach().clone() for k, b in seen.named_buffers()})


def gradients(loss: torch.Tensor, params: dict[str, torch.Tensor], double: bool = False):
    """``loss``'s gradient for each of ``params`` (None where none arrives) and, with ``double``, the gradients
    of the penalty ``sum((g**2).sum())`` (zero where it does not depend on one; all None without a history)."""
    tensors = list(params.values())
    first = torch.autograd.grad(loss, tensors, create_graph=double, allow_unused=True)
    grads = {k: None if g is None else g.detach() for k, g in zip(params, first)}
    with_history = [g for g in first if g is not None and g.requires_grad]
    if not (double and with_history):
        return grads, dict.fromkeys(params) if double else None
    seconds = torch.autograd.grad(sum((g**2).sum() for g in with_history), tensors, allow_unused=True)
    second = {k: torch.zeros_like(params[k]) if g is None else g.detach() for k, g in zip(params, seconds)}
    return grads, second
