"""Task 3 (chapter 07): a Broadcast / ReduceAddCoalesced pair, each the other's backward (PR #2508).

The check tries the pair alone, then runs the library's ``"broadcast"`` strategy with it
(:func:`broadcast_with`) and compares first and second-order gradients with one device's.
"""

from __future__ import annotations

import functools

import torch
from torch.autograd import Function

from ..replicate import broadcast as broadcast_strategy
from ._feedback import Findings, Result, Task
from ._harness import NotYet, require_function, run_cases, run_check, try_step
from ._paths import nodes_behind

TASK = Task(  # the registry finds this record by the file's name
    3,
    "broadcast_pair",
    "Broadcast / ReduceAddCoalesced for double backward",
    "07",
    names=("MyBroadcast", "MyReduceAddCoalesced"),
    check="check_broadcast_pair",
    helpers=("broadcast_with",),
    imports="import torch\nfrom torch.autograd import Function\n\nfrom dpteach import comm, exercises",
)

PARTNER_STEPS = (  # where three kinds of mistake end: each backward calls its partner's apply
    "each backward can call the partner Function, whose node autograd records: `MyReduceAddCoalesced` in "
    "Broadcast.backward, `MyBroadcast` in ReduceAddCoalesced.backward, not under `torch.no_grad()`.",
    "`return (None,) + MyReduceAddCoalesced.apply(ctx.input_device, ctx.num_inputs, *grads)` in Broadcast.backward "
    "and `return (None, None) + MyBroadcast.apply(ctx.devices, *grads)` in ReduceAddCoalesced.backward.",
)
HINTS = {  # a tuple is a hint in steps: the idea on the first failure, closer on the next, the code last
    "layout": (
        "Broadcast's outputs go slot by slot: every input's copy on slot 0, in order, then slot 1's, ...",
        "`comm.broadcast_coalesced(inputs, devices)` gives one list per slot (slot 0's are the inputs "
        "themselves): flatten it in slot order.",
        "`return tuple(t for slot in per_slot for t in slot)`.",
    ),
    "sum": (
        "`ReduceAddCoalesced.forward` gets the tensors slot by slot, `num_inputs` per slot, and returns "
        "`num_inputs` sums.",
        "`comm.reduce_add_coalesced` wants one list per slot: cut the flat `grads` into groups of `num_inputs`.",
        "`comm.reduce_add_coalesced([grads[i:i + num_inputs] for i in range(0, len(grads), num_inputs)], "
        "destination)`.",
    ),
    "sum_backward": (
        "a sum's gradient with respect to each of its terms is the sum's gradient itself: ReduceAddCoalesced's "
        "backward hands every slot one copy of each gradient it gets, unscaled.",
        PARTNER_STEPS[1],
    ),
    "broadcast_sum": "Broadcast.backward hands each input the sum of its copies' gradients, which your "
    "ReduceAddCoalesced computes once Broadcast.backward calls its `apply`: if ReduceAddCoalesced's sums are "
    "found wrong too, fix those first.",
    "not_differentiable": (
        "a backward is differentiable when autograd records what it computes: a `comm` call, or anything under "
        "`torch.no_grad()`, is not recorded.",
        *PARTNER_STEPS,
    ),
    "partner": (
        "this task asks each backward to call its partner's `apply`, so the second backward runs your other class.",
        "keep on `ctx`, in forward, what the partner's `apply` needs: the input device and count, the slots' devices.",
        PARTNER_STEPS[1],
    ),
    "second_none": (
        "a gradient penalty differentiates the gradient your backward returned: autograd must have recorded "
        "how that gradient was made.",
        *PARTNER_STEPS,
    ),
}


def broadcast_with(broadcast: type[Function]):
    """The library's ``"broadcast"`` strategy (``dpteach.replicate.broadcast``) running a learner's ``Broadcast``."""
    replicate = functools.partial(broadcast_strategy.replicate, broadcast=broadcast)
    replicate.__name__ = f"broadcast_with({getattr(broadcast, '__name__', 'Broadcast')})"
    return replicate


