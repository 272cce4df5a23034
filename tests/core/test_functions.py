"""The autograd functions: gradients, double backward, frozen inputs (PyTorch's test_nn.py Broadcast tests)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck
from torch.testing import assert_close

from dpteach.functions import Broadcast, Gather, ReduceAddCoalesced, Scatter

CPU2 = ["cpu", "cpu"]


def test_broadcast_double_backwards():
    inputs = tuple(torch.randn(4, 4, dtype=torch.double, requires_grad=True) for _ in range(3))
    assert gradcheck(
        lambda *i: Broadcast.apply(CPU2, *i), inputs, check_batched_grad=False
    )  # first derivative
    assert gradgradcheck(lambda *i: Broadcast.apply(CPU2, *i), inputs, check_batched_grad=False)  # second


def test_reduce_add_coalesced_double_backwards():
    grads = tuple(torch.randn(3, dtype=torch.double, requires_grad=True) for _ in range(4))
    f = lambda *g: ReduceAddCoalesced.apply(torch.device("cpu"), 2, *g)  # noqa: E731
    assert gradcheck(f, grads, check_batched_grad=False)
    assert gradgradcheck(f, grads, check_batched_grad=False)


def test_broadcast_not_requiring_grad():
    flags = [True, False, False, True, True]
    inputs = [torch.randn(2, requires_grad=f) for f in flags]
    outputs = Broadcast.apply(CPU2, *inputs)
    for i, out in enumerate(outputs):
        assert (
            out.requires_grad == flags[i % len(flags)]
        )  # a frozen input gives copies that never ask for grad


def test_broadcast_no_grad():
    x = torch.randn(3, requires_grad=True)
    with torch.no_grad():
        outs = Broadcast.apply(CPU2, x)
    assert not any(o.requires_grad for o in outs)  # no graph under no_grad
    assert x.requires_grad  # ... and the input is left as it was (#5851)


def test_broadcast_slot0_shares_storage():
    x = torch.randn(3, requires_grad=True)
    a, b = Broadcast.apply(CPU2, x)
    assert a.data_ptr() == x.data_ptr() and b.data_ptr() != x.data_ptr()  # slot 0 aliases, slot 1 owns


def test_broadcast_backward_sums_slots():
    x = torch.randn(3, requires_grad=True)
    a, b = Broadcast.apply(["cpu"] * 3, x)[:2]
    (2 * a + 3 * b).sum().backward()
    assert_close(x.grad, torch.full((3,), 5.0))  # gradients of all slots add up on the source


def test_scatter_gather_grad_and_gradgrad():
    x = torch.randn(4, 4, dtype=torch.double, requires_grad=True)
    assert gradcheck(lambda t: Scatter.apply(CPU2, None, 0, t), (x,), check_batched_grad=False)
    assert gradgradcheck(lambda t: Scatter.apply(CPU2, None, 0, t), (x,), check_batched_grad=False)
    a = torch.randn(2, 4, dtype=torch.double, requires_grad=True)
    b = torch.randn(2, 4, dtype=torch.double, requires_grad=True)
    assert gradcheck(lambda p, q: Gather.apply("cpu", 0, p, q), (a, b), check_batched_grad=False)
    assert gradgradcheck(lambda p, q: Gather.apply("cpu", 0, p, q), (a, b), check_batched_grad=False)


def test_scatter_backward_fills_only_own_rows():
    x = torch.randn(4, 4, requires_grad=True)
    first, _ = Scatter.apply(CPU2, None, 0, x)
    first.backward(torch.full_like(first, 2.0))
    assert_close(x.grad[:2], torch.full((2, 4), 2.0))  # the first piece's rows get its gradient
    assert_close(x.grad[2:], torch.zeros(2, 4))  # the other rows get none


def test_gather_scalars_become_a_vector_with_a_warning():
    a = torch.tensor(1.0, requires_grad=True)
    b = torch.tensor(2.0, requires_grad=True)
    with pytest.warns(UserWarning, match="all input tensors were scalars"):
        out = Gather.apply("cpu", 0, a, b)
    assert out.shape == (2,)  # one entry per slot
    out.backward(torch.tensor([3.0, 4.0]))
    assert a.grad.item() == 3.0 and b.grad.item() == 4.0  # each scalar gets its own entry's gradient


def test_gather_scalars_along_another_dim_is_an_error():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(IndexError):
            Gather.apply("cpu", 1, torch.tensor(1.0), torch.tensor(2.0))
