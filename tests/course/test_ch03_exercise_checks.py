"""Chapter 03's Exercise 2 check: step 3's loop given replica 1 alone, so the original gets replica 1's
share only; each wrong answer a learner is likely to give is told what to change."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import dpteach
from dpteach.course import checks, story

pytestmark = pytest.mark.usefixtures("fresh_checks")


@pytest.fixture
def fresh_checks():
    checks.reset()
    yield
    checks.reset()


def per_replica_of(model, devices):
    """The chapter's sum section: what reaches each replica's copy of 0.weight under "rewire"."""
    x, y = story.make_data()
    replicas = dpteach.replicate(model, devices, strategy="rewire")
    outputs = dpteach.parallel_apply(replicas, [(p,) for p in dpteach.scatter(x, devices)], devices=devices)
    loss = nn.functional.mse_loss(dpteach.gather(outputs, devices[0]), y.to(devices[0]))
    return torch.autograd.grad(loss, [r[0].weight for r in replicas])


@pytest.mark.parametrize("slots", [2, 3])
def test_the_original_gets_replica_1s_share_alone(slots):
    devices = ["cpu"] * slots
    model = story.make_model()
    per_replica = per_replica_of(model, devices)
    assert checks.one_replica_rewired(per_replica[1], model, devices).ok
    assert model[0].weight.grad is None  # the check runs its own step and leaves the model's .grad alone


def test_the_check_agrees_with_the_chapters_cell():
    """The exercise's cell: rewire(fresh, [replicas[1]]) by hand, then backward into fresh's .grad."""
    from dpteach.replicate import ReduceAdd

    devices = ["cpu", "cpu"]
    fresh = story.make_model()
    replicas = dpteach.replicate(fresh, devices, strategy="clone")
    for name, original in fresh.named_parameters():
        module_name, _, key = name.rpartition(".")
        twin = replicas[1].get_submodule(module_name)
        (out,) = ReduceAdd.apply(original, twin._parameters[key].detach())
        del twin._parameters[key]
        setattr(twin, key, out)
    x, y = story.make_data()
    outputs = dpteach.parallel_apply(replicas, [(p,) for p in dpteach.scatter(x, devices)], devices=devices)
    nn.functional.mse_loss(dpteach.gather(outputs, "cpu"), y).backward()
    per_replica = per_replica_of(story.make_model(), devices)
    assert torch.allclose(fresh[0].weight.grad, per_replica[1])
    assert not torch.allclose(fresh[0].weight.grad, (per_replica[0] + per_replica[1]) / 2, rtol=1e-3)
    assert checks.one_replica_rewired(fresh[0].weight.grad.clone(), fresh, devices).ok


def test_each_likely_wrong_answer_is_told_what_to_change():
    devices = ["cpu", "cpu"]
    model = story.make_model()
    g0, g1 = per_replica_of(model, devices)
    said = {
        "none": checks.one_replica_rewired(None, model, devices),
        "sum": checks.one_replica_rewired(g0 + g1, model, devices),
        "replica 0": checks.one_replica_rewired(g0, model, devices),
        "half": checks.one_replica_rewired((g0 + g1) / 2, model, devices),
    }
    assert not any(v.ok for v in said.values())
    assert ".grad does fill" in said["none"].message and "Hint 1 of 2" in said["none"].message
    assert "one-device gradient" in said["sum"].message and "still" in said["sum"].message
    assert "still a leaf" in said["replica 0"].message
    assert "neither averages nor scales" in said["half"].message
    assert "The answer: grad_0_weight = per_replica[1]" in said["half"].message  # from the third failed try
    assert checks.one_replica_rewired(g1, model, devices).ok
    again = checks.one_replica_rewired(2 * g1, model, devices)
    assert (
        "Drop the factor" in again.message and "Hint 1 of 2" in again.message
    )  # a success resets the ladder


def test_an_answer_of_the_wrong_kind_costs_no_hint():
    devices = ["cpu", "cpu"]
    model = story.make_model()
    assert checks.one_replica_rewired(..., model, devices).message.startswith("Set `grad_0_weight`")
    assert "give a tensor" in checks.one_replica_rewired("per_replica[1]", model, devices).message
    assert "has shape (3,)" in checks.one_replica_rewired(torch.zeros(3), model, devices).message
    assert not checks._failures
