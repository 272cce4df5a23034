"""Task 2 (chapter 03): rewire gradient edges, PR #20910's way.

The learner writes ``ReduceAdd``'s forward and backward. :func:`rewire_with` runs the library's
``"rewire"`` strategy with it (``node=``): clone every slot, then one ``MyReduceAdd.apply(original,
*copies)`` per original parameter, whose outputs replace the copies. The check first tries the node alone
(its outputs, its one edge, its sum, where the sum lands), then runs the strategy through
DataParallel on every model and 1-4 slots against one device.
"""

from __future__ import annotations

import inspect

import torch
from torch.autograd import Function

from ..course import story
from ..replicate import rewire
from ._feedback import Findings, Result, Stop, Task
from ._harness import check_replicas, run_cases, run_check, try_step
from ._paths import leaves_behind

TASK = Task(  # this exercise's one record; the registry finds it by the file's name
    2,
    "rewire",
    "rewire gradient edges",
    "03",
    names=("MyReduceAdd",),
    check="check_rewire",
    helpers=("rewire_with",),
    imports="import torch\nfrom torch.autograd import Function\n\nfrom dpteach import exercises",
)

HINTS = {  # a tuple is a hint in steps: the idea on the first failure, closer on the next, the code last
    "outputs": (
        "a tensor's `grad_fn` is the node whose forward returned it: forward must return the copies "
        "themselves, one per copy, in order.",
        "return them as new tensors of the node that share the copies' memory: `.detach()` makes one.",
        "`return tuple(c.detach() for c in copies)`.",
    ),
    "edge": "pass `original` into `apply` as forward's first input: a node's edges lead to its inputs.",
    "sum_missing": (
        "backward returns one value per input of forward, in order: `original` comes first.",
        "the first value is the gradient for `original`: the sum of every copy's gradient; then `None` for "
        "each copy.",
        "`return (sum(grads),) + (None,) * len(grads)`, with each gradient moved to the original's device.",
    ),
    "sum_wrong": "the original's gradient is the sum of every copy's gradient: add them all, do not divide.",
    "device": (
        "the sum must land where the original lives, whichever device the gradients came from.",
        "remember `original.device` on `ctx` in forward, and move each gradient there in backward.",
        "`ctx.destination = original.device` in forward; `sum(g.to(ctx.destination) for g in grads)` in backward.",
    ),
    "grads_none": "return the sum as the first value of backward: the gradient of `original`.",
}


def rewire_with(reduce_add: type[Function]):
    """The library's ``"rewire"`` strategy (``dpteach.replicate.rewire``) running a learner's ``ReduceAdd``."""

    def replicate(network, devices, detach=False):
        return rewire.replicate(network, devices, detach, node=reduce_add)

    replicate.__name__ = f"rewire_with({getattr(reduce_add, '__name__', 'ReduceAdd')})"
    return replicate


def _probe_node(findings: Findings, reduce_add: type[Function]) -> None:
    """The node alone: three copies of one parameter, gradients 1, 2 and 4 times a known tensor."""
    findings.context = "Trying ReduceAdd alone on one parameter and three copies"
    original = torch.nn.Parameter(torch.arange(6.0).view(2, 3))
    copies = [original.detach().clone() + i for i in range(3)]
    outputs = reduce_add.apply(original, *copies)
    outputs = (outputs,) if isinstance(outputs, torch.Tensor) else outputs
    if not isinstance(outputs, tuple) or len(outputs) != 3:
        got = len(outputs) if isinstance(outputs, (tuple, list)) else type(outputs).__name__
        findings.problem(
            "outputs",
            f"ReduceAdd.apply(original, c0, c1, c2) returned {got} output(s); it must return 3, one per copy",
        )
        raise Stop
    for i, (out, c) in enumerate(zip(outputs, copies)):
        if not isinstance(out, torch.Tensor) or out.shape != c.shape or not torch.equal(out.detach(), c):
            findings.problem(
                "outputs",
                f"output {i} of ReduceAdd.forward is not copy {i}: each replica must get "
                "back its own copy, values unchanged",
            )
            raise Stop
        if out.grad_fn is None or not type(out.grad_fn).__name__.startswith(reduce_add.__name__):
            findings.problem(
                "outputs",
                f"output {i} of ReduceAdd.forward has grad_fn {type(out.grad_fn).__name__}, "
                f"not your {reduce_add.__name__} node: the copies must be the node's own outputs",
            )
            raise Stop
    if not any(leaf is original for leaf in leaves_behind(outputs[0])):
        findings.problem("edge", "the ReduceAdd node has no edge to `original`, so no gradient can reach it")
        raise Stop
    base = torch.tensor([[1.0, -2.0, 3.0], [0.5, 0.0, -1.0]])
    # a scalar loss, not backward(outputs, grad_tensors): torch imports sympy the first time it checks grad_tensors
    sum((out * (2**i * base)).sum() for i, out in enumerate(outputs)).backward()
    if original.grad is None:
        back = _by_hand(reduce_add, marked=False) or (None,)
        if back[0] is None and any(b is not None for b in back[1:]):
            findings.problem(
                "sum_missing",
                "after backward the original's .grad is None: ReduceAdd.backward returns "
                "the gradients for the copies, which are the replicas' own tensors, and None for "
                "`original`: the edge that matters leads to the original",
            )
        else:
            findings.problem(
                "sum_missing",
                "after backward the original's .grad is None: ReduceAdd.backward returned "
                "nothing for `original` (its first return value must be the sum of the gradients)",
            )
    elif not torch.allclose(original.grad, 7 * base):
        ratio = original.grad.norm().item() / (7 * base).norm().item()
        findings.problem(
            "sum_wrong",
            f"with gradients g, 2g and 4g from three copies, the original got "
            f"{ratio:.2f}× the sum 7g: backward must add them all",
        )


