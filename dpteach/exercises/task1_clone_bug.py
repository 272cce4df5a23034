"""Task 1 (chapter 02): find the bug in a clone-based replicate.

The learner fixes ``replicate_by_clone``, whose parameters were fresh leaves (issue #19540).
The check runs it as ``strategy=`` through DataParallel on every model and 1-4 slots, and asks of
each replica parameter: does a path lead back to the original? is it on its slot, in its own
memory? and of the original: is its gradient the one one device computes? Those slots are all
``cpu``, where a copy that ignores ``device`` lands on the right device by luck, so the check also
replicates every model onto ``[cpu, meta]`` (``meta`` holds shapes and no data) and asks where
each replica's tensors landed.
"""

from __future__ import annotations

import torch

from ..course import story
from ..replicate import replicate
from ._feedback import Findings, Result, Task
from ._harness import check_replicas, require_strategy, run_cases, run_check
from ._models import CASES
from ._paths import places, replica_tensor
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
        "and, on every slot after slot 0, has memory of its own (slot 0 may share the original's, as "
        "`torch/nn/parallel/replicate.py` does). One line; the check names each trap it finds. "
        "(`detach=False` is there because every strategy has `replicate`'s signature; this task does not use it.)"
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
    "device": "the copy must be made on `device`, the slot it is for: a copy that ignores `device` stays on "
    "`param`'s device, which only looks right while every slot is the CPU.",
    "grads_none": "when no gradient reaches the original, look at where each replica's parameter leads (`grad_fn`, "
    "then `next_functions`, as in chapter 02).",
    "grads_wrong": "a gradient that is a multiple of one device's means some replica's gradient is counted twice, or "
    "not at all.",
    "error": "run the stub cell's last line (`exercises.try_it(...)`) to see the full traceback.",
}


SECOND_DEVICE = [torch.device("cpu"), torch.device("meta")]  # meta: shapes, no data, no arithmetic


def check_slot_devices(findings: Findings, strategy) -> None:
    """Replicate every model onto ``[cpu, meta]``: each replica's parameters must be on its own slot's device.

    The check's other runs use CPU slots only, where a copy that ignores ``device`` (``param.clone()``)
    lands on the right device by accident. The ``meta`` device needs no GPU and makes no data.
    """
    for case in CASES:
        findings.context = f"Replicating {case.name} onto the slots [cpu, meta]"
        model, _, _ = case.make()
        replicas = replicate(model, SECOND_DEVICE, strategy=strategy)
        for slot, replica in enumerate(replicas):
            for place in places(model):
                t = replica_tensor(replica, place)
                if t is not None and t.device != SECOND_DEVICE[slot]:
                    findings.problem(
                        "device",
                        f"{findings.context} (`torch.device('meta')` is a device that holds shapes and no "
                        f"data): replica {slot}'s `{place.name}` is on {t.device}, but slot {slot} is "
                        f"{SECOND_DEVICE[slot]}",
                    )


def check_clone_bug(strategy=None, *, devices=None) -> Result:
    """Check a fixed clone-based replicate (any ``strategy=`` DataParallel accepts) against one device."""

    def body(findings: Findings) -> None:
        require_strategy(findings, strategy, "check_clone_bug", "replicate_by_clone")
        run_cases(findings, strategy, devices, check_replicas)
        check_slot_devices(findings, strategy)
        findings.held += [
            "every replica's parameters lead back to the original's, on all three models (MLP, conv net with "
            "BatchNorm, tied weights) and 1-4 slots",
            "every slot after slot 0 owns its copies, on its own device (checked on [cpu, meta] too)",
            "the original's gradients equal one device's: DataParallel learns again",
        ]

    return run_check(TASK, HINTS, body)


def try_answer(replicate_by_clone) -> str:
    """One DataParallel step with the learner's strategy (``try_it("clone_bug", fn)``)."""
    x, _ = story.make_data(n=16)
    return step(replicate_by_clone, story.make_model(), x)
