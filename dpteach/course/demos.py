"""Modules and strategies that chapters 04 and 05 use to show what breaks, and why.

* ``CppStyleLinear``: a Linear written the way ``LinearImpl`` is in the C++ frontend. Its forward
  reads *member handles* set in ``reset()``, not the parameter registry, so putting a new tensor
  in ``_parameters`` does not change what forward uses (the "Failed Attempt" of PR #20910).
* ``cpp_clone``: ``Cloneable::clone(device)``, a deep copy with fresh leaf tensors.
* ``failed_attempt``: the PR's first try, as a ``strategy=``: clone, ``Broadcast``, assign into
  ``_parameters``. Works for ``nn.Linear`` (its forward reads ``self.weight`` through the
  registry) and silently trains nothing for ``CppStyleLinear``.
* ``ReduceAddInPlace``, ``option_one``: the PR's Option One, the fix that landed, in Python: the
  replicas' own tensors get a new history (``ctx.mark_dirty``), so every handle on them sees it.
* ``Replicatable``, ``ReplicatableLinear``, ``option_two``: the PR's Option Two, where each module
  knows how to load its replica's tensors (like ``Cloneable`` knows how to clone).
* ``CallCounter``: module state three ways (attribute, buffer updated in place, buffer rebound),
  to see which survives a DataParallel forward (chapter 05, issue #2864).
* ``running_means``: a BatchNorm's running mean, forward after forward, on one device and under
  DataParallel (chapter 05's first figure).
* ``same_grads_as_python``: do a C++ step's gradients equal a Python strategy's (chapter 10)?
"""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .._devices import as_devices
from ..data_parallel import DataParallel
from ..replicate._modules import walk_pairs
from ..replicate.broadcast import broadcast_per_slot

__all__ = [
    "CppStyleLinear",
    "cpp_style",
    "cpp_clone",
    "failed_attempt",
    "ReduceAddInPlace",
    "option_one",
    "Replicatable",
    "ReplicatableLinear",
    "option_two",
    "CallCounter",
    "SLOT0_ROWS",
    "running_means",
    "same_grads_as_python",
]


