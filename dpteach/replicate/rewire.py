"""Strategy ``"rewire"``: PR #20910's fix, Option One. Clone, then rewire the gradient edges.

After cloning (``clone.py``), every parameter X of the original (and every buffer that requires
grad) gets one ``ReduceAdd`` node whose next edge is X's gradient accumulator; every replica's copy
of X becomes an output of that node (its ``grad_fn``). Backward then sums the replicas' gradients
onto X's device and hands the sum to X. In C++ the node got that edge from
``grad_fn->set_next_edges(autograd::collect_next_edges(X))``, and each copy became its output through
``autograd::set_history(replica->parameters_[key], grad_fn)``, which changed the autograd meta of the
shared ``TensorImpl`` so the ``Linear::weight`` member saw it too. Python could do the same with a
``Function`` that calls ``ctx.mark_dirty`` on the copies
(chapter 04's ``ReduceAddInPlace``); this strategy keeps it simpler: the replica gets a new tensor
object that shares the clone's storage and is the node's output, set by name as ``replicate.py``
does with ``setattr``: the same graph, for modules that read their tensors by name.

Kept as in C++: the node refuses an incoming gradient that requires grad. Under ``create_graph=True``
a copy's gradient requires grad when it was computed from a tensor that does: for ``(x @ W).sum()``
from ``x`` if ``x`` requires grad, for ``(x @ W).pow(2).sum()`` from ``W`` itself. So a penalty on
the parameter gradients of a squared loss, or its Hessian-vector product, fails; ``out.max()`` or
``out.amax(dim=1).sum()`` of a frozen input passes (a penalty on the input also works: its first
backward never reaches the node). Buffers stay deep-copied (no BatchNorm running stats). Both were left open in
issue #21144.

The node is a parameter: ``replicate(network, devices, node=MyReduceAdd)`` runs this strategy with
a learner's own class, called as ``node.apply(original, *copies)`` (the copies as plain tensors,
no history), as chapter 03 and exercise Task 2 write it.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable, Sequence

import torch
from torch import nn
from torch.autograd import Function

from .. import comm
from . import clone
from ._modules import set_buffer, set_parameter, walk_pairs


class ReduceAdd(Function):
    """The C++ ``ReduceAdd`` node of PR #20910, one per original parameter.

    In June 2019 it derived from ``autograd::Function``, the C++ base class of backward nodes that
    PR #23269 renamed ``autograd::Node`` in July 2019.

    Forward hands back the replicas' copies as its outputs (so they hang off this node);
    backward sums their gradients onto the original's device, for its AccumulateGrad.
    ReduceAdd can ONLY be used during the backward pass of data parallel (the C++ note).
    """

    @staticmethod
    def forward(ctx, original, *copies):
        ctx.destination = original.device
        ctx.size, ctx.dtype = original.size(), original.dtype
        # FIX (#20910): each replica's copy comes out of this node, so its gradient edge leads to `original`
        return tuple(c.detach() for c in copies)

    @staticmethod
    def backward(ctx, *grads):
        if torch.is_grad_enabled() and any(g.requires_grad for g in grads):
            raise RuntimeError(
                "ReduceAdd can only be used during the backward pass of data parallel: it got gradients "
                "that require grad (create_graph=True, double backward). The C++ node of PR #20910 refused them "
                "with this check (double backward was left to issue #21144); use strategy='broadcast' for double backward."
            )
        output = torch.zeros(ctx.size, dtype=ctx.dtype, device=ctx.destination)
        for g in grads:
            if g.size() != ctx.size:
                raise RuntimeError(
                    f"All inputs of ReduceAdd must have the same size, but got {g.size()} and {ctx.size}"
                )
            if g.dtype != ctx.dtype:
                raise RuntimeError(
                    f"All inputs of ReduceAdd must have the same dtype, but got {g.dtype} and {ctx.dtype}"
                )
            if g.device != ctx.destination:
                comm.record("reduce_add", comm.nbytes(g), g.device, ctx.destination)
            output.add_(g.to(ctx.destination))  # TODO in C++ too: use nccl reduce
        return (output,) + (None,) * len(grads)  # the sum for `original`, nothing for the copies


def rewire_grad_edges(
    network: nn.Module, replicas: Sequence[nn.Module], node: type[Function] = ReduceAdd
) -> None:
    """Give every replica copy of each original parameter an edge into that parameter's ``node`` (one each)."""
    # each original tensor -> the places holding its copies: (replica submodule, key, how to set it)
    sites: dict[torch.Tensor, list[tuple[nn.Module, str, Callable]]] = defaultdict(list)
    for replica in replicas:
        for original, copy in walk_pairs(network, replica):
            for key, param in original._parameters.items():
                if param is not None and param.requires_grad:
                    sites[param].append((copy, key, set_parameter))
            for key, buf in original._buffers.items():
                if buf is not None and buf.requires_grad:  # C++ rewired grad-requiring buffers too
                    sites[buf].append((copy, key, set_buffer))
    for original, places in sites.items():
        # detached, so no grad: the node's one real edge is `original` ((None, 0) per copy)
        copies = [getattr(m, key).detach() for m, key, _ in places]
        # FIX (#20910): one node per parameter; its outputs replace the replicas' copies
        outputs = _outputs(node, node.apply(original, *copies), len(copies))
        for (module, key, set_copy), out in zip(places, outputs):
            set_copy(module, key, out)  # set_parameter or set_buffer: where forward reads it
    for replica in replicas:
        for _, copy in walk_pairs(network, replica):
            copy._is_replica = True  # replica tensors are no longer leaves: zero_grad() on them warns


def _outputs(node: type[Function], outputs, n: int) -> tuple[torch.Tensor, ...]:
    """``node.apply``'s outputs as a tuple of ``n``, or a sentence naming the class that returned something else."""
    if isinstance(outputs, torch.Tensor):
        outputs = (outputs,)
    if not isinstance(outputs, (tuple, list)) or len(outputs) != n:
        got = len(outputs) if isinstance(outputs, (tuple, list)) else type(outputs).__name__
        name = getattr(node, "__name__", "the node")
        raise ValueError(
            f"{name}.apply(original, *copies) got {n} copies but returned {got}; return one per copy"
        )
    return tuple(outputs)


def replicate(
    network: nn.Module,
    devices: Sequence[torch.device],
    detach: bool = False,
    *,
    node: type[Function] = ReduceAdd,
) -> list[nn.Module]:
    """Clone per slot (``clone.py``), then rewire through ``node``; ``detach=True`` keeps the plain clones."""
    # BROKEN (#21144), inherited from clone.py: every buffer deep-copied, slot 0's too (BatchNorm's stats are lost)
    replicas = [clone.clone_module(network, device) for device in devices]
    if not detach:
        rewire_grad_edges(network, replicas, node)
    return replicas
