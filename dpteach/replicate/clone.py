"""Strategy ``"clone"``: the C++ frontend before PR #20910, gradients included (issue #19540).

``Cloneable::clone(device)`` made every replica a deep copy: fresh leaf parameters registered by
``reset()``, the copied values swapped in with ``set_data`` (which records nothing), buffers cloned
too, children cloned one by one. Nothing links a replica's parameter to the original's, so backward fills the replicas' ``.grad`` and the original learns
nothing. For a slot on another device each tensor is copied twice, ``clone()`` then ``.to(device)`` (PR #20995 later
dropped the clone there); on the original's own device ``.to()`` copies nothing, so it is copied once.

One difference from C++ remains: ``clone()`` ran the module's ``reset()``, which re-created the
member handles too. Python cannot re-run a module's ``__init__``, so tensors a module keeps
outside its registries (plain attributes) are shared with the original here; chapter 04's
``demos.cpp_clone`` builds such a module the C++ way.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from .. import comm
from ._modules import shallow_copy


def clone_tensor(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``Variable(t).clone()`` then ``.to(device)``, as ``Cloneable::clone`` did before #20995."""
    data = comm.copy_to(tensor.detach(), tensor.device, "clone")  # COST (#20995): a full copy first ...
    if device != data.device:
        data = comm.copy_to(data, device, "to")  # ... then a second one onto the device
    return data


def clone_module(module: nn.Module, device: torch.device) -> nn.Module:
    """A deep copy of ``module`` on ``device`` whose parameters are fresh leaves."""
    with torch.no_grad():  # as C++'s NoGradGuard: nothing is recorded
        replica = shallow_copy(module)
        replica._is_replica = False  # a clone is a module of its own, with leaves that take .grad
        for key, param in module._parameters.items():
            if param is None:
                replica._parameters[key] = None
                continue
            # BROKEN (#19540): a fresh leaf with no edge to `param`; the original's .grad never fills
            copy = nn.Parameter(clone_tensor(param, device), requires_grad=param.requires_grad)
            setattr(replica, key, copy)
        for key, buf in module._buffers.items():
            # BROKEN (#21144): a deep copy even on the original's device, so BatchNorm's running stats are lost on
            # every slot; "rewire" inherits this line
            replica._buffers[key] = (
                None if buf is None else clone_tensor(buf, device).requires_grad_(buf.requires_grad)
            )
        for key, child in module._modules.items():
            replica._modules[key] = None if child is None else clone_module(child, device)
    return replica


def replicate(network: nn.Module, devices: Sequence[torch.device], detach: bool = False) -> list[nn.Module]:
    """One deep copy per slot, slot 0 included."""
    return [clone_module(network, device) for device in devices]
