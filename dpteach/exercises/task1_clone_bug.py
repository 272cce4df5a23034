"""Task 1 (taught in 01-02): find the bug in a clone-based replicate, its parameters fresh leaves (issue #19540).

The check runs ``replicate_by_clone`` on every model and 1-4 CPU slots, then onto ``[cpu, meta]``
(``meta``: shapes, no data), where a copy that ignores ``device`` no longer lands right by luck."""

from __future__ import annotations

import torch

from ..course import story
from ..graph.names import resolve
from ..graph.walk import grad_fns
from ..replicate import replicate
from ._feedback import Findings, Result, Task
from ._harness import SLOTS, NotYet, check_replicas, require_strategy, run_cases, run_check, try_step
from ._models import CASES
from ._paths import edge_problem, places, shares_storage

TASK = Task(  # the registry finds this record by the file's name
    1,
    "clone_bug",
    "find the bug in clone-based replicate",
    "02",
    names=("replicate_by_clone",),
    check="check_clone_bug",
    imports="from copy import deepcopy\n\nimport torch\nfrom torch import nn\n\nfrom dpteach import exercises",
    taught="01, 02",  # 01: a clone is a fresh leaf; 02: a copy autograd records keeps its edge
)

HINTS = {  # a tuple is a hint in steps: the idea on the first failure, closer on the next
    "fresh_leaf": (
        "a replica's parameter learns for the original only if autograd *made it from* `param`: then its "
        "`grad_fn` has an edge back to `param` (chapter 02 reads them).",
        "a new `nn.Parameter`, `.detach()` or anything under `torch.no_grad()` is a fresh leaf that forgot "
        "`param`: keep the broken line's copy of `param` onto `device`, without the parts that forget it.",
    ),
    "shared": (
        "every slot after slot 0 must own its memory: an operation that can hand back its input unchanged shares it.",
        "`param.to(device)` hands back `param` itself when it is already on `device` (these CPU slots): copy it there.",
    ),
    "device": "make the copy on `device`, the slot it is for: a copy that ignores `device` stays on "
    "`param`'s device, which only looks right while every slot is the CPU.",
}


SECOND_DEVICE = [torch.device("cpu"), torch.device("meta")]  # meta: shapes, no data, no arithmetic
ONTO_META = "onto the slots [cpu, meta] (`meta` is a device that holds shapes and no data)"


def check_slot_devices(findings: Findings, strategy) -> list[str]:
    """Replicate every model onto ``[cpu, meta]``: each replica's parameters must be on its own slot's device;
    if they are, the copying nodes from the last meta replica's first parameter back to the original's."""
    for case in CASES:
        model = case.make()[0]
        findings.context = f"Replicating {case.name} {ONTO_META}"
        replicas = replicate(model, SECOND_DEVICE, strategy=strategy)
        check_replicas(findings, model, replicas, SECOND_DEVICE, findings.context)
    copy = resolve(replicas[1], next(iter(places(model))).name) if findings.ok else None
    # the nodes from the copy down to the original's AccumulateGrad, in the order the forward made them
    found = [type(fn).__name__ for fn in reversed(grad_fns([copy.grad_fn] if copy is not None else []))]
    return [name for name in found if name in ("CloneBackward0", "ToCopyBackward0")]


def check_clone_bug(strategy=None, *, devices=None) -> Result:
    """Check a fixed clone-based replicate (any ``strategy=`` DataParallel accepts) against one device."""

    def body(findings: Findings) -> None:
        require_strategy(findings, strategy, "check_clone_bug", "replicate_by_clone")
        run_cases(findings, strategy, devices)
        copies = check_slot_devices(findings, strategy)
        findings.held += [
            "every replica's parameters lead back to the original's, on all three models (MLP, conv net with "
            "BatchNorm, tied weights) and 1-4 slots",
            "every slot after slot 0 owns its copies, on its own device (checked on [cpu, meta] too)",
            "the original's gradients equal one device's: DataParallel learns again",
        ]
        if findings.ok and len(copies) > 1:  # clone().to(device) passes; Task 6 makes it one copy
            findings.held.append(
                f"onto another device your answer makes {len(copies)} copies of each parameter ("
                f"{', then '.join(copies)} on the `meta` slot), which is right here; Task 6 makes it one"
            )

    return run_check(TASK, HINTS, body)


def try_answer(replicate_by_clone) -> str:
    """One DataParallel step with the learner's strategy (``try_it("clone_bug", fn)``), then what it left."""
    model, x = story.make_model(), story.make_data(n=16)[0]
    said = try_step(replicate_by_clone, model, x, why=True)
    ran = f"one DataParallel step on {len(SLOTS)} CPU slots ran"
    replica = replicate(model, SLOTS, strategy=replicate_by_clone)[1]  # the step ran: every copy is there
    if missing := [n for n, p in model.named_parameters() if p.grad is None]:  # the bug itself, not a success
        why = next(
            (f[1] for pl in places(model) if (f := edge_problem(resolve(replica, pl.name), pl, 1))), ""
        )
        raise NotYet(f"{ran}, but the original's `.grad` is still None for `{'`, `'.join(missing)}`. {why}")
    if shared := [n for n, p in model.named_parameters() if shares_storage(resolve(replica, n), p)]:
        raise NotYet(  # the gradients reach the original, yet the check will reject these copies
            f"{ran}, but replica 1's `{'`, `'.join(shared)}` share the original's memory: every slot after "
            "slot 0 needs a copy of its own, as on a second GPU, which does not hold the original"
        )
    return said
