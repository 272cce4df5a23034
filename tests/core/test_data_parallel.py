"""DataParallel and data_parallel: PyTorch's test/distributed/test_data_parallel.py, on CPU slots."""

from __future__ import annotations

import gc
from collections import OrderedDict

import pytest
import torch
from torch import nn
from torch.testing import assert_close

import dpteach
from dpteach import DataParallel, data_parallel
from dpteach.replicate import FIXED as FIXED_STRATEGIES

CPU2 = ["cpu", "cpu"]
FIXED = list(FIXED_STRATEGIES)


@pytest.mark.parametrize("strategy", FIXED)
def test_data_parallel_matches_one_device(strategy):
    l = nn.Linear(10, 5)
    i = torch.randn(20, 10, requires_grad=True)
    expected_out = l(i)
    loss = expected_out.sum()
    loss.backward()
    expected_grads = [p.grad.clone() for p in l.parameters()]
    expected_i_grad = i.grad.clone()
    l.zero_grad()
    i.grad = None
    out = data_parallel(l, i, CPU2, strategy=strategy)
    assert_close(out, expected_out)  # forward went well
    out.sum().backward()
    for p, g in zip(l.parameters(), expected_grads):
        assert_close(p.grad, g)  # the original's gradients equal the one-device ones
    assert_close(i.grad, expected_i_grad)  # ... and so does the input's


def test_data_parallel_small_back():
    l = nn.Linear(10, 5)
    i = torch.randn(20, 10)
    assert_close(data_parallel(l, i, CPU2), l(i))


def test_default_devices_on_this_machine():
    slots = dpteach.default_devices()
    if torch.cuda.device_count() >= 2:
        assert slots == [torch.device("cuda", k) for k in range(torch.cuda.device_count())]
    elif torch.cuda.is_available():
        assert slots == [torch.device("cuda", 0)] * 2  # one GPU: two slots on it
    else:
        assert slots == [torch.device("cpu")] * 2  # no GPU: two CPU slots
    assert DataParallel(nn.Linear(2, 2)).device_ids == slots  # device_ids=None means default_devices()


def test_data_parallel_multiple_input():
    class TestModule(nn.Module):
        def forward(self, var1, var2, float1, var3=None):
            if var3 is None:
                return float1 * (var1 * var2)
            return float1 * (var1 * var2 + var3)

    m = TestModule()
    var1 = torch.randn(5, 5, requires_grad=True)
    var2 = torch.randn(5, 5, requires_grad=True)
    var3 = torch.randn(5, 5, requires_grad=False)
    float1 = torch.randn(1).item()
    expected = m(var1, var2, float1)
    loss = expected.sum()
    loss.backward()
    gvar1, gvar2 = var1.grad.clone(), var2.grad.clone()

    def check(output):
        assert_close(output, expected)
        var1.grad.zero_()
        var2.grad.zero_()
        output.sum().backward()
        assert_close(var1.grad, gvar1)  # each input's gradient as on one device
        assert_close(var2.grad, gvar2)

    check(data_parallel(m, (var1, var2, float1), CPU2))
    check(data_parallel(m, (var1, var2, float1), ["cpu"]))
    check(DataParallel(m, CPU2)(var1, var2, float1))
    expected3 = m(var1, var2, float1, var3=var3)
    assert_close(data_parallel(m, (var1, var2, float1), CPU2, module_kwargs={"var3": var3}), expected3)
    assert_close(DataParallel(m, CPU2)(var1, var2, float1, var3=var3), expected3)


def test_data_parallel_nested_output():
    def fn(x):
        return [x, (x.sin(), x.cos(), [x.add(1)]), x, OrderedDict(a=x, b=[x.sin()])]

    class Net(nn.Module):
        def forward(self, x):
            return fn(x)

    i = torch.randn(2, 2)
    out = DataParallel(Net(), CPU2)(i)
    ref = fn(i)
    assert isinstance(out, list) and isinstance(out[1], tuple) and isinstance(out[1][2], list)  # types kept
    assert isinstance(out[3], OrderedDict) and isinstance(out[3]["b"], list)
    assert_close(out, ref)


def test_data_parallel_nested_input():
    def fn(input):
        return input[1][0]

    class Net(nn.Module):
        def forward(self, *input):
            return fn(input)

    i = torch.randn(20, 3)
    inp = (i.cos(), (i.sin(), i), i.sin())
    assert_close(DataParallel(Net(), CPU2)(*inp), fn(inp))


