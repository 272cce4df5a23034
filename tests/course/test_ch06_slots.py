"""Chapter 06's count check (the cell after "Counting the bytes of one step") on slots that are not all on one device.

On a CPU, or with every slot on one GPU, nothing crosses devices; on two GPUs ``"clone"`` and
``"rewire"`` also copy every tensor a second time with ``.to``, and the batch's pieces and the
gradients' sums cross. The cell must expect that, not fail there. No GPU is needed: slot 1 is a
``"meta"`` device (a shape and no data, as in chapter 08's counting cell), and the copies out of it
that a full step makes (the gather, the gradients' sums) come back as zeros of the right shape.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import nbformat
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import dpteach
from dpteach.measure import costs

ROOT = Path(__file__).resolve().parents[2]
CELLS = {
    c.id: c for c in nbformat.read(ROOT / "notebooks" / "06_the_cost_of_copies.ipynb", as_version=4).cells
}
MODEL, CHECK = "c04", "c08"  # the model and one step per strategy; the check of the counts


class CopiesOutOfMeta(TorchDispatchMode):
    """A copy from "meta" onto a real device returns zeros of its shape (meta has no data to copy)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (
            func is torch.ops.aten._to_copy.default
            and args[0].device.type == "meta"
            and kwargs.get("device") is not None
            and torch.device(kwargs["device"]).type != "meta"
        ):
            return torch.zeros(
                args[0].shape, dtype=kwargs.get("dtype") or args[0].dtype, device=kwargs["device"]
            )
        return func(*args, **kwargs)


def exercise_section() -> str:
    """The chapter's exercises, markdown and starter cells: from ``## Exercises`` to ``## Try it yourself``."""
    cells = list(CELLS.values())
    start = next(i for i, c in enumerate(cells) if c.source.startswith("## Exercises"))
    end = next(i for i, c in enumerate(cells) if i > start and c.source.startswith("## Try it yourself"))
    return "\n".join(c.source for c in cells[start:end])


def run_cells(devices):
    """The chapter's model, traffic and check cells on ``devices``; what they printed, and the scope."""
    scope = {"torch": torch, "nn": nn, "dpteach": dpteach, "costs": costs, "devices": devices}
    out = io.StringIO()
    with contextlib.redirect_stdout(out), CopiesOutOfMeta():
        for cid in (MODEL, CHECK):
            exec(compile(CELLS[cid].source, f"<cell {cid}>", "exec"), scope)
    return out.getvalue(), scope


def test_the_check_holds_when_slot_1_is_another_device():
    printed, scope = run_cells([torch.device("cpu"), torch.device("meta")])
    P, B = scope["P"], scope["B"]
    assert scope["traffic"]["clone"].by_op()["to"] == P + B  # the copies the old check did not expect
    assert scope["traffic"]["rewire"].by_op()["reduce_add"] == P  # and the gradients' sums
    assert "1 of the 2 slots are on another device than cpu" in printed
    assert f"also copied {P + B:,} bytes with .to" in printed


def test_the_check_holds_on_one_device():
    printed, scope = run_cells([torch.device("cpu")] * 2)
    assert "to" not in scope["traffic"]["clone"].by_op()
    assert "all 2 slots are on cpu, so no copy crossed devices" in printed


def test_the_check_fails_when_a_count_is_off():
    """The check can fail: one byte too many in a step's clone count trips it."""
    printed, scope = run_cells([torch.device("cpu"), torch.device("meta")])
    scope["traffic"]["clone"].copies.append(
        dpteach.comm.Copy("clone", 1, torch.device("cpu"), torch.device("cpu"))
    )
    try:
        exec(compile(CELLS[CHECK].source, "<cell>", "exec"), scope)
    except AssertionError as e:
        assert "clone" in str(e)
    else:
        raise AssertionError("the check passed a count one byte off")


def test_exercise_4_can_be_answered_with_a_meta_slot():
    """Exercise 4: with slot 1 on "meta", each copy's ``dst`` says which slot it went to."""
    exercise = exercise_section()
    assert 'torch.device("meta")' in exercise  # its starter cell names the way to tell the slots apart
    _, scope = run_cells([torch.device("cpu")] * 2)
    model, size = scope["model"], scope["P"] + scope["B"]
    meta = torch.device("meta")
    with dpteach.comm.traffic() as t:
        dpteach.replicate(model, [torch.device("cpu"), meta], strategy="broadcast")
    assert sum(c.nbytes for c in t.copies if c.dst == meta) == size  # (N - 1)(P + B) with N = 2
    with dpteach.comm.traffic() as t:
        dpteach.replicate(model, [torch.device("cpu"), meta], strategy="clone")
    onto = {(c.op, c.dst.type): 0 for c in t.copies}
    for c in t.copies:
        onto[c.op, c.dst.type] += c.nbytes
    assert onto == {
        ("clone", "cpu"): 2 * size,
        ("to", "meta"): size,
    }  # both clones on cpu, then .to for slot 1


def test_the_check_derives_the_copy_counts_from_the_model():
    """The printed counts are one copy per tensor per model copy plus a gather piece per slot, and the
    totals are the number of copies the step made (the "24 copies" and "13 copies" of its last line)."""
    printed, scope = run_cells([torch.device("cpu")] * 2)
    model, traffic = scope["model"], scope["traffic"]
    tensors = sum(1 for _ in model.parameters()) + sum(1 for _ in model.buffers())
    assert tensors == 8 + 3  # three Linears and a BatchNorm, a weight and a bias each; BatchNorm's 3 buffers
    clone, broadcast = len(traffic["clone"].copies), len(traffic["broadcast"].copies)
    assert (clone, broadcast) == (2 * tensors + 2, tensors + 2)
    assert f"N·T = {2 * tensors} copies" in printed and f"(N - 1)·T = {tensors} copies" in printed
    assert f"clone {clone} copies" in printed and f"broadcast {broadcast} copies" in printed


def test_the_check_fails_when_a_copy_count_is_off_but_the_bytes_are_right():
    """One clone split into two halves keeps every byte count and adds a copy: the count check trips."""
    _, scope = run_cells([torch.device("cpu")] * 2)
    copies = scope["traffic"]["clone"].copies
    i = next(k for k, c in enumerate(copies) if c.op == "clone")
    whole = copies[i]
    half = dpteach.comm.Copy("clone", whole.nbytes // 2, whole.src, whole.dst)
    copies[i : i + 1] = [half, dpteach.comm.Copy("clone", whole.nbytes - half.nbytes, whole.src, whole.dst)]
    try:
        exec(compile(CELLS[CHECK].source, "<cell>", "exec"), scope)
    except AssertionError as e:
        assert "copies" in str(e)
    else:
        raise AssertionError("the check passed a copy count one off")