def _from_partner(t: torch.Tensor, partner: type[Function]) -> bool:
    return any(name.startswith(partner.__name__) for name in nodes_behind(t, depth=3))


def _broadcast_two(broadcast):
    """Broadcast.apply of two inputs on three CPU slots: ``(a, b, outputs, what is wrong with their order)``."""
    slots = [torch.device("cpu")] * 3
    a = torch.arange(6.0).view(2, 3).requires_grad_()
    b = torch.tensor([1.0, -1.0, 2.0, 0.5], requires_grad=True)
    out = broadcast.apply(slots, a, b)
    out = (out,) if isinstance(out, torch.Tensor) else tuple(out)
    if len(out) != 6:
        said = f"Broadcast.apply(devices, a, b) on 3 slots returned {len(out)} tensors; it must return 6"
        return a, b, out, said + ": slot 0's a and b, then slot 1's, then slot 2's"
    for j in range(3):
        for k, (t, want) in enumerate(((out[2 * j], a), (out[2 * j + 1], b))):
            if not (isinstance(t, torch.Tensor) and torch.equal(t.detach(), want.detach())):
                said = f"output {2 * j + k} of Broadcast.apply(devices, a, b) should be slot {j}'s copy"
                return a, b, out, said + f" of {'ab'[k]}, but it is not (outputs go slot by slot)"
    return a, b, out, None


def _reduce_six(reduce_add):
    """ReduceAddCoalesced.apply of 2 tensors from each of 3 CPU slots: the six, its outputs as a tuple, and what is
    wrong with their number (said first: Broadcast.backward, returning 1 + that many values, would be blamed)."""
    grads = [torch.full((2, 2), float(10 * j + k), requires_grad=True) for j in range(3) for k in range(2)]
    sums = reduce_add.apply(torch.device("cpu"), 2, *grads)
    sums = (sums,) if isinstance(sums, torch.Tensor) else tuple(sums)
    said = f"{reduce_add.__name__}.forward returned {len(sums)} tensor(s) for num_inputs=2 (2 from each of 3 slots)"
    said += ": return 2 sums, input 0's over the slots, then input 1's"
    return grads, sums, None if len(sums) == 2 else said


def _probe_broadcast(findings: Findings, broadcast, reduce_add) -> None:
    """Broadcast alone: two inputs on three slots, then a backward with create_graph=True."""
    findings.context = "Trying Broadcast on two inputs and three slots (its backward runs ReduceAddCoalesced)"
    a, b, out, wrong = _broadcast_two(broadcast)
    if wrong:
        findings.stop("layout", wrong)
    if said := _reduce_six(reduce_add)[2]:  # its forward first, before the backward runs it
        findings.stop("sum", said)
    weights = [torch.full_like(t, float(i + 1), requires_grad=True) for i, t in enumerate(out)]
    ga, gb = torch.autograd.grad([(t * w).sum() for t, w in zip(out, weights)], [a, b], create_graph=True)
    summed = torch.allclose(ga.detach(), torch.full_like(a, 1 + 3 + 5))  # a's copies got gradients 1, 3 and 5
    if not summed or not torch.allclose(gb.detach(), torch.full_like(b, 2 + 4 + 6)):
        got = ga.detach().flatten()[0].item()
        findings.problem(
            "broadcast_sum",
            "Broadcast's backward does not hand each input the sum of its copies' "
            f"gradients: with gradients 1, 3 and 5 on a's three copies, a got {got:g}, not 9",
        )
        return  # ReduceAddCoalesced's own probe says more
    if not ga.requires_grad:
        findings.problem(
            "not_differentiable",
            "Broadcast.backward is not differentiable: even with "
            "`create_graph=True` the gradient it returns has no history, so a second backward (a "
            "gradient penalty, a Hessian-vector product) has nothing to go through (see chapter 07)",
        )
    elif not _from_partner(ga, reduce_add):
        _not_from_partner(findings, "Broadcast", ga, reduce_add, broadcast)


