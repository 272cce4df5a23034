"""A learner's own autograd node runs inside the library's strategies (node=, broadcast=), and nothing else does.

The classes below are written the way chapter 03 and chapter 07 (and the exercise stubs) ask a
learner to write them, with ``ReduceAdd.apply(original, *copies)`` and
``Broadcast.apply(devices, *inputs)``; they are run through the real ``"rewire"`` and
``"broadcast"`` strategies and must give one device's gradients.
"""

from __future__ import annotations

import inspect
import re

import pytest
import torch
from torch import nn
from torch.autograd import Function

import dpteach
from dpteach import comm
from dpteach.exercises import broadcast_with, rewire_with, stubs
from dpteach.replicate import broadcast as broadcast_strategy
from dpteach.replicate import clone as clone_strategy
from dpteach.replicate import rewire as rewire_strategy

CPU2 = ["cpu", "cpu"]


class LearnerReduceAdd(Function):
    calls = 0

    @staticmethod
    def forward(ctx, original, *copies):
        LearnerReduceAdd.calls += 1
        ctx.destination = original.device
        return tuple(c.detach() for c in copies)

    @staticmethod
    def backward(ctx, *grads):
        total = sum(g.to(ctx.destination) for g in grads)
        return (total,) + (None,) * len(grads)


class LearnerBroadcast(Function):
    calls = 0

    @staticmethod
    def forward(ctx, devices, *inputs):
        LearnerBroadcast.calls += 1
        ctx.input_device = inputs[0].device
        ctx.num_inputs = len(inputs)
        per_slot = comm.broadcast_coalesced(inputs, devices)
        return tuple(t for slot in per_slot for t in slot)

    @staticmethod
    def backward(ctx, *grads):
        return (None,) + LearnerReduceAddCoalesced.apply(ctx.input_device, ctx.num_inputs, *grads)


class LearnerReduceAddCoalesced(Function):
    @staticmethod
    def forward(ctx, destination, num_inputs, *grads):
        ctx.devices = [grads[i].device for i in range(0, len(grads), num_inputs)]
        groups = [grads[i : i + num_inputs] for i in range(0, len(grads), num_inputs)]
        return tuple(comm.reduce_add_coalesced(groups, destination))

    @staticmethod
    def backward(ctx, *grads):
        return (None, None) + LearnerBroadcast.apply(ctx.devices, *grads)


def _model():
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 2))


def _grads(strategy, slots):
    model = _model()
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
    out = dpteach.DataParallel(model, slots, strategy=strategy)(x)
    out.pow(2).mean().backward()
    return {k: p.grad for k, p in model.named_parameters()}


def _reference():
    model = _model()
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
    # BatchNorm normalises each slot's half of the batch: the reference is two halves' mean
    halves = [model(h).pow(2).sum() for h in x.chunk(2)]
    (sum(halves) / x.numel() * 4 / 2).backward()
    return {k: p.grad for k, p in model.named_parameters()}


@pytest.mark.parametrize("which", ["rewire", "broadcast"])
def test_a_learners_node_runs_inside_the_real_strategy(which):
    if which == "rewire":
        LearnerReduceAdd.calls = 0

        def strategy(net, devs, detach=False):
            return rewire_strategy.replicate(net, devs, detach, node=LearnerReduceAdd)
    else:
        LearnerBroadcast.calls = 0

        def strategy(net, devs, detach=False):
            return broadcast_strategy.replicate(net, devs, detach, broadcast=LearnerBroadcast)

    got = _grads(strategy, CPU2)
    want = _grads(which, CPU2)  # the library's own node, the same strategy
    ref = _reference()
    for k in ref:
        assert got[k] is not None, k
        torch.testing.assert_close(got[k], want[k])
        torch.testing.assert_close(got[k], ref[k], rtol=1e-4, atol=1e-6)
    if which == "rewire":
        assert LearnerReduceAdd.calls == len(
            ref
        )  # one node per original parameter, all of them the learner's
    else:
        assert LearnerBroadcast.calls == 1  # one node for every parameter (buffers need no grad)


def test_the_exercise_wrappers_are_the_strategies_themselves():
    """rewire_with / broadcast_with run the library code: buffers are handled as the strategy handles them."""
    model = _model()
    mine = rewire_with(LearnerReduceAdd)(model, [torch.device("cpu")] * 2)
    lib = dpteach.replicate(model, CPU2, strategy="rewire")
    for a, b in zip(mine, lib):
        assert [n for n, _ in a.named_buffers()] == [n for n, _ in b.named_buffers()]
    for j, replica in enumerate(broadcast_with(LearnerBroadcast)(model, [torch.device("cpu")] * 2)):
        same = replica[1].running_mean.data_ptr() == model[1].running_mean.data_ptr()
        assert same == (j == 0)  # slot 0 shares the original's buffers, as the library strategy does
    assert type(mine[0][0].weight.grad_fn).__name__.startswith("LearnerReduceAdd")


