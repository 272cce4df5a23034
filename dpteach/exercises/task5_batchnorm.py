"""Task 5 (chapter 05): keep BatchNorm statistics from slot 0 (issue #21144).

The learner writes a strategy whose slot-0 buffers *are* the original's; the check runs it in
training mode on every model and 1-4 slots (``_harness.check_buffers`` says what it asks).
"""

from __future__ import annotations

import torch

from ._feedback import Findings, Result, Task
from ._harness import check_buffers, check_replicas, require_strategy, run_cases, run_check, try_step
from ._models import conv_bn

TASK = Task(  # the registry finds this record by the file's name
    5,
    "batchnorm",
    "keep BatchNorm statistics from slot 0",
    "05",
    names=("keep_bn_statistics",),
    check="check_batchnorm",
    imports="import dpteach\nfrom dpteach import exercises",
)

START_FIXED = (
    "start from replicas whose parameters lead back to the original (strategy='rewire' or 'broadcast')"
)
HINTS = {  # a tuple is a hint in steps: the idea on the first failure, closer on the next, the code last
    "buffer_copied": (
        "slot 0's replica must hold the original's buffer *objects*, not copies of them: then BatchNorm's "
        "in-place updates on slot 0 land in the model.",
        "a module keeps its buffers in its `_buffers` dict: for each of `network.named_buffers()`, find the "
        "owning submodule in `replicas[0]` and put the original buffer there.",
        "`owner, _, key = name.rpartition('.')`, then `replicas[0].get_submodule(owner)._buffers[key] = buffer`.",
    ),
    "buffer_shared": "give only slot 0 the original's buffers; leave the other slots' copies as they are.",
    "stats": "only slot 0's BatchNorm should write into the original's statistics: make slot 0's buffers the "
    "original's and leave the later slots' copies alone.",
    "fresh_leaf": f"{START_FIXED}, not from 'clone'.",
    "grads_none": f"{START_FIXED}, not from 'clone'.",
}


def check_batchnorm(strategy=None, *, devices=None) -> Result:
    """Check a strategy that keeps slot 0's buffers the original's (any ``strategy=`` DataParallel accepts)."""

    def body(findings: Findings) -> None:
        require_strategy(findings, strategy, "check_batchnorm", "keep_bn_statistics")
        run_cases(findings, strategy, devices, check_replicas, check_buffers)
        findings.held += [
            "slot 0's buffers are the original's own; every later slot owns copies",
            "after a training step the original's running statistics are one device's after slot 0's piece, on 1-4 "
            "slots (chapter 05's lost updates are gone)",
            "gradients still reach the original and equal one device's",
        ]

    return run_check(TASK, HINTS, body)


def try_answer(keep_bn_statistics) -> str:
    """One training-mode DataParallel step of a conv net with BatchNorm (``try_it("batchnorm", fn)``)."""
    with torch.random.fork_rng(devices=[]):  # the learner's random state is left alone
        model, x = conv_bn(), torch.randn(8, 1, 5, 5)
    return try_step(keep_bn_statistics, model, x)
