"""replicate() under each strategy: what each one is, and every documented difference between them."""

from __future__ import annotations

import io

import pytest
import torch
from torch import nn
from torch.testing import assert_close

import dpteach
from dpteach import replicate
from dpteach.replicate import STRATEGIES as REGISTRY

STRATEGIES = list(REGISTRY)

CPU2 = ["cpu", "cpu"]


def mlp():
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_replicas_compute_what_the_module_computes(strategy):
    model, x = mlp(), torch.randn(5, 4)
    for replica in replicate(model, ["cpu"] * 3, strategy=strategy):
        assert_close(replica(x), model(x))  # every replica is the same function


@pytest.mark.parametrize("devices", [("cpu", "cpu"), ["cpu", "cpu"], [torch.device("cpu")] * 2])
def test_device_lists_as_tuple_list_and_device_objects(devices):
    model = nn.Linear(10, 5)
    replicas = replicate(model, devices)
    assert len(replicas) == 2 and all(r.weight.device.type == "cpu" for r in replicas)  # one per slot


def test_broadcast_replicas_are_non_leaves_and_slot0_aliases():
    model = mlp()
    r0, r1 = replicate(model, CPU2, strategy="broadcast")
    assert type(r0[0].weight.grad_fn).__name__ == "BroadcastBackward"  # replica tensors come out of Broadcast
    assert not r1[0].weight.is_leaf
    assert r0[0].weight.data_ptr() == model[0].weight.data_ptr()  # slot 0 shares the original's storage
    assert r1[0].weight.data_ptr() != model[0].weight.data_ptr()  # slot 1 owns its own
    assert list(r1.parameters()) == []  # replicas register no Parameters (PyTorch #33907)


def test_clone_replicas_are_fresh_leaves_with_no_edge_back():
    model = mlp()
    r0, r1 = replicate(model, CPU2, strategy="clone")
    assert (
        isinstance(r0[0].weight, nn.Parameter) and r0[0].weight.is_leaf
    )  # a fresh leaf, as C++ clone() made
    assert r0[0].weight.grad_fn is None  # no gradient edge back to the original
    assert r0[0].weight.data_ptr() != model[0].weight.data_ptr()  # even slot 0 is a deep copy


def test_rewire_replicas_hang_off_one_reduce_add_per_parameter():
    model = mlp()
    replicas = replicate(model, ["cpu"] * 3, strategy="rewire")
    nodes = {id(r[0].weight.grad_fn) for r in replicas}
    assert len(nodes) == 1  # one ReduceAdd node for 0.weight, shared by every replica's copy
    node = replicas[0][0].weight.grad_fn
    assert type(node).__name__ == "ReduceAddBackward"
    assert [r[0].weight.output_nr for r in replicas] == [0, 1, 2]  # replica i is the node's output i
    (acc, _), *_ = node.next_functions
    assert acc.variable is model[0].weight  # the node's next edge is the original's AccumulateGrad


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_who_gets_the_gradient(strategy):
    model, x = mlp(), torch.randn(6, 4)
    replicas = replicate(model, CPU2, strategy=strategy)
    sum(r(x).sum() for r in replicas).backward()
    if strategy == "clone":
        assert model[0].weight.grad is None  # the bug (#19540): the original never sees a gradient
        assert all(
            r[0].weight.grad is not None for r in replicas
        )  # ... the replicas hold gradients nobody reads
    else:
        ref = mlp()
        ref.load_state_dict(model.state_dict())
        (2 * ref(x).sum()).backward()
        assert_close(model[0].weight.grad, ref[0].weight.grad)  # the sum of both replicas' gradients


def test_tied_weights():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(3, 3)
            self.b = nn.Linear(3, 3)
            self.b.weight = self.a.weight

        def forward(self, x):
            return self.b(self.a(x))

    model = Tied()
    for r in replicate(model, CPU2, strategy="broadcast"):
        assert r.a.weight is r.b.weight  # broadcast keeps tied weights tied inside each replica
    for r in replicate(model, CPU2, strategy="clone"):
        assert r.a.weight is not r.b.weight  # C++ clone() copied each registration: the tie is cut
    # rewire still sums every copy of the tied weight into the one original
    x = torch.randn(4, 3)
    replicas = replicate(model, CPU2, strategy="rewire")
    sum(r(x).sum() for r in replicas).backward()
    expected = Tied()
    expected.load_state_dict(model.state_dict())
    (2 * expected(x).sum()).backward()
    assert_close(model.a.weight.grad, expected.a.weight.grad)


def test_frozen_parameters():
    model = mlp()
    model[0].weight.requires_grad_(False)
    for strategy in STRATEGIES:
        r = replicate(model, CPU2, strategy=strategy)[1]
        assert not r[0].weight.requires_grad  # a frozen parameter gives a copy that never asks for grad
        assert r[2].weight.requires_grad


def test_buffers_requiring_grad_are_broadcast_differentiably():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("t_rg", torch.randn(10, dtype=torch.double, requires_grad=True))
            self.register_buffer("t_not_rg", torch.randn(10, dtype=torch.double))

        def forward(self, x):
            return x * self.t_rg + self.t_not_rg

    m = M()
    inp = torch.randn(2, 10, dtype=torch.double)
    dpm = dpteach.DataParallel(m, CPU2)
    assert torch.autograd.gradcheck(
        lambda t: dpm(inp), (m.t_rg,), check_batched_grad=False
    )  # PyTorch's own check


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_replicate_buffers(strategy):
    model = nn.BatchNorm2d(10)
    replicas = replicate(model, ["cpu"] * 3, strategy=strategy)
    for r in replicas:
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            assert getattr(r, name).device.type == "cpu"  # every replica has BatchNorm's buffers
    shares = replicas[0].running_mean.data_ptr() == model.running_mean.data_ptr()
    assert shares == (strategy == "broadcast")  # only broadcast lets slot 0 share the running stats
    assert replicas[1].running_mean.data_ptr() != model.running_mean.data_ptr()  # other slots never do


