"""Task 5 (chapter 05): keep BatchNorm statistics from slot 0 (issue #21144), in a strategy whose slot-0
buffers *are* the original's, run in training mode on every model and 1-4 slots (``_harness.check_buffers``)."""

from __future__ import annotations

from ._feedback import Findings, Result, Task
from ._harness import SLOTS, NotYet, check_buffers, require_strategy, run_cases, run_check, try_step
from ._models import CASES, conv_bn, reference

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
            "after a training step the original's running statistics are one device's after slot 0's piece, on 1-4 slots",
            "gradients still reach the original and equal one device's",
        ]

    return run_check(TASK, HINTS, body)


def try_answer(keep_bn_statistics) -> str:
    """One training-mode step of a conv net with BatchNorm, its statistics against one device's after slot 0's piece."""
    model, x, w = next(case for case in CASES if case.build is conv_bn).make()  # the learner's RNG untouched
    want = reference(model, x, w, len(SLOTS)).buffers  # before the step: a copy sees slot 0's piece alone
    said = try_step(keep_bn_statistics, model, x)
    if wrong := [k for k, b in model.named_buffers() if not b.to(want[k].dtype).allclose(want[k])]:
        raise NotYet(
            f"the step ran, but the original's {', '.join(wrong)} differ from one device's after slot 0's piece "
            f"({said.partition('; ')[2][:-1]}): slot 0's replica must hold the original's own buffers, later slots copies"
        )
    return said
