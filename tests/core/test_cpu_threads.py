"""CPU slots never run two intra-op thread teams on the same cores at once.

By default a thread running a large operation starts a team of ``torch.get_num_threads()`` threads;
k CPU slots running at once would start k such teams on the same cores. Slots of one device take
turns (their forwards share the device's one random generator, see ``test_rng_slots.py``), so no
two forwards overlap, and each runs with its share of the learner's thread count (4 threads over 2
slots: 2 each; over 3 or 4 slots: 1). The learner's setting is the same after the step.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch
from torch import nn

from dpteach.data_parallel import DataParallel
from dpteach.parallel_apply import parallel_apply


class Reports(nn.Module):
    """Runs one operation large enough for a thread team; records when it ran and with how many threads."""

    spans: list = []
    lock = threading.Lock()

    def forward(self, x):
        start = time.perf_counter()
        torch.randn(200_000).sum()
        time.sleep(0.01)  # long enough that two forwards at once would overlap
        with Reports.lock:
            Reports.spans.append((start, time.perf_counter()))
        return torch.tensor([torch.get_num_threads()])


@pytest.fixture
def four_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    Reports.spans = []
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("slots", [2, 3, 4])
def test_cpu_slots_take_turns_each_with_its_share_of_the_threads(four_threads, slots):
    out = parallel_apply([Reports()] * slots, [(1,)] * slots, devices=["cpu"] * slots)
    assert [t.item() for t in out] == [max(1, 4 // slots)] * slots  # the learner's 4, shared
    spans = sorted(Reports.spans)
    assert len(spans) == slots
    assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:]))  # no two forwards overlapped
    assert torch.get_num_threads() == 4  # the learner's setting, as it was


def test_the_setting_is_kept_after_a_failing_replica(four_threads):
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


def test_one_slot_and_other_devices_keep_the_learners_threads(four_threads):
    (out,) = parallel_apply([Reports()], [(1,)], devices=["cpu"])
    assert out.item() == 4
    out = parallel_apply([Reports(), Reports()], [(1,), (1,)], devices=["cpu", "meta"])
    assert [t.item() for t in out] == [4, 4]  # a thread per device, each with the learner's setting


def test_step_runs_the_backward_with_the_share_too(four_threads):
    from dpteach.data_parallel import step

    seen = []
    net = nn.Linear(8, 1)
    net.weight.register_hook(lambda g: seen.append(torch.get_num_threads()))
    step(net, torch.randn(6, 8), ["cpu"] * 4)
    assert seen == [1]  # the hook on the original's weight runs once, inside the backward
    assert torch.get_num_threads() == 4
