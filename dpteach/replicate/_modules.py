"""What every strategy shares: the checks on the module, and walking a module and its replica together."""

from __future__ import annotations

import sys
from itertools import chain
from typing import Iterator, Sequence

import torch
from torch import nn
from torch.nn.parameter import UninitializedBuffer, UninitializedParameter


def check_replicatable(network: nn.Module, devices: Sequence[torch.device]) -> None:
    """Refuse, with a sentence that says why, a module no strategy can replicate correctly.

    Runs before anything is copied, so a refused module is left exactly as it was.
    """
    if not isinstance(network, nn.Module):
        raise TypeError(
            f"replicate expects an nn.Module, got {type(network).__name__}; wrap the function in an nn.Module "
            "whose forward calls it"
        )
    check_not_compiled(network, "replicate")
    tensors = list(chain(network.named_parameters(), network.named_buffers()))  # one walk, two checks
    for name, t in tensors:
        if isinstance(t, (UninitializedParameter, UninitializedBuffer)):
            raise RuntimeError(
                f"Modules with uninitialized parameters can't be used with `DataParallel` ({name!r} is still lazy). "
                "Run a dummy forward pass to initialize the parameters before replicating the module."
            )
    check_on_first_slot(network, devices[0], tensors)
    try:  # torch refuses Python children under a ScriptModule; say so in its words
        from torch.nn.parallel.replicate import _replicatable_module
    except ImportError:  # pragma: no cover - older or newer torch without the helper
        return
    if not _replicatable_module(network):
        raise RuntimeError(
            "Cannot replicate network where python modules are children of ScriptModule; script the whole "
            "model (torch.jit.script(model)) so every submodule is a ScriptModule, or replicate the plain Python model"
        )


def check_on_first_slot(network: nn.Module, first: torch.device, tensors=None) -> None:
    """Refuse a module whose parameters and buffers are not all on the first slot's device, as torch does."""
    for name, t in (
        tensors if tensors is not None else chain(network.named_parameters(), network.named_buffers())
    ):
        if t.device != first:
            raise RuntimeError(
                f"module must have its parameters and buffers on device {first} (the first slot) "
                f"but found one of them on device: {t.device} ({name!r}). Move it first: module.to({str(first)!r})"
            )


def check_not_compiled(network: nn.Module, who: str) -> None:
    """Refuse a ``torch.compile`` wrapper anywhere in ``network``, before anything is touched.

    ``OptimizedModule`` forwards attribute writes to the module it wraps, so the shallow copy every
    replica starts from (``_replicate_for_data_parallel``, torch's recipe) would write into the
    learner's own model: it would lose its parameters. torch.nn.parallel.replicate has no guard.
    """
    for name, module in network.named_modules(remove_duplicate=False):
        if not _is_compiled(module):
            continue
        if not name:
            raise TypeError(
                f"{who} got a torch.compile'd module (an OptimizedModule), which cannot be replicated: copying it "
                "would write into the model it wraps. Compile the wrapper instead, "
                "torch.compile(DataParallel(model, ...)), or pass the uncompiled module, model._orig_mod."
            )
        raise TypeError(
            f"{who} got a module whose submodule {name!r} is torch.compile'd (an OptimizedModule), which cannot be "
            f"replicated: copying it would write into the module it wraps. Put the uncompiled submodule back "
            f"(model.{name} = model.{name}._orig_mod) and compile the DataParallel wrapper instead."
        )


def _is_compiled(module: nn.Module) -> bool:
    dynamo = sys.modules.get("torch._dynamo.eval_frame")  # not imported: nothing can be compiled yet
    return dynamo is not None and isinstance(module, dynamo.OptimizedModule)


def is_script_module(module: nn.Module) -> bool:
    return isinstance(module, torch.jit.ScriptModule)


def set_child(replica: nn.Module, key: str, child: nn.Module | None) -> None:
    """Make ``child`` the replica's submodule ``key``.

    A ScriptModule's ``_modules`` item assignment sets the C++ slot the compiled forward reads and
    keeps the Python wrapper findable (``replica[0]``, ``named_modules``); on a plain module it is
    the same as ``setattr``.
    """
    if child is None or is_script_module(replica):
        replica._modules[key] = child
    else:
        setattr(replica, key, child)


def shallow_copy(module: nn.Module) -> nn.Module:
    """A new module object of the same class whose registries can be refilled (torch's own recipe)."""
    return module._replicate_for_data_parallel()


def walk_pairs(original: nn.Module, replica: nn.Module) -> Iterator[tuple[nn.Module, nn.Module]]:
    """Each original submodule with its counterpart, recursing by key as replicate_grad_edges does in C++."""
    yield original, replica
    for key, child in original._modules.items():
        if child is not None:
            yield from walk_pairs(child, replica._modules[key])


def set_parameter(module: nn.Module, key: str, value: torch.Tensor) -> None:
    """Put a replica's copy of a parameter where forward will read it.

    Replica parameters are no longer leaves, so like replicate.py they become plain attributes in the
    instance's ``__dict__``, where ordinary attribute lookup finds them (``nn.Module.__getattr__`` is
    never asked), and ``_former_parameters`` still lists them (DDP).
    """
    if not is_script_module(module):  # a ScriptModule's registries cannot pop (as replicate.py)
        module._parameters.pop(key, None)
    setattr(module, key, value)  # a ScriptModule's forward reads C++ slots, which setattr sets
    if getattr(module, "_former_parameters", None) is None:
        module._former_parameters = {}
    module._former_parameters[key] = value


def set_buffer(module: nn.Module, key: str, value: torch.Tensor) -> None:
    """Put a replica's copy of a buffer where forward will read it: in ``_buffers`` (a ScriptModule: setattr)."""
    if is_script_module(module):
        setattr(module, key, value)
    else:
        module._buffers[key] = value
