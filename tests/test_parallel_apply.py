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


def test_parallel_apply_runs_in_threads():
    seen = []

    class Who(nn.Module):
        def forward(self, x):
            seen.append(threading.current_thread().name)
            return x

    parallel_apply([Who(), Who()], [torch.ones(1), torch.ones(1)], devices=CPU2)
    assert sorted(seen) == ["dpteach-replica-0", "dpteach-replica-1"]  # one worker thread per replica


def test_parallel_apply_autocast():
    l1, l2 = nn.Linear(10, 5), nn.Linear(10, 5)
    i1, i2 = torch.randn(2, 10), torch.randn(2, 10)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        outputs = parallel_apply((l1, l2), (i1, i2), None, CPU2)
        expected = (l1(i1), l2(i2))
    for out, exp in zip(outputs, expected):
        assert out.dtype == torch.bfloat16  # autocast and its dtype reached each thread
        assert_close(out, exp)


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
