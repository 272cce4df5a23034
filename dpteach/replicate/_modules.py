"""What every strategy shares: the checks on the module, and walking a module and its replica together."""

from __future__ import annotations

from itertools import chain
from typing import Iterator, Sequence

import torch
from torch import nn
from torch.nn.parameter import UninitializedBuffer, UninitializedParameter


def check_replicatable(network: nn.Module, devices: Sequence[torch.device]) -> None:
    """Refuse, with a sentence that says why, a module no strategy can replicate correctly."""
    if not isinstance(network, nn.Module):
        raise TypeError(f"replicate expects an nn.Module, got {type(network).__name__}")
    for name, t in chain(network.named_parameters(), network.named_buffers()):
        if isinstance(t, (UninitializedParameter, UninitializedBuffer)):
            raise RuntimeError(
                f"Modules with uninitialized parameters can't be used with `DataParallel` ({name!r} is still lazy). "
                "Run a dummy forward pass to initialize the parameters before replicating the module."
            )
    for name, t in chain(network.named_parameters(), network.named_buffers()):
        if t.device != devices[0]:
            raise RuntimeError(
                f"module must have its parameters and buffers on device {devices[0]} (the first slot) "
                f"but found {name!r} on device: {t.device}. Move it first: module.to({str(devices[0])!r})"
            )
    try:  # torch refuses Python children under a ScriptModule; say so in its words
        from torch.nn.parallel.replicate import _replicatable_module
    except ImportError:  # pragma: no cover - older or newer torch without the helper
        return
    if not _replicatable_module(network):
        raise RuntimeError("Cannot replicate network where python modules are children of ScriptModule")


def shallow_copy(module: nn.Module) -> nn.Module:
    """A new module object of the same class whose registries can be refilled (torch's own recipe)."""
    return module._replicate_for_data_parallel()


def walk_pairs(original: nn.Module, replica: nn.Module) -> Iterator[tuple[nn.Module, nn.Module]]:
    """Each original submodule with its counterpart, recursing by key as replicate_grad_edges does in C++."""
    yield original, replica
    for key, child in original._modules.items():
        if child is not None:
            yield from walk_pairs(child, replica._modules[key])


def set_tensor(module: nn.Module, key: str, value: torch.Tensor, kind: str) -> None:
    """Put a replica tensor where forward will read it.

    Replica parameters are no longer leaves, so like replicate.py they become plain attributes;
    ``nn.Module.__getattr__`` finds them there, and ``_former_parameters`` still lists them (DDP).
    """
    if kind == "buffer":
        module._buffers[key] = value
        return
    module._parameters.pop(key, None)
    setattr(module, key, value)
    if not hasattr(module, "_former_parameters") or module._former_parameters is None:
        module._former_parameters = {}
    module._former_parameters[key] = value