class CppStyleLinear(nn.Module):
    """``y = x W^T + b``, written like C++'s ``LinearImpl``: forward reads ``self.members``.

    In C++, ``reset()`` does ``weight = register_parameter("weight", ...)``: the member ``weight``
    and ``parameters_["weight"]`` are two handles on one ``TensorImpl``. Here ``members.weight`` and
    ``_parameters["weight"]`` are two references to one tensor object. Replacing the registry entry
    leaves the member where it was.
    """

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.reset()

    def reset(self) -> None:
        """Register fresh parameters and keep member handles on them (``LinearImpl::reset``)."""
        weight = nn.Parameter(torch.empty(self.out_features, self.in_features))
        bias = nn.Parameter(torch.empty(self.out_features))
        self.register_parameter("weight", weight)
        self.register_parameter("bias", bias)
        self.members = SimpleNamespace(weight=weight, bias=bias)  # Tensor weight; Tensor bias; in LinearImpl
        bound = 1 / math.sqrt(self.in_features)
        with torch.no_grad():  # nn.Linear's initialisation, so the two modules can hold the same numbers
            nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
            nn.init.uniform_(bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the members, not self.weight: what LinearImpl::forward reads (torch::linear(input, weight, bias))
        return F.linear(x, self.members.weight, self.members.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"


def cpp_style(model: nn.Module, cls: type = CppStyleLinear) -> nn.Module:
    """A deep copy of ``model`` with every ``nn.Linear`` rewritten as ``cls``, holding the same numbers."""
    model = copy.deepcopy(model)
    for name, child in list(model.named_children()):
        if isinstance(child, nn.Linear) and child.bias is not None:
            twin = cls(child.in_features, child.out_features).to(child.weight.device)
            with torch.no_grad():
                twin.weight.copy_(child.weight)
                twin.bias.copy_(child.bias)
            setattr(model, name, twin)
        else:
            setattr(model, name, cpp_style(child, cls))
    return model


def cpp_clone(module: nn.Module, device: torch.device | str) -> nn.Module:
    """``Cloneable::clone(device)``: a deep copy whose tensors are fresh leaves with no history.

    ``deepcopy`` keeps aliasing inside the copy, so a member handle and its registry entry stay one
    tensor object, as the C++ copy's member and map entry share a ``TensorImpl``. Then each tensor's
    data moves to ``device`` in place (``set_data``), so the handles keep pointing at it.
    """
    device = torch.device(device)
    with torch.no_grad():  # NoGradGuard no_grad;
        replica = copy.deepcopy(module)
        for tensor in list(replica.parameters()) + list(replica.buffers()):
            tensor.grad = None
            tensor.data = tensor.data.to(device)  # set_data(data.to(device)): same object, new storage
    return replica


def _clones_and_copies(network: nn.Module, devices: Sequence, detach: bool):
    """The first two steps both designs share: a ``cpp_clone`` per slot, and every parameter broadcast.

    Returns the replicas, the copies per slot, and each original parameter's index among the copies.
    """
    slots = as_devices(devices)
    replicas = [cpp_clone(network, d) for d in slots]
    params = list(network.parameters())
    return replicas, broadcast_per_slot(params, slots, detach), {p: i for i, p in enumerate(params)}


def failed_attempt(network: nn.Module, devices: Sequence, detach: bool = False) -> list[nn.Module]:
    """PR #20910's "Failed Attempt", usable as ``strategy=``: clone, ``Broadcast``, assign into the registry.

    1. ``cpp_clone`` the module onto every slot;
    2. ``Broadcast`` every original parameter to every slot (its backward sums onto the original);
    3. put each slot's copy in the replica's ``_parameters`` (C++: ``parameters_[key] = copy``).
    A module whose forward reads ``self.weight`` now uses the copy; a ``CppStyleLinear`` does not.
    """
    replicas, copies, index = _clones_and_copies(network, devices, detach)
    for j, replica in enumerate(replicas):
        for original, twin in walk_pairs(network, replica):
            for key, param in original._parameters.items():
                if param is not None:
                    # BROKEN for C++-style modules: only the registry entry changes, the member keeps the clone's leaf
                    twin._parameters[key] = copies[j][index[param]]
    return replicas


class ReduceAddInPlace(torch.autograd.Function):
    """Option One's node, one per original parameter: its outputs are the replicas' own tensors.

    It mirrors ``ReduceAdd`` and ``replicate_grad_edges`` in
    ``torch/csrc/api/include/torch/nn/parallel/data_parallel.h``, which call
    ``autograd::set_history`` on every replica parameter. Python cannot set ``grad_fn``, but
    ``ctx.mark_dirty`` makes autograd rebase the history of each copy it is handed
    (``impl::rebase_history`` in ``torch/csrc/autograd/custom_function.cpp``) instead of wrapping it in
    a new view: the same tensor object now has this node as its ``grad_fn``. Backward sums the
    copies' gradients onto the original.
    """

    @staticmethod
    def forward(ctx, original, *copies):
        ctx.mark_dirty(*copies)  # nothing was modified: marked only to rebase their history
        ctx.destination = original.device
        return copies

    @staticmethod
    def backward(ctx, *grads):
        return (sum(g.to(ctx.destination) for g in grads),) + (None,) * len(grads)


def option_one(network: nn.Module, devices: Sequence, detach: bool = False) -> list[nn.Module]:
    """PR #20910's Option One, the fix that landed, as a ``strategy=``: clone, then rewire each tensor in place.

    1. ``cpp_clone`` the module onto every slot (fresh leaves, which member and registry share);
    2. give every original parameter one ``ReduceAddInPlace`` node whose outputs are the replicas'
       own tensors. No handle is re-pointed, so it needs to know nothing about the module's members.
    ``detach=True`` returns the plain clones, with no edges (a forward under ``torch.no_grad()``).
    """
    replicas = [cpp_clone(network, d) for d in as_devices(devices)]
    if detach:
        return replicas
    # original -> its copies, each tensor object once (a tied weight is one object in a replica)
    copies: dict[torch.Tensor, dict[int, torch.Tensor]] = {}
    for replica in replicas:
        for original, twin in walk_pairs(network, replica):
            for key, param in original._parameters.items():
                if param is not None and param.requires_grad:
                    copies.setdefault(param, {})[id(twin._parameters[key])] = twin._parameters[key]
    for original, found in copies.items():
        for copy_ in found.values():
            copy_.requires_grad_(False)  # mark_dirty refuses a leaf that requires grad
        # FIX (#20910): the copies' own history now leads to `original`; the member handles see it too
        ReduceAddInPlace.apply(original, *found.values())
    return replicas


class Replicatable:
    """PR #20910's Option Two: a module that knows how to take its replica's tensors.

    Like ``Cloneable`` knows how to clone, a ``Replicatable`` module re-points its own member
    handles at the tensors replicate hands it. The price (the PR's "Con"): every module has to
    implement it.
    """

    def load_replica_params(self, tensors: dict[str, torch.Tensor]) -> None:
        raise NotImplementedError(
            f"{type(self).__name__} must implement load_replica_params(tensors): put each tensor where forward "
            "reads it (the registry and every member handle)"
        )


class ReplicatableLinear(CppStyleLinear, Replicatable):
    """``CppStyleLinear`` that implements Option Two: loading replica tensors re-points its members."""

    def load_replica_params(self, tensors: dict[str, torch.Tensor]) -> None:
        for key, tensor in tensors.items():
            self._parameters[key] = tensor
        # FIX (Option Two): the module itself knows which members must follow
        self.members = SimpleNamespace(weight=self._parameters["weight"], bias=self._parameters["bias"])


def _owns_tensors(module: nn.Module) -> bool:
    return any(t is not None for t in module._parameters.values())


def option_two(network: nn.Module, devices: Sequence, detach: bool = False) -> list[nn.Module]:
    """Option Two as a ``strategy=``: clone, ``Broadcast``, then each module loads its own copies.

    Refuses a module that holds parameters and does not implement ``Replicatable``, because
    nothing outside a module can know where its forward reads them.
    """
    for name, module in network.named_modules():
        if _owns_tensors(module) and not isinstance(module, Replicatable):
            where = f" ({name!r})" if name else ""
            raise TypeError(
                f"Option Two needs every module with parameters to implement Replicatable.load_replica_params, "
                f"and {type(module).__name__}{where} does not. This is the cost PR #20910 named: "
                "'Require changes to every existing module'."
            )
    replicas, copies, index = _clones_and_copies(network, devices, detach)
    for j, replica in enumerate(replicas):
        for original, twin in walk_pairs(network, replica):
            if _owns_tensors(original):
                twin.load_replica_params(
                    {key: copies[j][index[p]] for key, p in original._parameters.items() if p is not None}
                )
    return replicas


class CallCounter(nn.Module):
    """A Linear that counts its forward calls three ways, to see which count survives DataParallel."""

    def __init__(self, features: int = 3) -> None:
        super().__init__()
        self.linear = nn.Linear(features, features)
        self.calls = 0  # a plain attribute
        self.register_buffer("calls_in_place", torch.zeros((), dtype=torch.long))
        self.register_buffer("calls_rebound", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1  # rebinds the name in this replica's own __dict__ copy
        self.calls_in_place.add_(1)  # writes into storage; slot 0's is the module's own
        self.calls_rebound = self.calls_rebound + 1  # a new tensor, bound in this replica's _buffers only
        return self.linear(x)


SLOT0_ROWS = "one device, slot 0's rows"  # a model fed only the rows scatter gives slot 0


def running_means(
    models: dict[str, nn.Module], batch, devices: Sequence, forwards: int = 30, feature: int = 0
) -> dict[str, list[float]]:
    """``running_mean[feature]`` of each model's first layer (a BatchNorm) after each training-mode forward.

    Each of the ``forwards`` steps draws a fresh ``x = batch()`` and feeds it to every model by its
    name: ``"one device"`` runs ``model(x)``; ``SLOT0_ROWS`` runs ``model(x.chunk(len(devices))[0])``,
    the rows ``scatter`` gives slot 0; any other name is a strategy, run as
    ``DataParallel(model, devices, strategy=name)(x)``. Forwards only: no weight changes, only the
    statistics move.
    """
    history: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(forwards):
        x = batch()
        for name, model in models.items():
            if name == "one device":
                model(x)
            elif name == SLOT0_ROWS:
                model(x.chunk(len(devices))[0])
            else:
                DataParallel(model, devices, strategy=name)(x)
            history[name].append(model[0].running_mean[feature].item())
    return history


def same_grads_as_python(
    grads: dict[str, torch.Tensor | None],
    model: nn.Module,
    x: torch.Tensor,
    devices: Sequence,
    strategy="rewire",
) -> bool:
    """True when ``grads`` (a ``dpteach.cpp`` step's, by parameter name) equal the ``.grad`` that one
    Python DataParallel step under ``strategy`` leaves on a copy of ``model``, with the C++ step's
    loss, ``mean(output ** 2)``. A gradient that is None on one side only is a mismatch."""
    python = copy.deepcopy(model)
    DataParallel(python, devices, strategy=strategy)(x).pow(2).mean().backward()
    theirs = dict(python.named_parameters())
    if set(grads) != set(theirs):
        return False
    for name, grad in grads.items():
        other = theirs[name].grad
        if (grad is None) != (other is None) or (grad is not None and not torch.allclose(grad, other)):
            return False
    return True