class _OnAnotherDevice(torch.Tensor):
    """A CPU tensor standing for one on another slot's device: every op keeps the mark, only a move removes it."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.cpu or (func is torch.Tensor.to and _names_a_device(args[1:], kwargs)):
            return func(
                args[0].as_subclass(torch.Tensor), *args[1:], **kwargs
            )  # moved: an ordinary tensor again
        return super().__torch_function__(func, types, args, kwargs)


def _names_a_device(args, kwargs) -> bool:
    things = list(args) + [kwargs.get("device")]
    return any(isinstance(a, (torch.device, str, int)) and not isinstance(a, bool) for a in things) or any(
        isinstance(a, torch.Tensor) and not isinstance(a, _OnAnotherDevice) for a in args
    )


class _Ctx:
    """Enough of autograd's ``ctx`` to call a Function's forward and backward by hand."""

    def __init__(self, n_inputs: int) -> None:
        self.needs_input_grad = (True,) + (False,) * (n_inputs - 1)
        self.saved_tensors = ()

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors

    def mark_non_differentiable(self, *args):
        pass

    def mark_dirty(self, *args):
        pass

    def set_materialize_grads(self, value):
        pass


def _by_hand(reduce_add: type[Function], marked: bool):
    """Call forward, then backward, by hand on two copies; what backward returns (None if it needs more of ctx)."""
    ctx = _Ctx(3)
    try:
        with torch.no_grad():
            reduce_add.forward(ctx, torch.zeros(2, 3, requires_grad=True), torch.ones(2, 3), torch.ones(2, 3))
            grads = [torch.ones(2, 3) for _ in range(2)]
            back = reduce_add.backward(
                ctx, *[g.as_subclass(_OnAnotherDevice) if marked else g for g in grads]
            )
    except AttributeError:  # it uses a part of ctx this stand-in lacks: the DataParallel runs will tell
        return None
    return tuple(back) if isinstance(back, (tuple, list)) else (back,)


def _probe_device(findings: Findings, reduce_add: type[Function]) -> None:
    """Where the sum lands: the copies' gradients arrive marked as living on another device than the original.

    A machine without two devices cannot show this for real, so forward and backward are called by hand
    and each gradient is a CPU tensor that keeps a mark until something moves it (``.to(device)``).
    """
    findings.context = "Trying ReduceAdd with the copies' gradients on another device"
    back = _by_hand(reduce_add, marked=True)
    if back is not None and isinstance(back[0], _OnAnotherDevice):
        findings.problem(
            "device",
            "ReduceAdd.backward leaves the sum on the device the gradients came from; it must "
            "land on the original's device, as the C++ node's `destination_device_` (the check marks "
            "each gradient as coming from another slot, as it would on a second GPU)",
        )


def _copies_note(reduce_add: type[Function]) -> str:
    """What happens to backward's values for the copies: said on success, whichever the learner returned."""
    back = _by_hand(reduce_add, marked=False) or ()
    yours = (
        "your backward returns a gradient for the copies too; "
        if any(b is not None for b in back[1:])
        else "your backward returns None for the copies; "
    )
    return (
        f"{yours}whatever it returns there is ignored: the copies come in detached (no history, "
        "requires_grad False), so autograd has nowhere to send it. The C++ node returns only the sum "
        "(`return {std::move(output)};`), one value for its one edge"
    )


def check_rewire(reduce_add=None, *, devices=None) -> Result:
    """Check a learner's ``ReduceAdd`` (a ``torch.autograd.Function`` subclass) inside the rewire strategy."""

    def body(findings: Findings) -> None:
        if not (inspect.isclass(reduce_add) and issubclass(reduce_add, Function)):
            findings.problem(
                "usage",
                f"check_rewire expects your ReduceAdd class (a torch.autograd.Function "
                f"subclass), got {reduce_add!r}: `exercises.check_rewire(MyReduceAdd)`",
            )
            raise Stop
        _probe_node(findings, reduce_add)
        _probe_device(findings, reduce_add)
        if not findings.ok:
            return
        run_cases(findings, rewire_with(reduce_add), devices, check_replicas)
        findings.held += [
            f"every replica's copy of a parameter is an output of one {reduce_add.__name__} node, whose one edge "
            "leads to the original parameter (PR #20910's graph)",
            "backward sums every replica's gradient onto the original's device",
            "the original's gradients equal one device's on all three models and 1-4 slots",
            _copies_note(reduce_add),
        ]

    return run_check(TASK, HINTS, body)


def try_answer(reduce_add) -> str:
    """One DataParallel step of the ``"rewire"`` strategy with the learner's node (``try_it("rewire", ReduceAdd)``)."""
    x, _ = story.make_data(n=16)
    return try_step(rewire_with(reduce_add), story.make_model(), x)
