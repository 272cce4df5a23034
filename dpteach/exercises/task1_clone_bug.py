"""Task 1 (chapter 02): find the bug in a clone-based replicate.

The learner fixes ``replicate_by_clone``, whose parameters were fresh leaves (issue #19540).
The check runs it as ``strategy=`` through DataParallel on every model and 1-4 slots, and asks of
each replica parameter: does a path lead back to the original? is it on its slot, in its own
memory? and of the original: is its gradient the one one device computes?
"""

from __future__ import annotations

from ..course import story
from ._feedback import Findings, Result, Task
from ._harness import check_replicas, require_strategy, run_cases, run_check
from ._try import step

TASK = Task(  # this exercise's one record: every table (sources, notebook, index) is derived from it
    1,
    "clone_bug",
    "find the bug in clone-based replicate",
    "02",
    names=("replicate_by_clone",),
    check="check_clone_bug",
    writes="the line of `replicate_by_clone` that loses the gradient edge",
    imports="from copy import deepcopy\n\nimport torch\nfrom torch import nn\n\nfrom dpteach import exercises",
    intro=(
        "## Task 1 · Find the bug in clone-based replicate\n\n"
        'Chapter 01 trained a model under `strategy="clone"` and watched nothing happen (issue #19540). '
        "`replicate_by_clone` below builds replicas the same way: a deep copy per slot, then every parameter "
        "replaced by `copy`. The line that made `copy` is shown as a `# BROKEN` comment. Replace the `raise` "
        "with a line that makes a copy of `param` on `device` that **keeps a gradient edge back to `param`** "
        "and has memory of its own. One line; the check names each trap it finds."
    ),
    demo=(
        'First, read what the check says about the broken strategy itself, `"clone"`: every sentence is one '
        "symptom of the bug.",
        'exercises.check_clone_bug("clone")',
    ),
    note=(
        "`param.to(device, copy=True)` is computed by autograd from `param`, so its `grad_fn` has an "
        "edge to `param`; `copy=True` gives every slot its own memory even on the device `param` is on."
    ),
)

HINTS = {
    "fresh_leaf": "a new `nn.Parameter`, or anything made from `param.detach()` or under `torch.no_grad()`, is a "
    "fresh leaf with no memory of `param`. Make the copy with an operation on `param` that autograd records, "
    "so that the copy has a `grad_fn` (chapter 02 reads them).",
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


def try_answer(replicate_by_clone) -> str:
    """One DataParallel step with the learner's strategy (``try_it("clone_bug", fn)``)."""
    x, _ = story.make_data(n=16)
    return step(replicate_by_clone, story.make_model(), x)
