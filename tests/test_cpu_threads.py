"""CPU slots share the cores: each replica's thread runs a share of the learner's intra-op threads.

By default a thread running a large operation starts a team of ``torch.get_num_threads()`` threads;
k CPU slots would start k such teams on the same cores. The learner's setting is back after the step.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpteach.data_parallel import DataParallel
from dpteach.parallel_apply import parallel_apply


class Reports(nn.Module):
    """Runs one operation large enough for a thread team, and says how many threads its thread may use."""

    def forward(self, x):
        torch.randn(200_000).sum()
        return torch.tensor([torch.get_num_threads()])


@pytest.fixture
def four_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("slots, share", [(2, 2), (3, 1), (4, 1), (5, 1)])
def test_each_cpu_slot_gets_a_share_of_the_threads(four_threads, slots, share):
    out = parallel_apply([Reports()] * slots, [(1,)] * slots, devices=["cpu"] * slots)
    assert [t.item() for t in out] == [share] * slots
    assert torch.get_num_threads() == 4  # the learner's setting, as it was


def test_one_slot_keeps_the_learners_threads(four_threads):
    assert parallel_apply([Reports()], [(1,)], devices=["cpu"])[0].item() == 4


def test_the_setting_is_restored_after_a_failing_replica(four_threads):
    class Fails(nn.Module):
        def forward(self, x):
            raise ValueError("no")

    with pytest.raises(ValueError):
        parallel_apply([Fails(), Fails()], [(1,), (1,)], devices=["cpu", "cpu"])
    assert torch.get_num_threads() == 4


def test_a_training_step_leaves_the_threads_as_they_were(four_threads):
    net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    DataParallel(net, ["cpu"] * 3)(torch.randn(12, 64)).sum().backward()
    assert torch.get_num_threads() == 4
