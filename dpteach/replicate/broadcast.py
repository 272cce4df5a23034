"""Strategy ``"broadcast"`` (the default): Python's ``torch/nn/parallel/replicate.py``.

Parameters go through ``Broadcast`` (whose backward is ``ReduceAddCoalesced``), so every replica
tensor is a non-leaf output of one node whose edges lead to the originals; slot 0's copies share
the originals' storage. Replicas are shallow copies whose tensors are set as plain attributes in
the instance's ``__dict__``, which works because ``Linear.forward`` looks ``self.weight`` up by name
on every call (the point ezyang made on PR #20910; in C++, ``Linear::weight`` is a separate member
handle and could not be reassigned). Tied weights map to one copy per replica, frozen parameters
give non-differentiable copies, and buffers that require grad are broadcast differentiably.

The node is a parameter: ``replicate(network, devices, broadcast=MyBroadcast)`` runs this strategy
with a learner's own ``Broadcast``, called as ``broadcast.apply(devices, *tensors)`` and expected
to return the copies slot by slot (chapter 07 and exercise Task 3).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn
from torch.autograd import Function

from .. import comm
from ..functions import Broadcast
from ._modules import set_buffer, set_child, set_parameter, shallow_copy


def broadcast_per_slot(
    tensors: Sequence[torch.Tensor],
    devices: Sequence[torch.device],
    detach: bool,
    broadcast: type[Function] = Broadcast,
) -> list[list[torch.Tensor]]:
    """Broadcast ``tensors`` to every slot and regroup the flat result per slot (``_broadcast_coalesced_reshape``)."""
    if not tensors:
        return [[] for _ in devices]
    if detach:
        # as replicate.py: slot 0 gets the original Parameter and buffer objects themselves, other slots copies
        return comm.broadcast_coalesced(tensors, devices)
    # EDGE (Broadcast): one node makes every copy, its edges lead to the originals; backward is ReduceAddCoalesced
    flat = broadcast.apply(devices, *tensors)
    flat = (flat,) if isinstance(flat, torch.Tensor) else tuple(flat)
    n = len(tensors)
    if len(flat) != n * len(devices):
        name = getattr(broadcast, "__name__", "Broadcast")
        raise ValueError(
            f"{name}.apply(devices, *inputs) returned {len(flat)} tensors for {n} inputs on "
            f"{len(devices)} slots; it must return {n * len(devices)}, slot by slot"
        )
    return [list(flat[i : i + n]) for i in range(0, len(flat), n)]


def replicate(
    network: nn.Module,
    devices: Sequence[torch.device],
    detach: bool = False,
    *,
    broadcast: type[Function] = Broadcast,
) -> list[nn.Module]:
    """One replica per slot, built the way ``torch.nn.parallel.replicate`` builds them, through ``broadcast``."""
    params = list(network.parameters())  # deduplicated: a tied weight appears once
    param_indices = {p: i for i, p in enumerate(params)}
    param_copies = broadcast_per_slot(params, devices, detach, broadcast)

    buffers = list(network.buffers())
    buffers_rg = [b for b in buffers if b.requires_grad and not detach]
    buffers_not_rg = [b for b in buffers if not (b.requires_grad and not detach)]
    buffer_indices_rg = {b: i for i, b in enumerate(buffers_rg)}
    buffer_indices_not_rg = {b: i for i, b in enumerate(buffers_not_rg)}
    buffer_copies_rg = broadcast_per_slot(buffers_rg, devices, False, broadcast)
    # SLOT 0 SHARES (buffers): slot 0 gets the original buffers themselves, so BatchNorm's running stats survive
    buffer_copies_not_rg = broadcast_per_slot(buffers_not_rg, devices, True)

    modules = list(network.modules())  # deduplicated too: a shared submodule stays shared
    module_indices = {m: i for i, m in enumerate(modules)}
    module_copies = [[shallow_copy(m) for m in modules] for _ in devices]
    for copies in module_copies:
        for replica in copies:
            replica._former_parameters = {}

    for i, module in enumerate(modules):
        for j in range(len(devices)):
            replica = module_copies[j][i]
            for key, child in module._modules.items():
                set_child(replica, key, None if child is None else module_copies[j][module_indices[child]])
            for key, param in module._parameters.items():
                if param is None:
                    replica._parameters[key] = None
                else:
                    # parameters in replicas are no longer leaves, so set them as non-parameter attributes
                    set_parameter(replica, key, param_copies[j][param_indices[param]])
            for key, buf in module._buffers.items():
                if buf is None:
                    replica._buffers[key] = None
                elif buf in buffer_indices_rg:
                    set_buffer(replica, key, buffer_copies_rg[j][buffer_indices_rg[buf]])
                else:
                    set_buffer(replica, key, buffer_copies_not_rg[j][buffer_indices_not_rg[buf]])
    return [module_copies[j][0] for j in range(len(devices))]
