"""Chapter 09's model and data: the course's running example (``dpteach.course.story``), and a deeper kin.

Every rank builds the same model from the same seed and draws the same global batch, then keeps
its own shard of it, so "the same step on one device" is well defined and checkable. The course
model has two layers; buckets and step times need more, so ``depth`` adds hidden layers of the
same kind (``depth=1`` is ``story.make_model`` itself).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from .._devices import as_devices
from ..course import story
from ..data_parallel import DataParallel

make_data = story.make_data  # points in [-2, 2]², target sin(x0)·cos(x1): the course's task
sgd_step = story.sgd_step  # p -= lr * p.grad, without importing torch.optim (and torch._dynamo)


def make_model(hidden: int = 16, depth: int = 1, seed: int = 0) -> nn.Sequential:
    """The course model for ``depth=1``; otherwise ``depth`` Tanh hidden layers of width ``hidden``."""
    if depth == 1:
        return story.make_model(seed, hidden)
    with torch.random.fork_rng(devices=[]):  # as story.make_model does: the same weights on every rank
        torch.manual_seed(seed)
        layers: list[nn.Module] = [nn.Linear(2, hidden), nn.Tanh()]
        for _ in range(depth - 1):
            layers += [nn.Linear(hidden, hidden), nn.Tanh()]
        return nn.Sequential(*layers, nn.Linear(hidden, 1))


def loss_fn(output: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean squared error over the rows given: the whole batch, or one rank's shard."""
    return F.mse_loss(output, y)


def shard_bounds(
    global_batch: int, world_size: int, shards: Sequence[int] | None = None
) -> list[tuple[int, int]]:
    """Rows ``[start, end)`` of the global batch that each rank keeps; equal shards unless ``shards`` says otherwise."""
    if shards is None:
        if global_batch % world_size:
            raise ValueError(
                f"a global batch of {global_batch} does not split into {world_size} equal shards; "
                "pick a multiple of the world size, or pass shards=[...] explicitly"
            )
        shards = [global_batch // world_size] * world_size
    shards = list(shards)
    if len(shards) != world_size or sum(shards) != global_batch or min(shards) < 1:
        raise ValueError(f"shards {shards} must be {world_size} positive sizes summing to {global_batch}")
    starts = [sum(shards[:r]) for r in range(world_size)]
    return [(s, s + n) for s, n in zip(starts, shards)]


def single_device_gradients(
    global_batch: int = 8, hidden: int = 16, depth: int = 1, seed: int = 0
) -> dict[str, torch.Tensor]:
    """The reference: one model, the whole batch, one mean loss, one backward."""
    model = make_model(hidden, depth, seed)
    x, y = make_data(global_batch, seed)
    loss_fn(model(x), y).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def data_parallel_gradients(
    global_batch: int = 8, hidden: int = 16, depth: int = 1, seed: int = 0, devices: Sequence | None = None
) -> dict[str, torch.Tensor]:
    """dpteach's DataParallel: scatter the batch, gather the outputs, one mean loss over the gathered batch."""
    slots = as_devices(["cpu", "cpu"] if devices is None else devices)
    model = make_model(hidden, depth, seed).to(slots[0])
    dp = DataParallel(model, slots)
    x, y = (t.to(slots[0]) for t in make_data(global_batch, seed))
    loss_fn(dp(x), y).backward()  # the gathered output holds every row, so this is the single-device loss
    return {name: p.grad.cpu() for name, p in model.named_parameters()}
