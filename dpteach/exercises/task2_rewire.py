"""Task 2 (chapter 03): rewire gradient edges, PR #20910's way: the learner writes ``ReduceAdd``.

The check tries the node alone (its outputs, its one edge, its sum, where the sum lands), then runs
the library's ``"rewire"`` strategy with it (:func:`rewire_with`) on every model and 1-4 slots."""

from __future__ import annotations

import functools

import torch
from torch.autograd import Function

from ..replicate import rewire
from ._feedback import Findings, Result, Task
from ._harness import require_function, run_cases, run_check, try_step
from ._paths import leaves_behind

TASK = Task(  # the registry finds this record by the file's name
    2,
    "rewire",
    "rewire gradient edges",
    "03",
    names=("MyReduceAdd",),
    check="check_rewire",
    helpers=("rewire_with",),
    imports="import torch\nfrom torch.autograd import Function\n\nfrom dpteach import exercises",
)

HINTS = {  # a tuple is a hint in steps: the idea on the first failure, closer on the next
    "outputs": (
        "forward hands the copies back as this node's outputs: one output per copy, in order, values unchanged.",
        "return a tuple with one tensor per copy: not `original`, and not one tensor for all of them.",
    ),
    "edge": "keep `original` as forward's first input after `ctx`, where the strategy passes it, and return only "
    "the copies: the node's one edge then leads to `original`.",
    "sum_missing": (
        "backward returns one value per input of forward, in order: `original` comes first.",
        "the first value is the gradient for `original`: the sum of every copy's gradient; then `None` for "
        "each copy.",
    ),
    "sum_dropped": "backward gets one gradient per copy, all in `*grads`: add every one of them, not some.",
    "sum_divided": "the original's gradient is the sum of every copy's gradient, not their mean: do not divide.",
    "sum_wrong": "the original's gradient is the sum of every copy's gradient, each added once, unscaled.",
    "grad_inplace": "build the sum as a new tensor (`sum(grads)`), never with `+=` into a gradient backward receives.",
    "sum_device": (  # not "device": that is a replica's tensor on the wrong slot, which this node does not make
        "the sum must land where the original lives, whichever device the gradients came from.",
        "remember `original.device` on `ctx` in forward, and move each gradient there in backward.",
    ),
}


def rewire_with(reduce_add: type[Function]):
    """The library's ``"rewire"`` strategy (``dpteach.replicate.rewire``) running a learner's ``ReduceAdd``."""
    replicate = functools.partial(rewire.replicate, node=reduce_add)
    replicate.__name__ = f"rewire_with({getattr(reduce_add, '__name__', 'ReduceAdd')})"
    return replicate