def test_detach_gives_replicas_without_history():
    model, x = mlp(), torch.randn(5, 4)
    originals = [model[0].weight, model[0].bias, model[2].weight, model[2].bias]
    for strategy in STRATEGIES:
        replicas = replicate(model, ["cpu"] * 3, detach=True, strategy=strategy)
        for slot, r in enumerate(replicas):
            copies = [r[0].weight, r[0].bias, r[2].weight, r[2].bias]
            for c, p in zip(copies, originals):
                assert c.grad_fn is None  # detach: no autograd history at all
                assert_close(c, p)  # ... with the module's values
                if (
                    slot
                ):  # slot 0 may hold the module's own tensors (torch's replicate does); the others never
                    assert (
                        c is not p and c.data_ptr() != p.data_ptr()
                    )  # a copy of its own, which the originals are not
        for r in replicas[1:]:
            out = r(x).sum()
            if (
                out.requires_grad
            ):  # clone and rewire give fresh leaves; broadcast gives tensors that need no grad
                out.backward()
        assert all(p.grad is None for p in originals), (
            f"{strategy}: a detached replica sent a gradient to the module"
        )


def test_unknown_strategy_lists_the_valid_ones():
    with pytest.raises(ValueError, match="'clone', 'rewire', 'broadcast'"):
        replicate(mlp(), CPU2, strategy="copy")


def test_a_callable_is_a_strategy():
    calls = []

    def mine(network, devices, detach):
        calls.append((len(devices), detach))
        return dpteach.STRATEGIES["broadcast"](network, devices, detach)

    replicas = replicate(mlp(), CPU2, strategy=mine)
    assert calls == [(2, False)] and len(replicas) == 2  # called once with the normalised slots

    with pytest.raises(ValueError, match="returned 1 replicas"):
        replicate(mlp(), CPU2, strategy=lambda n, d, det: [n])  # a strategy must return one module per slot


def test_bad_input_gets_a_clear_error():
    with pytest.raises(ValueError, match="empty"):
        replicate(mlp(), [])
    with pytest.raises(RuntimeError, match="uninitialized parameters"):
        replicate(nn.LazyLinear(3), CPU2)
    with pytest.raises(RuntimeError, match="parameters and buffers on device meta"):
        replicate(mlp(), ["meta", "meta"])
    with pytest.raises(TypeError, match="nn.Module"):
        replicate(lambda x: x, CPU2)


def test_parameter_list_and_dict_inside_a_replica():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.p1 = nn.Parameter(torch.randn(2))
            self.p2 = nn.Parameter(torch.randn(2))
            self.plist = nn.ParameterList([self.p1, self.p2])
            self.pdict = nn.ParameterDict({"0": self.p1, "1": self.p2})

        def forward(self, x):
            return x

    m = M()
    r = replicate(m, CPU2)[1]
    for p, orig in ((r.plist[0], m.p1), (r.plist[1], m.p2), (r.pdict["0"], m.p1), (r.pdict["1"], m.p2)):
        assert_close(p, orig)  # entries carry the original values
        assert p.requires_grad and p.grad_fn is not None  # ... as differentiable copies


@pytest.mark.parametrize("detach", [False, True])
def test_replicas_can_be_saved(detach):
    model, x = mlp(), torch.randn(5, 4)
    buf = io.BytesIO()
    torch.save(replicate(model, CPU2, detach=detach), buf)  # pickling replicas works (#37182)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert len(loaded) == 2
    for r in loaded:
        assert_close(r(x), model(x))  # what comes back is still the module's function


def test_zero_grad_on_a_replica_warns():
    class M(nn.Linear):
        def forward(self, x):
            self.zero_grad()
            return super().forward(x)

    with pytest.warns(UserWarning, match="has no effect"):
        dpteach.DataParallel(M(3, 3), CPU2)(torch.randn(4, 3))


def test_rnn_replicas_keep_their_flat_weights_in_sync():
    model = nn.LSTM(5, 7, batch_first=True)
    x = torch.randn(4, 3, 5)
    for strategy in STRATEGIES:
        r = replicate(model, CPU2, strategy=strategy)[1]
        assert_close(r(x)[0], model(x)[0])  # the replica's RNN reads its own copies


def test_slot0_can_sit_on_another_device_than_later_slots():
    # duplicates and mixed spellings are fine; the module must sit on slot 0's device.
    # Two device types (cpu and meta): tests/core/test_cross_device.py::test_replicas_land_on_their_slots_device
    model, x = mlp(), torch.randn(5, 4)
    replicas = replicate(model, ["cpu", torch.device("cpu"), "cpu"])
    assert len(replicas) == 3
    for r in replicas:
        assert r[0].weight.device == torch.device("cpu")
        assert_close(r(x), model(x))
    with pytest.raises(RuntimeError, match="on device meta"):
        replicate(model, ["meta", "cpu"])  # slot 0 must be the module's device
