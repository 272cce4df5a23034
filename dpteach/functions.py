"""The autograd functions of ``torch/nn/parallel/_functions.py``, on any device list.

They come in adjoint pairs, and each one's backward is written with its partner's ``apply``,
not with raw ``comm`` calls (PR #2508, after issue #2467 "Double backward functionality within
dataParallel is incomplete", whose error was "Scatter is not differentiable twice"):

    Broadcast.backward          = ReduceAddCoalesced.apply(...)
    ReduceAddCoalesced.backward = Broadcast.apply(...)
    Scatter.backward            = Gather.apply(...)
    Gather.backward             = Scatter.apply(...)

dpteach's ``comm`` functions move data without autograd history (their copies are detached, their
sums run under ``no_grad``). PyTorch's ``comm.reduce_add_coalesced`` records nothing either: it
returns ``t.data`` of every dense result, on the NCCL path and the other alike (only its inner
``reduce_add``, without NCCL, adds with ordinary ``+`` and ``.to``). Calling the partner's ``apply``
makes the backward one node whose own backward is defined, so double backward (a gradient penalty,
a Hessian-vector product) works through replication. A node does not need a
partner to be differentiable: the engine runs every backward with grad mode set to ``create_graph``,
so one made of ordinary recorded operations is differentiable too. The C++ ``ReduceAdd`` of PR
#20910 was such a body (``zeros_like``, ``.to``, ``add_``); what stopped double backward was its
explicit ``TORCH_CHECK(!compute_requires_grad(inputs))`` (see ``dpteach.replicate.rewire``).
"""

from __future__ import annotations

import warnings
from itertools import chain

import torch
from torch.autograd import Function

from . import comm
from ._devices import as_devices, as_output_device

__all__ = ["Broadcast", "ReduceAddCoalesced", "Scatter", "Gather"]


class Broadcast(Function):
    """Copy tensors from one device to every slot; slot 0's outputs share the inputs' storage."""

    @staticmethod
    def forward(ctx, target_gpus, *inputs):
        ctx.target_gpus = as_devices(target_gpus, "target_gpus")
        if len(inputs) == 0:
            return ()
        ctx.num_inputs = len(inputs)
        ctx.input_device = inputs[0].device
        outputs = comm.broadcast_coalesced(inputs, ctx.target_gpus)
        # a frozen input gives copies that never ask for a gradient (PR #5061, issue #5041)
        non_differentiables = []
        for idx, needs_grad in enumerate(ctx.needs_input_grad[1:]):
            if not needs_grad:
                non_differentiables.extend(slot[idx] for slot in outputs)
        ctx.mark_non_differentiable(*non_differentiables)
        return tuple(chain.from_iterable(outputs))  # device-major: [slot0: in0..ink, slot1: ...]

    @staticmethod
    def backward(ctx, *grad_outputs):
        return (None,) + ReduceAddCoalesced.apply(ctx.input_device, ctx.num_inputs, *grad_outputs)


class ReduceAddCoalesced(Function):
    """Sum per-slot gradients onto one device: ``num_inputs`` tensors from each slot, device-major."""

    @staticmethod
    def forward(ctx, destination, num_inputs, *grads):
        ctx.target_gpus = [grads[i].device for i in range(0, len(grads), num_inputs)]
        groups = [grads[i : i + num_inputs] for i in range(0, len(grads), num_inputs)]
        return comm.reduce_add_coalesced(groups, destination)

    @staticmethod
    def backward(ctx, *grad_outputs):
        return (None, None) + Broadcast.apply(ctx.target_gpus, *grad_outputs)


class Gather(Function):
    """Concatenate per-slot outputs on ``target_device``; 0-d outputs become a vector, with a warning."""

    @staticmethod
    def forward(ctx, target_device, dim, *inputs):
        ctx.target_device = as_output_device(target_device)  # -1 is the CPU, with torch's FutureWarning
        ctx.dim = dim
        ctx.input_gpus = tuple(i.device for i in inputs)
        if all(t.dim() == 0 for t in inputs) and dim == 0:
            inputs = tuple(t.view(1) for t in inputs)
            warnings.warn(
                "Was asked to gather along dimension 0, but all input tensors were scalars; "
                "will instead unsqueeze and return a vector.",
                stacklevel=2,
            )
            ctx.unsqueezed_scalar = True
        else:
            ctx.unsqueezed_scalar = False
        ctx.input_sizes = tuple(i.size(ctx.dim) for i in inputs)
        return comm.gather(inputs, ctx.dim, ctx.target_device)

    @staticmethod
    def backward(ctx, grad_output):
        scattered = Scatter.apply(ctx.input_gpus, ctx.input_sizes, ctx.dim, grad_output)
        if ctx.unsqueezed_scalar:
            scattered = tuple(g[0] for g in scattered)
        return (None, None) + tuple(scattered)


class Scatter(Function):
    """Split one tensor along ``dim`` over the slots; its backward gathers the pieces' gradients."""

    @staticmethod
    def forward(ctx, target_gpus, chunk_sizes, dim, input):
        slots = as_devices(target_gpus, "target_gpus")
        ctx.dim = dim
        ctx.input_device = input.device
        streams = None
        if input.device.type == "cpu" and any(d.type == "cuda" for d in slots):
            # copy host -> GPU on a side stream per device, as torch does, then make the main stream wait
            streams = [_copy_stream(d) for d in slots]
        outputs = comm.scatter(input, slots, chunk_sizes, dim, streams)
        if streams is not None:
            for out, device, stream in zip(outputs, slots, streams):
                if stream is not None:
                    main = torch.cuda.current_stream(device)
                    main.wait_stream(stream)
                    out.record_stream(main)
        return outputs

    @staticmethod
    def backward(ctx, *grad_output):
        return None, None, None, Gather.apply(ctx.input_device, ctx.dim, *grad_output)


_streams: dict[int, "torch.cuda.Stream"] = {}


def _copy_stream(device: torch.device):
    """A background CUDA stream for host-to-device copies (None for a CPU slot)."""
    if device.type != "cuda":
        return None
    if device.index not in _streams:
        _streams[device.index] = torch.cuda.Stream(device)
    return _streams[device.index]