def _probe_node(findings: Findings, reduce_add: type[Function]) -> None:
    """The node alone: three copies of one parameter, gradients 1, 2 and 4 times a known tensor."""
    findings.context = f"Trying {(name := reduce_add.__name__)} alone on one parameter and three copies"
    original = torch.nn.Parameter(torch.arange(6.0).view(2, 3))
    copies = [original.detach().clone() + i for i in range(3)]
    outputs = reduce_add.apply(original, *copies)
    outputs = (outputs,) if isinstance(outputs, torch.Tensor) else outputs
    if not isinstance(outputs, tuple) or len(outputs) != 3:
        got = len(outputs) if isinstance(outputs, (tuple, list)) else type(outputs).__name__
        findings.stop(
            "outputs",
            f"{name}.apply(original, c0, c1, c2) returned {got} output(s); it must return 3, one per copy",
        )
    for i, (out, c) in enumerate(zip(outputs, copies)):
        if not isinstance(out, torch.Tensor) or out.shape != c.shape or not torch.equal(out.detach(), c):
            findings.stop(
                "outputs",
                f"output {i} of {name}.forward is not copy {i}: each replica must get "
                "back its own copy, values unchanged",
            )
        if out.grad_fn is None or not type(out.grad_fn).__name__.startswith(reduce_add.__name__):
            findings.stop(
                "outputs",
                f"output {i} of {name}.forward has grad_fn {type(out.grad_fn).__name__}, "
                f"not your {name} node: the copies must be the node's own outputs",
            )
    if not any(leaf is original for leaf in leaves_behind(outputs[0])):
        findings.stop(
            "edge",
            f"the {name} node has no edge to `original`, so no gradient can reach it: keep `original` an input "
            "of forward (its first) and return the copies from forward",
        )
    base = torch.tensor([[1.0, -2.0, 3.0], [0.5, 0.0, -1.0]])
    received = []  # each gradient backward receives, and a copy of it as it arrived
    for out in outputs:
        out.register_hook(lambda g: received.append((g, g.clone())))
    # a scalar loss, not backward(outputs, grad_tensors): torch imports sympy the first time it checks grad_tensors
    sum((out * (2**i * base)).sum() for i, out in enumerate(outputs)).backward()
    written = [i for i, (g, arrived) in enumerate(received) if not torch.equal(g, arrived)]
    if written:
        said = f"{name}.backward writes into the gradient it receives for copy {written[0]} (`+=`, `add_`, `copy_`)"
        findings.stop("grad_inplace", f"{said}: autograd owns those tensors; build the sum as a new tensor")
    if original.grad is None:
        findings.problem(
            "sum_missing",
            "after backward the original's .grad is None: make backward's first return value, the one for "
            "`original`, the sum of the copies' gradients (a value returned for a copy reaches no one)",
        )
    elif not torch.allclose(original.grad, 7 * base):
        k = round((original.grad * base).sum().item() / (base * base).sum().item())  # the gradient is k·g?
        kept = " + ".join(("g", "2g", "4g")[i] for i in range(3) if k >> i & 1)  # each sum of some is unique
        kind, said = "sum_wrong", f"{original.grad.norm().item() / (7 * base).norm().item():.2f}× the sum 7g"
        if 0 < k < 7 and torch.allclose(original.grad, k * base):
            kind, said = "sum_dropped", f"{kept} only: backward dropped the other copies' gradients"
        elif torch.allclose(original.grad, 7 * base / 3):
            kind, said = "sum_divided", "7g/3, the mean: backward divided the sum by the number of copies"
        findings.problem(kind, f"with gradients g, 2g and 4g from three copies, the original got {said}")


def _probe_device(findings: Findings, reduce_add: type[Function]) -> None:
    """Where the sum lands: the original on ``meta``, its copies' gradients on the CPU (no second GPU needed)."""
    findings.context = f"Trying {reduce_add.__name__} with the original on another device than its copies"
    original = torch.nn.Parameter(torch.zeros(2, 3, device="meta"))
    try:
        outputs = reduce_add.apply(original, *[torch.ones(2, 3) for _ in range(3)])
        sum(out.sum() for out in outputs).backward()
    except RuntimeError as exc:
        if "expected device meta but got cpu" not in str(exc):
            raise
        findings.problem(
            "sum_device",
            f"{reduce_add.__name__}.backward leaves the sum where the gradients came from (the CPU); move it to "
            "the original's device (`meta` here, tensors with no data: it stands in for a second GPU, so this runs "
            "on any machine), as the C++ node's `destination_device_` does",
        )


def check_rewire(reduce_add=None, *, devices=None) -> Result:
    """Check a learner's ``ReduceAdd`` (a ``torch.autograd.Function`` subclass) inside the rewire strategy."""

    def body(findings: Findings) -> None:
        require_function(findings, reduce_add, "check_rewire", "MyReduceAdd", "ReduceAdd class")
        _probe_node(findings, reduce_add)
        _probe_device(findings, reduce_add)
        if not findings.ok:
            return
        run_cases(findings, rewire_with(reduce_add), devices)
        findings.held += [
            f"every replica's copy of a parameter is an output of one {reduce_add.__name__} node, whose one edge "
            "leads to the original parameter (PR #20910's graph)",
            "backward sums every replica's gradient onto the original's device",
            "the original's gradients equal one device's on all three models and 1-4 slots",
        ]

    return run_check(TASK, HINTS, body)


def try_answer(reduce_add) -> str:
    """One DataParallel step of the ``"rewire"`` strategy with the learner's node (``try_it("rewire", ReduceAdd)``)."""
    return try_step(rewire_with(reduce_add))