def test_data_parallel_module_zero_inputs():
    class TestModule(nn.Module):
        def forward(self):
            t = torch.eye(2, 3)
            return t + (1 - t)

    expected = torch.ones(2, 3)
    assert_close(DataParallel(TestModule(), ["cpu"])(), expected)  # a forward with no arguments still runs
    assert_close(DataParallel(TestModule(), CPU2)(), expected)
    assert_close(data_parallel(TestModule(), None, ["cpu"]), expected)
    assert_close(data_parallel(TestModule(), (), CPU2), expected)


def test_data_parallel_device_args():
    l = nn.Linear(10, 5)
    i = torch.randn(20, 10)
    dev = torch.device("cpu")
    assert_close(data_parallel(l, i, device_ids=(dev, dev), output_device=dev), l(i))  # torch.device objects


def test_data_parallel_function_deletion():
    # a gradient penalty through DataParallel (#16532): double backward through replicate
    l = nn.Linear(4, 1)
    with torch.no_grad():
        l.weight.fill_(1.0)
        l.bias.zero_()
    dp = DataParallel(l, CPU2)
    x = torch.ones(2, 4, requires_grad=True)
    out = dp(x)
    grad = torch.autograd.grad(out, x, torch.ones_like(out), create_graph=True)[0]
    grad.mean().backward()
    assert_close(l.weight.grad, torch.full((1, 4), 0.25))  # d/dW mean(W) = 1/4 per entry
    assert_close(l.bias.grad, torch.zeros(1))


def test_rewire_refuses_double_backward_with_an_error_naming_reduce_add():
    l = nn.Linear(4, 1)
    x = torch.randn(6, 4)
    loss = DataParallel(l, CPU2, strategy="rewire")(x).pow(2).sum()
    # a Hessian-vector product needs the gradient's own graph, so create_graph runs ReduceAdd on grads that
    # require grad: the C++ node of #20910 refuses them, and so does its Python twin
    with pytest.raises(RuntimeError, match="ReduceAdd can only be used during the backward pass"):
        torch.autograd.grad(loss, list(l.parameters()), create_graph=True)


def test_rewire_takes_a_gradient_penalty_on_the_input():
    # a penalty on d(out)/dx never sends differentiable gradients through ReduceAdd: rewire copes
    l = nn.Linear(4, 1)
    x = torch.ones(2, 4, requires_grad=True)
    out = DataParallel(l, CPU2, strategy="rewire")(x)
    grad = torch.autograd.grad(out, x, torch.ones_like(out), create_graph=True)[0]
    grad.mean().backward()
    assert_close(l.weight.grad, torch.full((1, 4), 0.25))


def test_data_parallel_no_grad():
    class Layer(nn.Module):
        def forward(self, x):
            assert not torch.is_grad_enabled()
            return x

    l = Layer()
    i = torch.randn(20, 10)
    with torch.no_grad():
        DataParallel(l, CPU2)(i)  # grad mode reaches the worker threads
    with pytest.raises(AssertionError):
        DataParallel(l, CPU2)(i)


def test_data_parallel_model_device():
    l = nn.Linear(2, 2)
    with pytest.raises(RuntimeError, match="module must have its parameters and buffers on device meta"):
        DataParallel(l, ["meta", "cpu"])(torch.randn(4, 2))
    with pytest.raises(RuntimeError, match="module must have its parameters and buffers on device meta"):
        data_parallel(l, torch.randn(4, 2), ["meta", "cpu"])


def test_data_parallel_model_no_refcycles():
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(1, 1)

        def forward(self, x):
            return self.linear(x)

    gc.collect()
    model = DataParallel(Model(), CPU2)
    model(torch.randn(4, 1))
    del model
    assert gc.collect() == 0  # scatter/gather/replicate leave no reference cycles behind


def test_data_parallel_sparse():
    l = nn.Embedding(10, 5, sparse=True)
    i = torch.randint(10, (20, 5), dtype=torch.long)
    expected_out = l(i)
    expected_out.sum().backward()
    expected_grad = l.weight.grad.clone().coalesce()
    l.zero_grad()
    l.weight.grad = None
    out = data_parallel(l, i, CPU2)
    assert_close(out, expected_out)
    out.sum().backward()
    assert_close(l.weight.grad.coalesce().to_dense(), expected_grad.to_dense())  # sparse grads reduce right


