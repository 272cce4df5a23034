"""The library under learners' real code (issue 12): meters that nest, compiled and scripted modules,
rare inputs, and the places where dpteach deliberately differs from torch.nn.parallel.

The reference is always the same model on one device, or torch's own code where it runs on CPU.
"""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn
from torch.testing import assert_close

import dpteach
from dpteach import comm

SLOTS = ["cpu", "cpu"]


def small_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def one_step(model: nn.Module, x: torch.Tensor, devices=SLOTS, strategy="broadcast"):
    out = dpteach.DataParallel(model, devices, strategy=strategy)(x)
    out.pow(2).sum().backward()
    return out


# ------------------------------------------------------------------------------------------------
# 1. traffic() meters nest, close out of order, and never stay registered
# ------------------------------------------------------------------------------------------------


def test_nested_meters_each_see_their_own_copies():
    model, x = small_model(), torch.randn(8, 4)
    with comm.traffic() as outer:
        one_step(model, x)
        with comm.traffic() as inner:
            one_step(model, x)
        after_inner = outer.bytes
        one_step(model, x)
    assert comm._meters == []  # nothing left registered
    assert inner.bytes > 0
    assert after_inner == 2 * inner.bytes  # the outer block saw both steps so far ...
    assert outer.bytes == 3 * inner.bytes  # ... and the one after the inner block closed


def test_equal_meters_close_without_error():
    # two meters that saw the same copies are equal dataclasses: closing one must not remove the other
    with comm.traffic() as outer:
        with comm.traffic() as inner:
            comm.broadcast(torch.ones(4), SLOTS)
        assert inner == outer  # equal by value, distinct objects
        comm.broadcast(torch.ones(4), SLOTS)
    assert comm._meters == []
    assert outer.bytes == 2 * inner.bytes


def test_meters_closed_out_of_order_from_two_threads():
    opened = threading.Barrier(2)
    first_closed = threading.Event()
    meters, errors = {}, []

    def run(name, close_first):
        try:
            with comm.traffic() as meter:
                meters[name] = meter
                opened.wait(timeout=10)
                comm.broadcast(torch.ones(4), SLOTS)
                if not close_first:
                    first_closed.wait(timeout=10)  # the meter opened first closes last
                    comm.broadcast(torch.ones(4), SLOTS)
            if close_first:
                first_closed.set()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    a = threading.Thread(target=run, args=("a", False))
    b = threading.Thread(target=run, args=("b", True))
    a.start(), b.start(), a.join(10), b.join(10)
    assert errors == []
    assert comm._meters == []
    one = comm.nbytes(torch.ones(4))  # one broadcast to the second slot copies 16 bytes
    assert meters["b"].bytes == 2 * one  # both threads' copies while b was open (traffic counts every thread)
    assert meters["a"].bytes == 3 * one


def test_meter_unregistered_after_an_exception():
    with pytest.raises(ZeroDivisionError):
        with comm.traffic():
            with comm.traffic():
                1 / 0
    assert comm._meters == []


def test_profile_step_inside_an_open_meter():
    # chapter 08's exercise: profile with traffic() open; profile_step opens a meter of its own
    from dpteach.profile import profile_step

    model, x = small_model(), torch.randn(8, 4)
    with comm.traffic() as outer:
        profile = profile_step(model, x, SLOTS, repeats=2, warmup=1)
    assert comm._meters == []
    per_step = sum(profile.bytes_by_op.values())
    assert per_step > 0
    assert outer.bytes == 3 * per_step  # warmup + repeats steps, all seen by the outer meter


def test_memory_flat_over_many_metered_steps():
    model, x = small_model(), torch.randn(8, 4)
    with comm.traffic() as outer:
        for _ in range(200):
            with comm.traffic():
                with comm.traffic():
                    one_step(model, x)
            assert len(comm._meters) == 1  # only the outer block is open between steps
        copies_per_step = len(outer.copies) // 200
    assert comm._meters == []
    with comm.traffic() as after:  # a new meter starts empty: nothing piled up anywhere
        one_step(model, x)
    assert len(after.copies) == copies_per_step
