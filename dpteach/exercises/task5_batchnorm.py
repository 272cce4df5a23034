"""Task 5 (chapter 05): keep BatchNorm statistics from slot 0.

PR #20910's replicas deep-copy every buffer, so BatchNorm's running statistics, which each replica
updates in place, die with the replicas (issue #21144; ssnl: "it would be impossible to correctly
perform BN"). The learner writes a strategy whose slot-0 buffers *are* the original's. The check
runs it through DataParallel in training mode on every model and 1-4 slots: slot 0 aliases, later
slots own their buffers, the original's statistics are those one device has after slot 0's piece,
and the gradients still reach the original.
"""

from __future__ import annotations

import torch

from ._feedback import Findings, Result, Task
from ._harness import check_buffers, check_replicas, require_strategy, run_cases, run_check
from ._models import conv_bn
from ._try import step

TASK = Task(  # this exercise's one record: every table (sources, notebook, index) is derived from it
    5,
    "batchnorm",
    "keep BatchNorm statistics from slot 0",
    "05",
    names=("keep_bn_statistics",),
    check="check_batchnorm",
    writes="`keep_bn_statistics`, a strategy whose slot-0 buffers are the model's",
    imports="import dpteach\nfrom dpteach import exercises",
    intro=(
        "## Task 5 · Keep BatchNorm statistics from slot 0\n\n"
        "PR #20910's replicas deep-copy every buffer, so BatchNorm's running statistics, updated in place on "
        "each replica, vanish with the replicas (issue #21144). Python's `replicate.py` avoids "
        "this because slot 0's replica shares the model's memory. Start from the `\"rewire\"` replicas and make "
        "every buffer of slot 0's replica **be** the model's own buffer; the other slots keep their copies "
        "(only slot 0's statistics survive, as in PyTorch)."
    ),
    demo=None,
    note=(
        "For every buffer, the owner module's `_buffers` entry in slot 0's replica is set to the "
        "original buffer itself: BatchNorm's in-place updates on slot 0 now land in the model."
    ),
)

HINTS = {
    "buffer_copied": "put the original's buffer itself into slot 0's replica: for every `name, buffer` in "
    "`network.named_buffers()`, `replicas[0].get_submodule(owner)._buffers[key] = buffer` (not a copy, not "
    "`.clone()`).",
    "buffer_shared": "only slot 0 may hold the original's buffers; leave the other slots' copies as they are.",
    "stats": "the original's running statistics should be exactly what one device has after seeing slot 0's piece "
    "of the batch: only slot 0's BatchNorm writes into them.",
    "fresh_leaf": "start from replicas whose parameters lead back to the original (strategy='rewire' or "
    "'broadcast'), not from 'clone'.",
    "grads_none": "start from replicas whose parameters lead back to the original (strategy='rewire' or "
    "'broadcast'), not from 'clone'.",
    "error": "run the stub cell's last line (`exercises.try_it(...)`) to see the full traceback.",
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
    return step(keep_bn_statistics, model, x)
