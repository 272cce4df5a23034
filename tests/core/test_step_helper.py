"""The one step helper of the core: four moves, loss, backward, replicas kept."""

import torch
from torch import nn

from dpteach.data_parallel import mean_square, step


def test_step_matches_one_device_and_keeps_replicas():
    torch.manual_seed(0)
    model, x = nn.Linear(4, 3), torch.randn(6, 4)
    ref = nn.Linear(4, 3)
    ref.load_state_dict(model.state_dict())
    mean_square(ref(x)).backward()
    s = step(model, x, ["cpu", "cpu"], strategy="rewire")
    assert len(s.replicas) == 2  # one replica per slot, kept for a look
    torch.testing.assert_close(s.out, ref(x))  # forward went well
    torch.testing.assert_close(model.weight.grad, ref.weight.grad)  # backward reached the original


def test_step_without_backward_and_one_slot():
    model, x = nn.Linear(4, 3), torch.randn(6, 4)
    s = step(model, x, ["cpu"], backward=False)
    assert len(s.replicas) == 1 and model.weight.grad is None and s.loss.requires_grad
    s = step(model, x, ["cpu"], replicate_one_slot=False, loss_fn=None)
    assert s.replicas == [] and s.loss is None


def test_clone_leaves_the_original_without_gradients():
    model, x = nn.Linear(4, 3), torch.randn(6, 4)
    s = step(model, x, ["cpu", "cpu"], strategy="clone")
    assert model.weight.grad is None  # the bug of #19540: the gradient stops in the replicas
    assert all(r.weight.grad is not None for r in s.replicas)