def _not_from_partner(findings: Findings, side: str, result: torch.Tensor, partner, other) -> None:
    findings.problem(
        "partner",
        f"{side}.backward's result has a history, but it comes out of {type(result.grad_fn).__name__ if result.grad_fn else 'no node'}, not out "
        f"of your {partner.__name__}: call `{partner.__name__}.apply` in {side}.backward (as PyTorch's "
        f"`_functions.py` does since PR #2508), so that the second backward runs your {other.__name__}",
    )


def _probe_reduce(findings: Findings, broadcast, reduce_add) -> None:
    """ReduceAddCoalesced alone: two tensors from each of three slots, then a backward with create_graph=True."""
    findings.context = "Trying ReduceAddCoalesced on 2 tensors from each of 3 slots (backward runs Broadcast)"
    grads, sums, _ = _reduce_six(reduce_add)
    want = [torch.full((2, 2), 0.0 + 10 + 20), torch.full((2, 2), 3.0 + 10 + 20)]
    right = all(isinstance(s, torch.Tensor) and torch.allclose(s.detach(), w) for s, w in zip(sums, want))
    if len(sums) != 2 or not right:
        findings.stop(
            "sum",
            "ReduceAddCoalesced.apply(destination, 2, *six_tensors) must return 2 tensors: the sum "
            "of input 0 over the three slots, and the sum of input 1",
        )
    u = torch.ones(2, 2, requires_grad=True)
    back = torch.autograd.grad([(sums[0] * u).sum(), (sums[1] * 2 * u).sum()], grads, create_graph=True)
    if not all(torch.allclose(g.detach(), torch.full((2, 2), 1.0 + i % 2)) for i, g in enumerate(back)):
        findings.stop("sum_backward", "ReduceAddCoalesced.backward must hand each slot the sum's gradient")
    if not all(g.requires_grad for g in back):
        slot = next(i for i, g in enumerate(back) if not g.requires_grad) // 2
        findings.problem(
            "not_differentiable",
            f"ReduceAddCoalesced.backward is not differentiable: slot {slot}'s gradient has no history. A penalty's "
            "gradient needs none, but differentiating that again silently misses this path: record it as torch does",
        )
    elif stray := [g for g in back[2:] if not _from_partner(g, broadcast)]:  # slots 1, 2: a raw comm call's
        _not_from_partner(findings, "ReduceAddCoalesced", stray[0], broadcast, reduce_add)


def check_broadcast_pair(broadcast=None, reduce_add_coalesced=None, *, devices=None) -> Result:
    """Check a learner's ``Broadcast`` and ``ReduceAddCoalesced``: alone, then replicating models, double backward."""

    def body(findings: Findings) -> None:
        for cls, name in ((broadcast, "Broadcast"), (reduce_add_coalesced, "ReduceAddCoalesced")):
            example = "MyBroadcast, MyReduceAddCoalesced"
            require_function(findings, cls, "check_broadcast_pair", example, f"{name} class")
        _probe_broadcast(findings, broadcast, reduce_add_coalesced)
        _probe_reduce(findings, broadcast, reduce_add_coalesced)
        if not findings.ok:
            return
        run_cases(findings, broadcast_with(broadcast), devices, double=True)
        findings.held += [
            "Broadcast copies every input to every slot, slot by slot; ReduceAddCoalesced sums them back",
            "each backward comes out of the partner's node, so it is differentiable itself (PR #2508)",
            "gradients and the gradients of a gradient penalty equal one device's on all three models and 1-4 slots",
        ]

    return run_check(TASK, HINTS, body)


def try_answer(broadcast, reduce_add_coalesced=None) -> str:
    """One DataParallel step of ``"broadcast"`` with the learner's pair (``try_it("broadcast_pair", B, R)``), after the
    check's first probes: outputs out of order, or too few sums, said as :class:`NotYet` before a replica fails."""
    try:
        wrong = _broadcast_two(broadcast)[3]
        wrong = f"{wrong}. {HINTS['layout'][0]}" if wrong else _reduce_six(reduce_add_coalesced)[2]
    except NotImplementedError:
        raise  # an untouched stub: try_it says which task
    except Exception:  # the step below raises it again, from the learner's own code
        wrong = None
    if wrong:
        raise NotYet(wrong)
    return try_step(broadcast_with(broadcast))
