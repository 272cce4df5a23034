"""Worked answers to the exercises, with the names and signatures of ``stubs.py``; the tests check each,
and the solutions notebook shows each as a cell (``dpteach.exercises.solution_source(key)``).
"""

from __future__ import annotations

import dataclasses
from copy import deepcopy

import torch
from torch.autograd import Function

import dpteach
from dpteach import comm
from dpteach.functions import Gather, Scatter


def replicate_by_clone(network, devices, detach=False):
    """Clone-based replicate with its bug fixed: each replica's parameters are differentiable copies."""
    replicas = []
    for device in devices:
        replica = deepcopy(network).to(device)
        for original, twin in zip(network.modules(), replica.modules()):
            for key, param in original._parameters.items():
                if param is None:
                    continue
                # FIX (Task 1): the broken line without detach() and nn.Parameter. Autograd records clone() and .to,
                # so the grad_fn leads back to `param`; clone() gives every slot memory of its own (Task 6: one copy)
                copy = param.clone().to(device)
                twin._parameters.pop(key)  # a copy with history is no leaf, so no Parameter:
                setattr(twin, key, copy)  # set it as a plain attribute, as replicate.py does
        replicas.append(replica)
    return replicas


class MyReduceAdd(Function):
    """PR #20910's ReduceAdd node: one per original parameter, every replica's copy is one of its outputs."""

    @staticmethod
    def forward(ctx, original, *copies):
        ctx.destination = original.device  # where backward must deliver the sum
        # FIX (#20910): each copy comes out of this node, so its gradient edge leads to `original`
        return tuple(c.detach() for c in copies)

    @staticmethod
    def backward(ctx, *grads):
        # every replica's gradient, on the original's device
        total = sum(g.to(ctx.destination) for g in grads)
        return (total,) + (None,) * len(grads)  # one value per forward input: the sum for `original`


class MyBroadcast(Function):
    """Copy tensors from one device to every slot; its backward is ReduceAddCoalesced."""

    @staticmethod
    def forward(ctx, devices, *inputs):
        ctx.input_device = inputs[0].device
        ctx.num_inputs = len(inputs)
        per_slot = comm.broadcast_coalesced(inputs, devices)  # slot 0's copies are the inputs themselves
        return tuple(t for slot in per_slot for t in slot)  # device-major: slot 0's, then slot 1's, ...

    @staticmethod
    def backward(ctx, *grads):
        # the partner's apply, not a raw comm call: the sum is a node too, so double backward can go through it
        return (None,) + MyReduceAddCoalesced.apply(ctx.input_device, ctx.num_inputs, *grads)


class MyReduceAddCoalesced(Function):
    """Sum ``num_inputs`` tensors from each slot onto ``destination``; its backward is Broadcast."""

    @staticmethod
    def forward(ctx, destination, num_inputs, *grads):
        groups = [grads[i : i + num_inputs] for i in range(0, len(grads), num_inputs)]
        ctx.devices = [group[0].device for group in groups]  # where each group came from
        return tuple(comm.reduce_add_coalesced(groups, destination))

    @staticmethod
    def backward(ctx, *grads):
        return (None, None) + MyBroadcast.apply(ctx.devices, *grads)  # the partner's apply, again


def scatter(inputs, devices, dim=0):
    """Split nested ``inputs`` over the slots: a list with one structure per piece."""

    def scatter_map(obj):
        if isinstance(obj, torch.Tensor):
            return list(Scatter.apply(devices, None, dim, obj))
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple takes its fields as arguments
            return [type(obj)(*fields) for fields in zip(*map(scatter_map, obj))]
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            names = [f.name for f in dataclasses.fields(obj)]
            per_slot = zip(*(scatter_map(getattr(obj, name)) for name in names))
            return [dataclasses.replace(obj, **dict(zip(names, values))) for values in per_slot]
        if isinstance(obj, tuple) and obj:
            return list(zip(*map(scatter_map, obj)))
        if isinstance(obj, list) and obj:
            return [list(values) for values in zip(*map(scatter_map, obj))]
        if isinstance(obj, dict) and obj:
            return [type(obj)(zip(obj, values)) for values in zip(*map(scatter_map, obj.values()))]
        return [obj for _ in devices]  # anything else is shared: the same object on every slot

    return scatter_map(inputs)  # zip stops at the shortest: as many pieces as the tensors give


def gather(outputs, target_device, dim=0):
    """Join a list of per-slot outputs into one on ``target_device``, keeping their nested type."""

    def gather_map(outs):
        out = outs[0]
        if isinstance(out, torch.Tensor):
            return Gather.apply(target_device, dim, *outs)
        if out is None:
            return None
        if isinstance(out, dict):
            return type(out)((key, gather_map([o[key] for o in outs])) for key in out)
        if isinstance(out, tuple) and hasattr(out, "_fields"):
            return type(out)(*map(gather_map, zip(*outs)))
        if dataclasses.is_dataclass(out) and not isinstance(out, type):
            fields = [f.name for f in dataclasses.fields(out)]
            return dataclasses.replace(out, **{k: gather_map([getattr(o, k) for o in outs]) for k in fields})
        if isinstance(out, (list, tuple)):
            return type(out)(map(gather_map, zip(*outs)))
        return list(outs)  # strings, numbers, other objects: one per slot

    return gather_map(list(outputs))


def keep_bn_statistics(network, devices, detach=False):
    """Replicas like PR #20910's, except that slot 0's buffers are the original's own."""
    replicas = dpteach.replicate(network, devices, detach, strategy="rewire")
    for name, buffer in network.named_buffers():
        owner, _, key = name.rpartition(".")
        # FIX (#21144): slot 0's BatchNorm now updates the original's running statistics in place
        setattr(replicas[0].get_submodule(owner), key, buffer)  # a buffer's name: re-registered as a buffer
    return replicas


def copy_once(tensor, device):
    """A replica's copy of `tensor` on `device` with one copy, as PR #20995 made Cloneable::clone do."""
    device = torch.device(device)  # a string never equals a torch.device: torch.device("cpu") != "cpu"
    if device.type == "cuda" and device.index is None:  # "cuda" is the current GPU: .to fills its index in
        device = torch.device("cuda", torch.cuda.current_device())
    # FIX (#20995), as torch/nn/cloneable.h does it: .to alone onto another device, clone() alone on its own
    return tensor.detach().to(device) if tensor.device != device else tensor.detach().clone()
