"""The exercises as a learner first sees them: each raises NotImplementedError naming its task.

``stub_source(key)`` gives each as a cell, with its imports and a line that tries it; answers: ``solutions.py``.
"""

from __future__ import annotations

from copy import deepcopy

from torch.autograd import Function

import dpteach


def replicate_by_clone(network, devices, detach=False):
    """Chapter 01's "clone" strategy, before PR #20910: write the `copy` line (the task above says how)."""
    replicas = []
    for device in devices:
        replica = deepcopy(network).to(device)
        for original, twin in zip(network.modules(), replica.modules()):
            for key, param in original._parameters.items():
                if param is None:
                    continue
                # BROKEN (#19540), as clone.py runs it (clone_tensor: a detached clone, moved):
                # copy = nn.Parameter(clone_tensor(param, device), requires_grad=param.requires_grad)
                raise NotImplementedError(
                    "Task 1 (find the bug in clone-based replicate): write a `copy` of `param` that keeps its edge"
                )
                # you write `copy = ...` in place of the raise above; these two lines then use it
                twin._parameters.pop(key)  # a copy with history is no leaf, so no Parameter:
                setattr(twin, key, copy)  # a plain attribute, as torch/nn/parallel/replicate.py does
        replicas.append(replica)
    return replicas


class MyReduceAdd(Function):
    """PR #20910's ReduceAdd node: one per original parameter, every replica's copy is one of its outputs.

    The rewire strategy calls ``MyReduceAdd.apply(original, *copies)`` with the parameter and its
    copy on every slot (plain tensors, no history). Forward hands the copies back as this node's
    outputs, so each replica's parameter gets the node as its ``grad_fn``, and the node has one
    edge: to ``original``. Backward gets one gradient per copy (one per output of forward) and must
    return one value per input of forward, in order: one for ``original``, then one for each copy.
    What should it return for ``original``, and for each copy?
    """

    @staticmethod
    def forward(ctx, original, *copies):
        raise NotImplementedError("Task 2 (rewire gradient edges): write ReduceAdd.forward")

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError("Task 2 (rewire gradient edges): write ReduceAdd.backward")


class MyBroadcast(Function):
    """Copy tensors from one device to every slot; its backward is ReduceAddCoalesced.

    ``MyBroadcast.apply(devices, *inputs)`` returns ``len(devices) * len(inputs)`` tensors: a copy
    of every input on every slot, slot by slot (device-major): slot 0's copies of all the inputs,
    in their order, then slot 1's, and so on; output ``j * len(inputs) + k`` is slot ``j``'s input ``k``.
    ``comm.broadcast_coalesced(tensors, devices)`` makes the copies: it returns one list per slot.
    Forward saves on ``ctx`` what backward passes to the partner: the inputs' device and their number.
    """

    @staticmethod
    def forward(ctx, devices, *inputs):
        raise NotImplementedError(
            "Task 3 (Broadcast / ReduceAddCoalesced for double backward): write Broadcast.forward"
        )

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError(
            "Task 3 (Broadcast / ReduceAddCoalesced for double backward): write Broadcast.backward"
        )


class MyReduceAddCoalesced(Function):
    """Sum ``num_inputs`` tensors from each slot onto ``destination``; its backward is Broadcast.

    ``MyReduceAddCoalesced.apply(destination, num_inputs, *grads)`` gets ``num_inputs`` tensors from
    each slot, in the order ``MyBroadcast`` returns its copies (``grads[j * num_inputs + k]`` is slot
    ``j``'s tensor ``k``), and returns the ``num_inputs`` sums over the slots, on ``destination``.
    ``comm.reduce_add_coalesced(per_slot_lists, destination)`` sums them: it takes the flat ``grads``
    regrouped into one list per slot. Forward saves on ``ctx`` the slots' devices, for backward.
    """

    @staticmethod
    def forward(ctx, destination, num_inputs, *grads):
        raise NotImplementedError(
            "Task 3 (Broadcast / ReduceAddCoalesced for double backward): write ReduceAddCoalesced.forward"
        )

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError(
            "Task 3 (Broadcast / ReduceAddCoalesced for double backward): write ReduceAddCoalesced.backward"
        )


def scatter(inputs, devices, dim=0):
    """Split nested ``inputs`` over the slots: a list with one structure per piece.

    A tensor: ``Scatter.apply(devices, None, dim, tensor)`` (None: equal chunks, as ``tensor.chunk`` cuts
    them, so maybe fewer pieces than slots). A container keeps its type and every field; anything else,
    an empty container too, is the same object on every slot.
    """
    raise NotImplementedError("Task 4 (scatter and gather nested inputs): write scatter")


def gather(outputs, target_device, dim=0):
    """Join a list of per-slot outputs into one on ``target_device``, keeping their nested type.

    A tensor: ``Gather.apply(target_device, dim, *tensors)``; None stays None; anything else, one per slot.
    """
    raise NotImplementedError("Task 4 (scatter and gather nested inputs): write gather")


def keep_bn_statistics(network, devices, detach=False):
    """Replicas like PR #20910's, except that slot 0's buffers are the original's own.

    The rewire strategy deep-copies every buffer, so BatchNorm's running statistics, updated in
    place on each replica, are lost with the replicas (the item left open in issue #21144). Make
    every buffer of slot 0's replica *be* the original's buffer; later slots keep their copies.
    """
    replicas = dpteach.replicate(network, devices, detach, strategy="rewire")
    raise NotImplementedError(
        "Task 5 (keep BatchNorm statistics from slot 0): make slot 0's buffers the original's"
    )
    return replicas


def copy_once(tensor, device):
    """A replica's copy of `tensor` on `device` (a `torch.device` or a string), made with ONE copy (PR #20995)."""
    # BEFORE (#20995), the line dpteach/replicate/clone.py runs (clone_tensor): a clone, then a second copy
    # return tensor.detach().clone().to(device)
    raise NotImplementedError("Task 6 (one copy, not two): return `tensor` copied onto `device` once")
