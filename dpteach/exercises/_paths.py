"""Where a replica holds each of the original's tensors, and where its gradient goes.

Backward follows ``grad_fn.next_functions`` (``graph.walk.grad_fns`` walks them) until it reaches
``AccumulateGrad`` nodes, whose ``.variable`` is the leaf whose ``.grad`` gets filled. A replica
parameter is wired correctly when that walk reaches the *original* parameter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch
from torch import nn

from ..graph.walk import grad_fns


def leaves_behind(tensor: torch.Tensor) -> list[torch.Tensor]:
    """The leaf tensors a gradient arriving at ``tensor`` would end in (itself, if it is a leaf)."""
    if tensor.grad_fn is None:
        return [tensor] if tensor.requires_grad else []
    # only AccumulateGrad nodes have a .variable: the leaf whose .grad they fill
    return [fn.variable for fn in grad_fns([tensor.grad_fn]) if hasattr(fn, "variable")]


def nodes_behind(tensor: torch.Tensor, depth: int = 4) -> list[str]:
    """Names of the nodes within ``depth`` edges of ``tensor.grad_fn`` (e.g. ``'ReduceAddCoalescedBackward'``)."""
    names, frontier = [], [tensor.grad_fn] if tensor.grad_fn is not None else []
    for _ in range(depth):
        names += [type(n).__name__ for n in frontier]
        frontier = [nxt for n in frontier for nxt, _ in n.next_functions if nxt is not None]
    return names


@dataclass(frozen=True)
class Place:
    """One spot where a module holds a tensor, and the name of the original tensor there."""

    name: str  # "0.weight", "block.conv.weight": where the module holds it
    original_name: str  # the name `named_parameters()` gives the original (a tied weight has one)
    tensor: torch.Tensor  # the original tensor


def places(network: nn.Module, kind: str = "parameter") -> Iterator[Place]:
    """Every place ``network`` holds a parameter (or buffer) at, a tied one at each of its places."""
    named = network.named_parameters if kind == "parameter" else network.named_buffers
    first_name = {id(t): name for name, t in named()}
    for name, t in named(remove_duplicate=False):
        yield Place(name, first_name[id(t)], t)


def shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Do ``a`` and ``b`` live in the same memory (one is the other, or a view of it)?"""
    return a.device == b.device and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def edge_problem(t: torch.Tensor | None, place: Place, slot: int) -> tuple[str, str] | None:
    """(kind, sentence) when replica ``slot``'s tensor at ``place`` has no gradient path to the original."""
    who = f"replica {slot}'s `{place.name}`"
    original = f"the original `{place.original_name}`"
    if t is None:
        return "missing", f"{who} is missing: the replica should hold a copy of {original} there"
    if any(leaf is place.tensor for leaf in leaves_behind(t)):
        return None
    if not t.requires_grad:
        return "no_grad", (
            f"{who} does not require grad (made under `torch.no_grad()` or with `.detach()`), so backward never "
            f"reaches it and there is no path to {original} (see chapter 01)"
        )
    if t.grad_fn is None:
        return "fresh_leaf", (
            f"{who} has no path to {original}: it is a fresh leaf, so its gradient stops in the replica "
            "(see chapter 01)"
        )
    return "wrong_leaf", (
        f"{who} has no path to {original}: its edges lead to a leaf of the replica's own, so its gradient "
        f"stops in the replica (see chapter 03)"
    )
