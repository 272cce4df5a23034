"""dpteach.measure.timer, the one timer: medians after warm-up, in turns, within a budget, one thread per CPU slot."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import dpteach
from dpteach.measure import timer


def test_warm_up_calls_are_not_timed_and_the_median_is_the_middle_sample():
    calls = []
    timing = timer.time_it(lambda: calls.append(1), repeats=5, warmup=2)
    assert len(calls) == 7 and len(timing.samples) == 5
    assert timer.Timing([3.0, 1.0, 2.0]).median == 2.0
    assert "median of 3" in repr(timer.Timing([3.0, 1.0, 2.0]))
    with pytest.raises(ValueError, match="at least 1"):
        timer.time_it(lambda: None, repeats=0)


def test_compared_functions_are_timed_in_turns():
    order = []
    fns = {"a": lambda: order.append("a"), "b": lambda: order.append("b")}
    out = timer.time_in_turns(fns, repeats=3, warmup=1)
    assert order == ["a", "b"] * 4 and {k: len(t.samples) for k, t in out.items()} == {"a": 3, "b": 3}


def test_a_budget_stops_early_but_after_one_round():
    calls = []
    fns = {"slow": lambda: calls.append(sum(range(200_000)))}
    out = timer.time_in_turns(fns, repeats=50, warmup=0, budget_s=0.0)
    assert len(out["slow"].samples) == 1 and len(calls) == 1


def test_cpu_slots_time_with_one_thread_each_and_the_setting_comes_back():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seen = []
        timer.time_it(lambda: seen.append(torch.get_num_threads()), ["cpu", "cpu"], repeats=2, warmup=1)
        assert seen == [1, 1, 1] and torch.get_num_threads() == 2
        with pytest.raises(KeyError), timer.threads_per_slot(["cpu"]):
            raise KeyError("restored even after an error")
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


class _Threads(nn.Module):
    """Records the intra-op thread count each replica sees in its parallel_apply worker thread."""

    seen: list = []

    def forward(self, x):
        _Threads.seen.append(torch.get_num_threads())
        return x * 1


def test_parallel_apply_workers_inherit_the_timers_single_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    try:
        _Threads.seen = []
        dp = dpteach.DataParallel(_Threads(), ["cpu", "cpu"])
        dp(torch.randn(4, 2))
        # without the timer: the slots take turns, each with its share of the learner's 4 threads
        assert _Threads.seen == [2, 2]
        _Threads.seen = []
        timer.time_it(lambda: dp(torch.randn(4, 2)), ["cpu", "cpu"], repeats=1, warmup=0)
        assert _Threads.seen == [1, 1]  # each slot's worker thread starts its team from the timer's setting
    finally:
        torch.set_num_threads(before)


def test_threads_none_leaves_pytorchs_setting_for_a_learner_who_wants_every_core():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seen = []
        timer.time_it(
            lambda: seen.append(torch.get_num_threads()), ["cpu"], repeats=1, warmup=0, threads=None
        )
        assert seen == [2]
    finally:
        torch.set_num_threads(before)
