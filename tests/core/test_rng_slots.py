"""Random numbers on slots that share a device: each slot draws from a state of its own.

In torch every replica sits on a GPU of its own and draws from that GPU's generator. Slots of one
device share its generator, so dpteach gives each slot its own state and lets them take turns:
a seeded run repeats bit for bit, and activation checkpointing replays each slot's own dropout
masks, so its gradient equals the same step's gradient without checkpointing.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.testing import assert_close
from torch.utils.checkpoint import checkpoint

from dpteach.data_parallel import DataParallel, step
from dpteach.parallel_apply import parallel_apply

SLOTS = ["cpu", "cpu"]


class Dropping(nn.Module):
    """Two layers with dropout between them, optionally under activation checkpointing."""

    def __init__(self, use_reentrant: bool | None = None):
        super().__init__()
        self.a, self.b, self.drop = nn.Linear(16, 64), nn.Linear(64, 4), nn.Dropout(0.5)
        self.use_reentrant = use_reentrant

    def inner(self, x):
        return self.b(self.drop(torch.relu(self.a(x))))

    def forward(self, x):
        if self.use_reentrant is None:
            return self.inner(x)
        return checkpoint(self.inner, x, use_reentrant=self.use_reentrant)


def model(use_reentrant=None) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return Dropping(use_reentrant)


def seeded_step(net: nn.Module, slots=SLOTS, seed: int = 1):
    x = torch.randn(64, 16, generator=torch.Generator().manual_seed(5), requires_grad=True)
    torch.manual_seed(seed)
    out = step(net, x, slots).out
    return out.detach(), [p.grad.clone() for p in net.parameters()], x.grad.clone()


def test_a_seeded_step_on_shared_slots_repeats_bit_for_bit():
    runs = [seeded_step(model()) for _ in range(6)]
    for out, grads, xgrad in runs[1:]:
        assert torch.equal(out, runs[0][0])  # every run drew the same masks on every slot
        assert all(torch.equal(g, g0) for g, g0 in zip(grads, runs[0][1]))
        assert torch.equal(xgrad, runs[0][2])


def test_the_slots_draw_different_masks():
    # one state for every slot would give each slot the same mask: the slots' masks must differ
    net = model()
    net.a.weight.data.fill_(0.01), net.a.bias.data.fill_(1.0)  # every row of the batch alike
    x = torch.ones(64, 16)
    torch.manual_seed(3)
    out = DataParallel(net, SLOTS)(x).detach()
    assert not torch.equal(out[:32], out[32:])


def test_the_first_slot_draws_what_one_device_draws():
    x = torch.ones(1, 16)
    torch.manual_seed(4)
    alone = model()(x)
    torch.manual_seed(4)
    [first, _] = parallel_apply([model(), model()], [(x,), (x,)], devices=SLOTS)
    assert torch.equal(first, alone)


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_checkpointing_replays_each_slots_own_dropout_mask(use_reentrant):
    out, grads, xgrad = seeded_step(model(None))
    ck_out, ck_grads, ck_xgrad = seeded_step(model(use_reentrant))
    assert torch.equal(ck_out, out)
    for g, g0 in zip(ck_grads, grads):
        assert_close(g, g0, rtol=0, atol=1e-6)
    assert_close(ck_xgrad, xgrad, rtol=0, atol=1e-6)


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_checkpointing_on_three_slots_repeats_and_matches(use_reentrant):
    out, grads, _ = seeded_step(model(None), ["cpu"] * 3)
    for _ in range(3):
        ck_out, ck_grads, _ = seeded_step(model(use_reentrant), ["cpu"] * 3)
        assert torch.equal(ck_out, out)
        for g, g0 in zip(ck_grads, grads):
            assert_close(g, g0, rtol=0, atol=1e-6)


def test_the_generator_moves_on_as_after_one_slots_forward():
    # the caller's generator ends where the first slot left it: the next step draws new masks
    torch.manual_seed(7)
    first = seeded_step(model(), seed=7)[0]
    torch.manual_seed(7)
    x = torch.randn(64, 16, generator=torch.Generator().manual_seed(5))
    net = model()
    DataParallel(net, SLOTS)(x)
    second = DataParallel(net, SLOTS)(x).detach()
    assert not torch.equal(first, second)


def test_a_failing_slot_still_leaves_the_generator_in_order():
    class Fails(nn.Module):
        def forward(self, x):
            torch.rand(3)
            raise ValueError("no")

    torch.manual_seed(9)
    with pytest.raises(ValueError):
        parallel_apply([Fails(), Fails()], [(torch.ones(1),), (torch.ones(1),)], devices=SLOTS)
    after = torch.rand(1)
    torch.manual_seed(9)
    torch.rand(3)
    assert torch.equal(after, torch.rand(1))  # the first slot's draw, then on


@pytest.mark.cuda
@pytest.mark.parametrize("use_reentrant", [None, True, False])
def test_two_slots_on_one_gpu_repeat_and_replay_their_masks(use_reentrant):
    def run(reentrant):
        net = model(reentrant).to("cuda:0")
        x = torch.randn(64, 16, generator=torch.Generator().manual_seed(5)).to("cuda:0")
        torch.manual_seed(1)  # seeds cuda:0's generator too
        step(net, x, ["cuda:0", "cuda:0"])
        return [p.grad.clone() for p in net.parameters()]

    plain = run(None)
    for g, g0 in zip(run(use_reentrant), plain):
        assert_close(g, g0, rtol=0, atol=1e-5)
