"""Inference mode is carried into the replicas' threads, like grad mode and autocast.

A new thread starts outside inference mode; a replica's buffers made under it are inference
tensors, and a train-mode BatchNorm updating them outside inference mode fails inside torch.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from dpteach.data_parallel import DataParallel
from dpteach.parallel_apply import parallel_apply


def net() -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))


@pytest.mark.parametrize("slots", [["cpu", "cpu"], ["cpu"] * 3])
def test_train_mode_batchnorm_under_inference_mode_works_as_on_one_device(slots):
    x = torch.randn(12, 6)
    pieces = x.chunk(len(slots))
    alone, dp = [net() for _ in pieces], net()
    with torch.inference_mode():
        # train-mode BatchNorm normalises each slot's piece by that piece's statistics: one device,
        # run piece by piece, is the reference
        want = torch.cat([m(p) for m, p in zip(alone, pieces)])
        got = DataParallel(dp, slots)(x)
    assert got.is_inference()
    assert_close(got, want)
    # slot 0 shares the module's buffers, so its update reaches the module, as in torch
    assert_close(dp[1].running_mean, alone[0][1].running_mean)
    assert_close(dp[1].running_var, alone[0][1].running_var)
    assert dp[1].num_batches_tracked.item() == 1


def test_each_thread_runs_in_the_callers_inference_mode():
    class Reports(nn.Module):
        def forward(self, x):
            return torch.tensor([torch.is_inference_mode_enabled(), torch.is_grad_enabled()])

    m = [Reports(), Reports()]
    with torch.inference_mode():
        assert [t.tolist() for t in parallel_apply(m, [(1,), (2,)], devices=["cpu", "cpu"])] == [
            [True, False]
        ] * 2
    assert [t.tolist() for t in parallel_apply(m, [(1,), (2,)], devices=["cpu", "cpu"])] == [
        [False, True]
    ] * 2
