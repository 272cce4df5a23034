"""The reference is always the same model on one device: after SGD steps, parameters and gradients match.

Includes the regression test of PR #20910 (test/cpp/api/parallel.cpp, DataParallelNumericalEquivalence)
and a property-based test over random small MLPs and CNNs, batch sizes and 1 to 4 slots.
"""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.testing import assert_close

import dpteach
from dpteach.replicate import FIXED as FIXED_STRATEGIES

FIXED = list(FIXED_STRATEGIES)


class M(nn.Module):
    """The model of DataParallelNumericalEquivalence in test/cpp/api/parallel.cpp."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 2, kernel_size=2)
        self.fc = nn.Linear(8, 2)

    def forward(self, x):
        x = torch.relu(self.conv(x)).view(-1, 8)
        return torch.log_softmax(self.fc(x), dim=1)


@pytest.mark.parametrize("strategy", FIXED)
def test_numerical_equivalence_over_three_steps(strategy):
    model = M()
    model_dp = copy.deepcopy(model)
    dp = dpteach.DataParallel(model_dp, ["cpu", "cpu"], strategy=strategy)
    x = torch.ones(16, 2, 3, 3)
    for i in range(3):
        x = x + i
        for net, params in ((model, model.parameters()), (dp, model_dp.parameters())):
            opt = torch.optim.SGD(params, lr=0.1)
            opt.zero_grad()
            out = net(x)
            nn.functional.mse_loss(out, torch.zeros_like(out)).backward()
            opt.step()
        for p, q in zip(model.parameters(), model_dp.parameters()):
            assert_close(q, p)  # after every step the DataParallel model equals the one-device model


def test_clone_never_moves_the_original():
    model = M()
    before = copy.deepcopy(model.state_dict())
    dp = dpteach.DataParallel(model, ["cpu", "cpu"], strategy="clone")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        out = dp(torch.randn(16, 2, 3, 3))
        nn.functional.mse_loss(out, torch.zeros_like(out)).backward()
        opt.step()
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])  # issue #19540: training under clone leaves every weight as it was


def test_batchnorm_running_stats_differ_by_strategy():
    x = torch.randn(8, 4) * 3 + 1
    ref = nn.BatchNorm1d(4)
    ref(x[:4])  # slot 0 sees the first half of the batch
    for strategy, kept in (("broadcast", True), ("rewire", False), ("clone", False)):
        bn = nn.BatchNorm1d(4)
        dpteach.DataParallel(bn, ["cpu", "cpu"], strategy=strategy)(x)
        if kept:
            assert_close(bn.running_mean, ref.running_mean)  # slot 0's in-place update reached the module
        else:
            assert_close(bn.running_mean, torch.zeros(4))  # deep-copied buffers: the update is lost (#21144)


def test_hessian_vector_product_through_broadcast():
    model = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 1))
    ref = copy.deepcopy(model)
    x = torch.randn(8, 3)
    v = [torch.randn_like(p) for p in model.parameters()]

    def hvp(net, params):
        loss = net(x).pow(2).mean()
        grads = torch.autograd.grad(loss, params, create_graph=True)
        return torch.autograd.grad(sum((g * u).sum() for g, u in zip(grads, v)), params)

    expected = hvp(ref, list(ref.parameters()))
    got = hvp(dpteach.DataParallel(model, ["cpu", "cpu"]), list(model.parameters()))
    for g, e in zip(got, expected):
        assert_close(g, e)  # double backward through Broadcast/ReduceAddCoalesced equals one device


def _mlp(sizes):
    layers = []
    for a, b in zip(sizes, sizes[1:]):
        layers += [nn.Linear(a, b), nn.Tanh()]
    return nn.Sequential(*layers[:-1])


def _cnn(channels, kernel):
    return nn.Sequential(nn.Conv2d(1, channels, kernel), nn.ReLU(), nn.Flatten(), nn.LazyLinear(3))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from(["mlp", "cnn"]),
    widths=st.lists(st.integers(1, 9), min_size=2, max_size=4),
    channels=st.integers(1, 4),
    kernel=st.integers(1, 3),
    batch=st.integers(1, 12),
    n_slots=st.integers(1, 4),
    strategy=st.sampled_from(list(dpteach.STRATEGIES)),
)
def test_gradient_parity_property(kind, widths, channels, kernel, batch, n_slots, strategy):
    torch.manual_seed(batch * 7 + n_slots)
    if kind == "mlp":
        model = _mlp(widths)
        x = torch.randn(batch, widths[0])
    else:
        model = _cnn(channels, kernel)
        x = torch.randn(batch, 1, 5, 5)
        model(x[:1])  # initialise the lazy layer
    ref = copy.deepcopy(model)
    ref(x).pow(2).sum().backward()
    dpteach.DataParallel(model, ["cpu"] * n_slots, strategy=strategy)(x).pow(2).sum().backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        if strategy == "clone" and n_slots > 1:  # (one slot runs the module itself, as in C++ and PyTorch)
            assert (
                p.grad is None
            )  # the clone bug: gradients never reach the original, however many pieces ran
        else:
            assert p.grad is not None
            assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4)  # the same gradient as one device
