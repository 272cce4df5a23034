"""Task 6 (taught in 06, tried in 11): one copy, not two (PR #20995): the learner writes ``copy_once``.

The check counts the aten copies (chapter 06's ``CountCopies``) onto the tensor's own device and onto
``"meta"`` (a second GPU's stand-in; every CUDA pair there is too), and wants no autograd history."""

from __future__ import annotations

import torch

from ..measure.costs import CountCopies
from ._feedback import Findings, Result, Task
from ._harness import run_check

TASK = Task(  # the registry finds this record by the file's name
    6,
    "one_copy",
    "one copy, not two",
    "11",
    names=("copy_once",),
    check="check_copy_once",
    imports="import torch\n\nfrom dpteach import exercises",
    taught="06",  # chapter 06 counts the clone-then-.to copies; chapter 11 holds the stub
)

HINTS = {
    "twice": (
        "one copy is enough: onto another device `.to` makes it, so a `clone()` there is a second copy.",
        "compare the tensor's device with `torch.device(device)`: where they differ, `.to(device)` alone; where "
        "they are the same, `.to` makes no copy, so `clone()` alone.",
    ),
    "shared": "on the tensor's own device `.to(device)` hands back the tensor itself (no copy): `clone()` there.",
    "device": "make the copy on `device`, whatever device the tensor starts on: `.to(device)` moves it.",
    "string": '`device` may be a string such as `"cpu"`: `tensor.device != "cpu"` is True even on the CPU, '
    "so turn it into a `torch.device(device)` before comparing.",
    "values": "return a tensor with the tensor's shape, dtype and values: copy it, do not change it.",
    "history": (
        "the copy is data, as the BEFORE line's is: no autograd history (keeping an edge is Task 1's job).",
        "`tensor.detach()` first: it copies nothing and leaves the history behind.",
    ),
}


def places(devices=None) -> list[tuple[torch.device, torch.device]]:
    """(source, destination) pairs: onto its own device and onto another, every CUDA pair there is too."""
    pairs = [("cpu", "cpu"), ("cpu", "meta")]
    if torch.cuda.is_available():
        pairs += [("cuda:0", "cuda:0"), ("cpu", "cuda:0"), ("cuda:0", "cpu")]
        if torch.cuda.device_count() > 1:
            pairs.append(("cuda:0", "cuda:1"))
    pairs += [("cpu", d) for d in devices or ()]
    return [(torch.device(a), torch.device(b)) for a, b in pairs]


def _one(findings: Findings, copy_once, src, dst: torch.device, given=None, as_device_ok=False) -> bool:
    """``copy_once(a tensor on src, given)``, ``given`` being ``dst`` or its string; True if the call held.
    ``as_device_ok``: the ``torch.device`` call held, so a string making no copy is the "string" mistake."""
    given = dst if given is None else given
    named = f" (given as the string {given!r})" if isinstance(given, str) else ""
    findings.context = where = f"Copying a tensor from {src} to {dst}{named}"
    source = torch.arange(12.0, device=src).reshape(3, 4).requires_grad_()  # a parameter's stand-in
    with CountCopies() as counter:
        out = copy_once(source, given)
    found = None
    if not isinstance(out, torch.Tensor):
        found = "values", f"{where}: `copy_once` returned {type(out).__name__}, not a tensor"
    elif out.device != dst:
        found = "device", f"{where}: the copy is on {out.device}"
    elif len(counter.copies) > 1:
        note = "; `_to_copy` is the copy `.to` makes" if "_to_copy" in counter.copies else ""
        ops = ", ".join(counter.copies)
        found = "twice", f"{where}: {len(counter.copies)} copies ({ops}) where one does{note}"
    elif not counter.copies or (dst.type != "meta" and out.data_ptr() == source.data_ptr()):
        kind = "string" if isinstance(given, str) and as_device_ok else "shared"
        found = kind, f"{where}: no copy was made, so the replica would share the original's memory"
    elif out.shape != source.shape or out.dtype != source.dtype:
        found = "values", f"{where}: the copy is {tuple(out.shape)} {out.dtype}, not (3, 4) {source.dtype}"
    elif dst.type != "meta" and not torch.equal(out.cpu(), source.cpu()):
        found = "values", f"{where}: the copy's values differ from the tensor's"
    elif out.requires_grad:
        found = "history", f"{where}: the copy carries autograd history (it requires grad)"
    if found:
        findings.problem(*found)
    return found is None or found[0] == "history"  # the copy itself held


def check_copy_once(copy_once=None, *, devices=None) -> Result:
    """Check ``copy_once(tensor, device)``: one copy per tensor onto every device, memory of its own (PR #20995)."""

    def body(findings: Findings) -> None:
        if not callable(copy_once):
            findings.stop("usage", f"pass your function (`check_copy_once(copy_once)`), not {copy_once!r}")
        for src, dst in places(devices):
            as_device_ok = _one(findings, copy_once, src, dst)
            # "cpu" as a slot list names it; blame the string only if the torch.device call held
            _one(findings, copy_once, src, dst, given=str(dst), as_device_ok=as_device_ok)
        findings.held += [
            "one copy per tensor onto another device (`meta` standing in for a second GPU), as after PR #20995",
            "one copy on the tensor's own device too, with memory of its own, same shape, dtype and values",
            "no autograd history: data for a fresh parameter, as `Module::clone()` makes it",
        ]

    return run_check(TASK, HINTS, body)


def try_answer(copy_once) -> str:
    """Copy one tensor onto "meta" and onto its own device (``try_it("one_copy", fn)``)."""
    said = []
    for dst in (torch.device("meta"), torch.device("cpu")):
        with CountCopies() as counter:
            out = copy_once(torch.ones(2, 3), dst)
        n, where = len(counter.copies), getattr(out, "device", "?")
        said.append(f"onto {dst}: {n} cop{'y' if n == 1 else 'ies'}, a {type(out).__name__} on {where}")
    return "copy_once ran; " + "; ".join(said)