def test_a_node_that_returns_the_wrong_count_is_named():
    class Short(LearnerReduceAdd):
        @staticmethod
        def forward(ctx, original, *copies):
            return copies[0].detach()

    with pytest.raises(ValueError, match=r"Short\.apply\(original, \*copies\) got 2 copies but returned 1"):
        rewire_strategy.replicate(_model(), [torch.device("cpu")] * 2, node=Short)


def test_one_reduce_add_signature_everywhere():
    """The library's ReduceAdd, the stub and the solution all take (ctx, original, *copies)."""
    from dpteach.exercises import solutions

    for cls in (rewire_strategy.ReduceAdd, stubs.MyReduceAdd, solutions.MyReduceAdd):
        assert str(inspect.signature(cls.forward)) == "(ctx, original, *copies)", cls


def test_task1_stub_shows_the_line_clone_py_runs():
    stub = inspect.getsource(stubs.replicate_by_clone)
    shown = re.search(r"# BROKEN \(#19540\).*\n\s*# (copy = .*)\n", stub).group(1).strip()
    source = inspect.getsource(clone_strategy).splitlines()
    at = [i for i, line in enumerate(source) if line.strip() == shown]
    assert at, f"clone.py does not run {shown!r}"
    assert "# BROKEN (#19540)" in source[at[0] - 1]


def test_one_registry_in_history_order():
    from dpteach.replicate import FIXED
    from dpteach.widgets.training import STRATEGIES as DROPDOWN

    assert list(dpteach.STRATEGIES) == ["clone", "rewire", "broadcast"]  # #19540, #20910, replicate.py
    assert DROPDOWN == tuple(dpteach.STRATEGIES)
    assert set(FIXED) < set(dpteach.STRATEGIES)
    for name, fn in dpteach.STRATEGIES.items():
        assert fn.__module__ == f"dpteach.replicate.{name}"


class _Tied(nn.Module):
    """Two layers sharing one weight, and a BatchNorm: every column of replicate's "what differs" table."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(3, 3, bias=False)
        self.b = nn.Linear(3, 3, bias=False)
        self.b.weight = self.a.weight
        self.bn = nn.BatchNorm1d(3)

    def forward(self, x):
        return self.bn(self.b(torch.tanh(self.a(x))))


def _row(strategy):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model, x = _Tied(), torch.randn(8, 3)
    replicas = dpteach.replicate(model, CPU2, strategy=strategy)
    leaf = replicas[1].a.weight.is_leaf
    shared = replicas[0].bn.running_mean.data_ptr() == model.bn.running_mean.data_ptr()
    tied = replicas[1].a.weight is replicas[1].b.weight
    # nodes the tied weight's copies come out of: one per distinct original tensor (C++ made one per registration)
    nodes = len(
        {id(w.grad_fn) for w in (replicas[1].a.weight, replicas[1].b.weight) if w.grad_fn is not None}
    )
    out = dpteach.DataParallel(model, CPU2, strategy=strategy)(x)
    try:
        (g,) = torch.autograd.grad(out.pow(2).sum(), [model.a.weight], create_graph=True, allow_unused=True)
        if g is None:
            double = "nothing reaches"
        else:
            g.pow(2).sum().backward()
            double = "works" if model.a.weight.grad is not None else "no second gradient"
    except RuntimeError as err:
        double = "refused by ReduceAdd" if "ReduceAdd" in str(err) else str(err)
    return leaf, shared, tied, nodes, double


def test_what_differs_table():
    """Each cell of the table in dpteach/replicate/__init__.py's docstring, computed."""
    assert _row("clone") == (True, False, False, 0, "nothing reaches")
    assert _row("rewire") == (False, False, False, 1, "refused by ReduceAdd")
    assert _row("broadcast") == (False, True, True, 1, "works")
    import sys

    package_doc = sys.modules["dpteach.replicate"].__doc__  # the table sits in the package docstring
    assert "What differs" in package_doc and "double backward" in package_doc


def test_every_strategy_marks_its_lines():
    marks = {
        clone_strategy: ["# BROKEN (#19540)", "# BROKEN (#21144)"],
        rewire_strategy: ["# FIX (#20910)", "# BROKEN (#21144)"],
        broadcast_strategy: ["# EDGE (Broadcast)", "# SLOT 0 SHARES"],
    }
    for module, wanted in marks.items():
        source = inspect.getsource(module)
        for mark in wanted:
            assert mark in source, (module.__name__, mark)


def test_the_librarys_own_nodes_pass_the_exercise_checks():
    """Chapter 03's ReduceAdd and chapter 04's Broadcast pair, pasted into Tasks 2 and 3, are correct answers."""
    from dpteach import exercises
    from dpteach.functions import Broadcast, ReduceAddCoalesced

    assert exercises.check_rewire(rewire_strategy.ReduceAdd).passed
    assert exercises.check_broadcast_pair(Broadcast, ReduceAddCoalesced).passed
