"""Task 1 (chapter 01): find the bug in a clone-based replicate.

The learner fixes ``replicate_by_clone``, whose parameters were fresh leaves (issue #19540).
The check runs it as ``strategy=`` through DataParallel on every model and 1-4 slots, and asks of
each replica parameter: does a path lead back to the original? is it on its slot, in its own
memory? and of the original: is its gradient the one one device computes?
"""

from __future__ import annotations

from ._feedback import Findings, Result, Task
from ._harness import check_replicas, require_strategy, run_cases, run_check

TASK = Task(1, "clone_bug", "find the bug in clone-based replicate", "01")

HINTS = {
    "fresh_leaf": "a new `nn.Parameter`, or anything made from `param.detach()` or under `torch.no_grad()`, is a "
    "fresh leaf with no memory of `param`. Make the copy with an operation autograd records, such as "
    "`param.to(device, copy=True)` or `param.clone()`.",
    "no_grad": "the copy must be made with gradients on: no `torch.no_grad()`, no `.detach()`.",
    "wrong_leaf": "the copy must be computed from `param` itself; computing it from a detached copy of `param` gives "
    "an edge to that copy instead.",
    "shared": "`param.to(device)` hands back `param` itself when it is already on `device`; `copy=True` (or "
    "`.clone()`) makes a tensor with memory of its own.",
    "grads_none": "when no gradient reaches the original, look at where each replica's parameter leads (`grad_fn`, "
    "then `next_functions`, as in chapter 02).",
    "grads_wrong": "a gradient that is a multiple of one device's means some replica's gradient is counted twice, or "
    "not at all.",
    "error": "run the stub cell's last line (`exercises.try_it(...)`) to see the full traceback.",
}


def check_clone_bug(strategy=None, *, devices=None) -> Result:
    """Check a fixed clone-based replicate (any ``strategy=`` DataParallel accepts) against one device."""

    def body(findings: Findings) -> None:
        require_strategy(findings, strategy, "check_clone_bug", "replicate_by_clone")
        run_cases(findings, strategy, devices, check_replicas)
        findings.held += [
            "every replica's parameters lead back to the original's, on all three models (MLP, conv net with "
            "BatchNorm, tied weights) and 1-4 slots",
            "every slot after slot 0 owns its copies, on its own device",
            "the original's gradients equal one device's: DataParallel learns again",
        ]

    return run_check(TASK, HINTS, body)