def test_data_parallel_rnn():
    class TestModule(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = nn.LSTM(30, 64, 1, batch_first=True, bidirectional=True)

        def forward(self, x):
            self.rnn.flatten_parameters()
            return self.rnn(x)

    def step(model):
        opt = torch.optim.SGD(model.parameters(), lr=10)
        out = model(torch.ones(4, 4, 30))[0]
        nn.functional.mse_loss(out, torch.zeros_like(out)).backward()
        opt.step()

    with torch.no_grad():
        DataParallel(TestModule(), CPU2)(torch.ones(4, 4, 30))  # no crash under no_grad (#21108)
    m1 = TestModule()
    m2 = TestModule()
    m2.load_state_dict(m1.state_dict())
    step(m1)
    step(DataParallel(m2, CPU2))
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        assert_close(p1, p2)  # one SGD step moves both the same way


def test_data_parallel_lazy_linear():
    with pytest.raises(RuntimeError, match="Modules with uninitialized parameters"):
        DataParallel(nn.LazyLinear(10), CPU2)(torch.rand(10, 10))


def test_state_dict_keys_are_prefixed_module():
    dp = DataParallel(nn.Linear(3, 2), CPU2)
    assert list(dp.state_dict()) == ["module.weight", "module.bias"]  # as torch.nn.DataParallel saves
    assert isinstance(dp.module, nn.Linear)


def test_autocast_reaches_the_threads():
    class M(nn.Linear):
        def forward(self, x):
            return super().forward(x)

    m = M(8, 8)
    x = torch.randn(4, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = DataParallel(m, CPU2)(x)
        ref = m(x)
    assert out.dtype == torch.bfloat16  # autocast was on inside each replica's thread
    assert_close(out, ref)


def test_data_parallel_empty_containers_in_kwargs():
    l = nn.Linear(10, 5)
    i = torch.randn(20, 10)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = l

        def forward(self, input):
            return self.l(input["data"])

    for unused in ([], {}, ()):
        assert_close(DataParallel(Net(), CPU2)(input={"data": i, "unused": unused}), l(i))


def test_data_parallel_with_empty_parameter_shapes():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.p1 = nn.Parameter(torch.empty(0, 16))
            self.p2 = nn.Parameter(torch.empty(3, 0, 8))
            self.p3 = nn.Parameter(torch.empty(2, 3))

        def forward(self, x):
            return x

    m = M()
    DataParallel(m, CPU2)(torch.randn(4, 2))
    assert [tuple(p.shape) for p in m.parameters()] == [(0, 16), (3, 0, 8), (2, 3)]


def test_strided_grad_layout():
    conv = nn.Conv2d(3, 4, 3).to(memory_format=torch.channels_last)
    ref = nn.Conv2d(3, 4, 3).to(memory_format=torch.channels_last)
    ref.load_state_dict(conv.state_dict())
    x = torch.randn(4, 3, 8, 8).contiguous(memory_format=torch.channels_last)
    DataParallel(conv, CPU2)(x).sum().backward()
    ref(x).sum().backward()
    assert conv.weight.grad.is_contiguous(memory_format=torch.channels_last)  # the param's layout is kept
    assert_close(conv.weight.grad, ref.weight.grad, atol=1e-5, rtol=1e-5)


def test_complex_parameters():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.p = nn.Parameter(torch.zeros(1, 10, dtype=torch.cfloat))

        def forward(self, x):
            return x + self.p

    x = torch.randn(4, 10, dtype=torch.cfloat)
    out = DataParallel(M(), CPU2)(x)
    assert out.dtype == torch.cfloat and out.shape == (
        4,
        10,
    )  # complex stays complex (PyTorch leaks a real view)
    assert_close(out, x)


def test_constructor_errors():
    with pytest.raises(ValueError, match="empty"):
        DataParallel(nn.Linear(2, 2), [])
    with pytest.raises(ValueError, match="valid strategies"):
        DataParallel(nn.Linear(2, 2), CPU2, strategy="nope")
    with pytest.raises(TypeError, match="dim must be an int"):
        DataParallel(nn.Linear(2, 2), CPU2, dim="0")
    with pytest.raises(IndexError, match="out of range"):
        DataParallel(nn.Linear(2, 2), CPU2, dim=3)(torch.randn(4, 2))
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            DataParallel(nn.Linear(2, 2), [0, 1])  # an int is a CUDA index: say there is no CUDA here


def test_batch_smaller_than_slots_uses_fewer_replicas():
    l = nn.Linear(3, 2)
    x = torch.randn(2, 3)
    assert_close(DataParallel(l, ["cpu"] * 4)(x), l(x))  # 2 rows over 4 slots: 2 replicas run


@pytest.mark.parametrize("strategy", list(dpteach.STRATEGIES))
def test_hooks_run_once_per_replica(strategy):
    calls = []
    l = nn.Linear(3, 2)
    l.register_forward_hook(lambda m, i, o: calls.append(i[0].shape[0]))
    DataParallel(l, ["cpu"] * 3, strategy=strategy)(torch.randn(6, 3))
    assert sorted(calls) == [2, 2, 2]  # each replica's forward runs the hook on its own piece
