"""parallel_apply: threads, grad mode, autocast, and failures re-raised with their replica and device."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from dpteach import parallel_apply

CPU2 = ["cpu", "cpu"]


def test_parallel_apply_equals_direct_calls():
    l1, l2 = nn.Linear(10, 5), nn.Linear(10, 5)
    i1, i2 = torch.randn(2, 10), torch.randn(2, 10)
    expected = (l1(i1), l2(i2))
    for inputs in (((i1,), (i2,)), (i1, i2)):
        outputs = parallel_apply((l1, l2), inputs, None)
        for out, exp in zip(outputs, expected):
            assert_close(out, exp)  # each module on its own input, results in input order


def test_slots_of_one_device_take_turns_on_the_callers_thread():
    seen = []

    class Who(nn.Module):
        def __init__(self, k):
            super().__init__()
            self.k = k

        def forward(self, x):
            seen.append((self.k, threading.current_thread().name))
            return x

    parallel_apply([Who(0), Who(1), Who(2)], [torch.ones(1)] * 3, devices=["cpu"] * 3)
    caller = threading.current_thread().name
    assert seen == [(0, caller), (1, caller), (2, caller)]  # in slot order, no thread started


def test_distinct_devices_run_in_a_thread_each():
    seen = []

    class Who(nn.Module):
        def forward(self, x):
            seen.append((x.device.type, threading.current_thread().name))
            return x

    parallel_apply([Who(), Who(), Who()], [torch.ones(1), torch.ones(1, device="meta"), torch.ones(1)])
    assert sorted(seen) == [("cpu", "dpteach-replica-0-2")] * 2 + [("meta", "dpteach-replica-1")]


def test_parallel_apply_autocast():
    l1, l2 = nn.Linear(10, 5), nn.Linear(10, 5)
    i1, i2 = torch.randn(2, 10), torch.randn(2, 10)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        outputs = parallel_apply((l1, l2), (i1, i2), None, CPU2)
        expected = (l1(i1), l2(i2))
    for out, exp in zip(outputs, expected):
        assert out.dtype == torch.bfloat16  # autocast and its dtype reached each slot
        assert_close(out, exp)


def test_parallel_apply_carries_autocast_into_its_threads():
    """Two devices: each runs on a thread of its own, where autocast (thread-local) starts off."""
    l1, l2 = nn.Linear(10, 5), nn.Linear(10, 5, device="meta")
    i1, i2 = torch.randn(2, 10), torch.randn(2, 10, device="meta")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        on_cpu, _ = parallel_apply((l1, l2), (i1, i2), None, ["cpu", "meta"])
        expected = l1(i1)
    assert on_cpu.dtype == torch.bfloat16  # the cpu slot's thread ran under the caller's autocast
    assert_close(on_cpu, expected)


def test_parallel_apply_passes_exception():
    class TestModule(nn.Module):
        def forward(self, *args):
            return {}["wonderful"]

    l1 = TestModule()
    with pytest.raises(
        KeyError, match=r"Caught KeyError in replica \d on device cpu.\nOriginal Traceback[\s\S]+wonderful"
    ):
        parallel_apply(modules=(l1, l1), inputs=(None, None), devices=CPU2)


def test_exception_type_is_kept():
    class Bad(nn.Module):
        def forward(self, x):
            raise ValueError("shape went wrong")

    with pytest.raises(ValueError, match=r"in replica 0 on device cpu[\s\S]+shape went wrong"):
        parallel_apply([Bad(), nn.Identity()], [torch.ones(1), torch.ones(1)], devices=CPU2)


def test_no_device_and_no_tensor_is_reported():
    with pytest.raises(Exception, match="no device was provided and no tensor input was found"):
        parallel_apply([nn.Identity(), nn.Identity()], [(), ()])


def test_length_mismatch():
    with pytest.raises(AssertionError, match="number of modules 2 is not equal to the number of inputs 1"):
        parallel_apply([nn.Identity(), nn.Identity()], [torch.ones(1)])
