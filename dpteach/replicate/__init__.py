"""``replicate(network, devices, detach=False, *, strategy="broadcast")``: one replica per slot.

Three strategies, each faithful to its history (see each module's docstring):

=============  ==========================================================================
``"clone"``    the C++ frontend before PR #20910: deep copies, gradients never come back
``"rewire"``   PR #20910: clone, then one ``ReduceAdd`` node per original parameter
``"broadcast"`` Python's replicate.py: ``Broadcast`` / ``ReduceAddCoalesced`` (the default)
=============  ==========================================================================

A learner's own function ``f(network, devices, detach) -> list of replicas`` works too, and a
learner's own autograd node runs inside the library's code: ``rewire.replicate(..., node=ReduceAdd)``
(called ``node.apply(original, *copies)``), ``broadcast.replicate(..., broadcast=Broadcast)``.

What differs (each cell is checked by ``tests/core/test_strategy_nodes.py``); the markers ``# BROKEN
(#19540)``, ``# FIX (#20910)``, ``# BROKEN (#21144)``, ``# EDGE (Broadcast)`` and ``# SLOT 0
SHARES`` in the three modules show the lines that make each difference:

=============  ==============  ======================  ======================  =======================
strategy       replica param   slot 0's buffers        tied weights            double backward
               a leaf?
=============  ==============  ======================  ======================  =======================
``"clone"``    yes (#19540)    deep copies (#21144)    untied: two copies      nothing reaches the
                                                                               original
``"rewire"``   no: ReduceAdd   deep copies, inherited  two copies, one node:   refused by ReduceAdd
               output          from clone (#21144)     the gradients sum       (as in C++)
``"broadcast"`` no: Broadcast  the original's own      tied: one copy per      works (ReduceAdd-
               output          (BatchNorm stats kept)  replica                 Coalesced is a node)
=============  ==============  ======================  ======================  =======================

One node per what: ``"rewire"`` makes one ``ReduceAdd`` node per distinct original tensor, so a
weight tied between two modules has one node with both copies among its outputs. The C++
``replicate_grad_edges`` of PR #20910 walked each module's own registrations and made one node per
registration: such a weight got two nodes, both leading to the same ``AccumulateGrad`` (the same
sum).

Where the strategies differ in what backward leaves behind: a parameter the forward never used
gets a zero gradient under ``"broadcast"`` (one ``Broadcast`` node covers every parameter, as in
``torch.nn.DataParallel``) and keeps ``None`` under ``"rewire"`` (one ``ReduceAdd`` node per
parameter, reached only through a used copy), as on one device. ``"rewire"`` sums gradients into a
dense tensor, as the C++ node did, so a sparse gradient arrives dense. ScriptModules replicate under
every strategy (as in ``replicate.py``); ``torch.compile``'d modules are refused.
"""

from __future__ import annotations

import difflib
from typing import Callable, Sequence, Union

import torch
from torch import nn

from .._devices import DeviceLike, as_devices
from . import broadcast, clone, rewire
from ._modules import check_replicatable

Strategy = Union[str, Callable[[nn.Module, Sequence[torch.device], bool], Sequence[nn.Module]]]

# The one registry, in history order: the C++ bug (#19540), its fix (#20910), Python's replicate.py.
# Every module and test that lists the strategies reads this dict.
STRATEGIES: dict[str, Callable[..., list[nn.Module]]] = {
    "clone": clone.replicate,
    "rewire": rewire.replicate,
    "broadcast": broadcast.replicate,
}
FIXED = ("rewire", "broadcast")  # the strategies whose gradients reach the original module

__all__ = ["replicate", "resolve_strategy", "STRATEGIES", "FIXED", "ReduceAdd"]

ReduceAdd = rewire.ReduceAdd


def resolve_strategy(strategy: Strategy) -> Callable:
    """The replicate function behind a strategy name or callable."""
    if callable(strategy):
        return strategy
    if isinstance(strategy, str) and strategy in STRATEGIES:
        return STRATEGIES[strategy]
    valid = ", ".join(repr(s) for s in STRATEGIES)  # in the order history wrote them
    close = difflib.get_close_matches(strategy, STRATEGIES, n=1) if isinstance(strategy, str) else []
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ValueError(
        f"unknown strategy {strategy!r}; {hint}valid strategies are {valid}, "
        "or a callable f(network, devices, detach) -> list of replicas"
    )


def strategy_name(strategy: Strategy) -> str:
    """A readable name for messages: the string itself, or the callable's name."""
    return strategy if isinstance(strategy, str) else getattr(strategy, "__name__", repr(strategy))


def replicate(
    network: nn.Module,
    devices: Sequence[DeviceLike],
    detach: bool = False,
    *,
    strategy: Strategy = "broadcast",
) -> list[nn.Module]:
    """Replicas of ``network``, one per slot in ``devices`` (duplicates allowed).

    Slot 0 shares storage with ``network`` when it is on the same device (``"broadcast"``);
    every other slot owns its storage. With ``detach=True`` the replicas carry no autograd history.
    """
    fn, slots = resolve_strategy(strategy), as_devices(devices)
    check_replicatable(network, slots)
    replicas = fn(network, slots, detach)
    if not isinstance(replicas, (list, tuple)) or len(replicas) != len(slots):
        got = f"{len(replicas)} replicas" if isinstance(replicas, (list, tuple)) else type(replicas).__name__
        raise ValueError(
            f"strategy {strategy_name(strategy)!r} returned {got}, but replicate needs a list of {len(slots)} "
            "(one module per slot)"
        )
    return list(replicas)
