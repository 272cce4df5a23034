"""Task 5 (chapter 05): keep BatchNorm statistics from slot 0 (issue #21144), in a strategy whose slot-0
buffers *are* the original's, run in training mode on every model and 1-4 slots (``_harness.check_buffers``)."""

from __future__ import annotations

from ._feedback import Findings, Result, Task
from ._harness import check_buffers, require_strategy, run_cases, run_check, try_step
from ._models import CASES, conv_bn

TASK = Task(  # the registry finds this record by the file's name
    5,
    "batchnorm",
    "keep BatchNorm statistics from slot 0",
    "05",
    names=("keep_bn_statistics",),
    check="check_batchnorm",
    imports="import dpteach\nfrom dpteach import exercises",
)

HINTS = dict.fromkeys(  # a replica parameter that leads nowhere; the buffers' hints are _feedback's
    ("fresh_leaf", "grads_none"),
    'keep the stub\'s first line, `dpteach.replicate(network, devices, detach, strategy="rewire")`: its '
    "replicas' parameters lead back to the original. Change only the buffers.",
)


def check_batchnorm(strategy=None, *, devices=None) -> Result:
    """Check a strategy that keeps slot 0's buffers the original's (any ``strategy=`` DataParallel accepts)."""

    def body(findings: Findings) -> None:
        require_strategy(findings, strategy, "check_batchnorm", "keep_bn_statistics")
        run_cases(findings, strategy, devices, check_buffers)
        findings.held += [
            "slot 0's registered buffers are the original's own; every later slot owns copies",
            "after a training step the original's running statistics are one device's after slot 0's piece, on 1-4 "
            "slots (chapter 05's lost updates are gone)",
            "gradients still reach the original and equal one device's",
        ]

    return run_check(TASK, HINTS, body)


def try_answer(keep_bn_statistics) -> str:
    """One training-mode DataParallel step of a conv net with BatchNorm (``try_it("batchnorm", fn)``)."""
    model, x, _ = next(case for case in CASES if case.build is conv_bn).make()  # the learner's RNG untouched
    return try_step(keep_bn_statistics, model, x)
