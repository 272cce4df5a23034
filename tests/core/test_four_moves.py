"""The four moves are written once (four_moves), and the replicas of a step are kept without patching anything."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

import dpteach
from dpteach.course import story
from dpteach.data_parallel import DataParallel, Moves, four_moves, keep_replicas

CPU2 = ["cpu", "cpu"]


def _model():
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))


def test_keep_replicas_nests_and_filters_by_owner():
    a, b = DataParallel(_model(), CPU2), DataParallel(_model(), ["cpu"] * 3)
    x = torch.randn(6, 3)
    with keep_replicas() as every, keep_replicas(a) as of_a:
        with keep_replicas(a) as inner:
            a(x)
        assert len(inner) == len(of_a) == len(every) == 2 and inner[0] is of_a[0]
        b(x)
        assert len(every) == 3 and len(of_a) == 2  # b's step reaches the catch-all block only
    assert "replicate" not in vars(a)  # nothing was patched on the instance


def test_keep_replicas_is_per_thread():
    dp = DataParallel(_model(), CPU2)
    seen = {}

    def other():
        with keep_replicas(dp) as kept:
            seen["other"] = kept
            dp(torch.randn(4, 3))

    with keep_replicas(dp) as mine:
        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert mine == [] and len(seen["other"]) == 2


def test_a_subclass_that_overrides_a_move_is_obeyed():
    calls = []

    class Logged(DataParallel):
        def gather(self, outputs, output_device):
            calls.append(len(outputs))
            return super().gather(outputs, output_device)

    Logged(_model(), CPU2)(torch.randn(4, 3))
    assert calls == [2]


def test_the_strategy_is_checked_at_construction_and_read_on_each_step():
    with pytest.raises(ValueError, match="unknown strategy 'rewried'"):
        DataParallel(_model(), CPU2, strategy="rewried")
    dp = DataParallel(_model(), CPU2, strategy="clone")
    dp(torch.randn(4, 3)).sum().backward()
    assert all(p.grad is None for p in dp.module.parameters())  # clone's bug: nothing reaches the module
    dp.strategy = "rewire"  # a plain attribute, read by the next step
    dp(torch.randn(4, 3)).sum().backward()
    assert all(p.grad is not None for p in dp.module.parameters())


def test_four_moves_is_what_data_parallel_runs():
    model, x = _model(), torch.randn(5, 3)
    moves = Moves(model, CPU2, strategy="broadcast")
    with keep_replicas(moves) as kept:
        out = four_moves(moves, (x,), {})
    torch.testing.assert_close(out, model(x))
    torch.testing.assert_close(dpteach.data_parallel(model, x, CPU2), out)
    assert len(kept) == 2
    with keep_replicas(moves) as one:
        four_moves(Moves(model, ["cpu"]), (x,), {}, run_one_slot=False)
    assert one == []  # another Moves: not this block's


def test_story_one_step_keeps_its_replicas():
    report = story.one_step("clone", CPU2)
    assert report.missing and len(report.replica_grads) == 2
    assert story.one_step("rewire", CPU2).matches


def test_model_builders_leave_the_global_random_state_alone():
    from dpteach.distributed.model import make_model as deep_model
    from dpteach.widgets.cost import wide_model

    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    story.make_model(), deep_model(8, depth=3), wide_model(8)
    assert torch.equal(torch.random.get_rng_state(), before)
    assert torch.equal(
        story.make_model(1)[0].weight, story.make_model(1)[0].weight
    )  # still the same per seed


def test_one_name_one_meaning():
    from dpteach.measure import bench, costs, profile, timer
    from dpteach.widgets import cost

    assert isinstance(timer.time_it(lambda: None, repeats=2, warmup=0).median, float)
    assert not [
        m
        for m in (profile, costs, bench, cost)
        for n in ("median_time", "median_seconds", "median_times", "_timed_steps", "Timer")
        if hasattr(m, n)
    ]
    assert not hasattr(cost, "n_params") and cost.width_numel(8) == bench.n_params(cost.wide_model(8))
    assert not hasattr(bench, "clone_then_to") and callable(costs.clone_then_to)
    assert not hasattr(dpteach._devices, "describe")
