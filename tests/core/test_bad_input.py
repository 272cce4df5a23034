"""Every bad input gets an error that names the problem and the fix, in the caller's terms.

Each case gives the call, the exception type, a pattern for the problem and one for the fix. The
error must also be raised by dpteach itself, before torch fails somewhere deep inside (the last
frame of its traceback is in dpteach's code), and it must come before anything was changed.
"""

from __future__ import annotations

import traceback
from pathlib import Path

import pytest
import torch
from torch import nn

import dpteach
from dpteach.replicate import ReduceAdd  # noqa: F401 - named in the messages checked below

S = ["cpu", "cpu"]
DPTEACH = str(Path(dpteach.__file__).parent)


def lin():
    torch.manual_seed(0)
    return nn.Linear(4, 2)


class Returns(nn.Module):
    """Returns ``first`` from slot 0's piece and ``rest`` from the others: replicas that disagree."""

    def __init__(self, first, rest):
        super().__init__()
        self.first, self.rest = first, rest
        self.linear = nn.Linear(4, 2)

    def forward(self, x):
        y = self.linear(x)
        return self.first(y) if x[0, 0] < 0 else self.rest(y)


def disagreeing(first, rest):
    x = torch.ones(4, 4)
    x[0, 0] = -1  # slot 0's piece starts negative, slot 1's does not
    return lambda: dpteach.DataParallel(Returns(first, rest), S)(x)


def rewire_double_backward():
    model = lin()
    out = dpteach.DataParallel(model, S, strategy="rewire")(torch.randn(4, 4))
    (g,) = torch.autograd.grad(out.pow(2).sum(), [model.weight], create_graph=True)
    g.pow(2).sum().backward()


CASES = [
    # (id, call, exception, the problem, the fix)
    (
        "not a module",
        lambda: dpteach.DataParallel(lambda x: x, S),
        TypeError,
        r"wraps an nn\.Module, got function",
        r"wrap it in an nn\.Module whose forward calls it",
    ),
    (
        "data_parallel of a function",
        lambda: dpteach.data_parallel(print, torch.ones(2, 4), S),
        TypeError,
        r"runs an nn\.Module, got builtin_function",
        r"wrap it in an nn\.Module",
    ),
    (
        "empty device list",
        lambda: dpteach.DataParallel(lin(), []),
        ValueError,
        r"device_ids is empty",
        r"give at least one device, e\.g\. \['cpu', 'cpu'\]",
    ),
    (
        "not a device string",
        lambda: dpteach.DataParallel(lin(), ["gpu", "gpu"]),
        RuntimeError,
        r"'gpu' is not a device",
        r"use 'cpu', 'cuda:0'",
    ),
    (
        "not a device at all",
        lambda: dpteach.DataParallel(lin(), [0.5]),
        TypeError,
        r"got float: 0\.5",
        r"expected a device \(int, str or torch\.device\)",
    ),
    (
        "negative index",
        lambda: dpteach.DataParallel(lin(), [-1]),
        ValueError,
        r"device index -1 is negative",
        r"use 'cpu' for the CPU",
    ),
    (
        "devices None",
        lambda: dpteach.replicate(lin(), None),
        ValueError,
        r"devices is None",
        r"pass a list such as \['cpu', 'cpu'\]",
    ),
    (
        "unknown strategy",
        lambda: dpteach.DataParallel(lin(), S, strategy="Broadcast"),
        ValueError,
        r"unknown strategy 'Broadcast'",
        r"valid strategies are 'clone', 'rewire', 'broadcast'",  # dpteach.STRATEGIES' order: history's
    ),
    (
        "strategy gives too few",
        lambda: dpteach.replicate(lin(), S, strategy=lambda m, d, detach: [m]),
        ValueError,
        r"returned 1 replicas",
        r"needs a list of 2 \(one module per slot\)",
    ),
    (
        "dim not an int",
        lambda: dpteach.DataParallel(lin(), S, dim="0"),
        TypeError,
        r"dim must be an int",
        r"the batch dimension",
    ),
    (
        "dim out of range",
        lambda: dpteach.DataParallel(lin(), S, dim=2)(torch.ones(4, 4)),
        IndexError,
        r"dim 2 is out of range for inputs\[0\], which has 2 dimension\(s\)",
        r"dim=0\) for a batch in the first",
    ),
    (
        "lazy module",
        lambda: dpteach.DataParallel(nn.LazyLinear(2), S)(torch.ones(4, 4)),
        RuntimeError,
        r"uninitialized parameters",
        r"Run a dummy forward pass",
    ),
    (
        "module elsewhere",
        lambda: dpteach.DataParallel(lin().to("meta"), S)(torch.ones(4, 4)),
        RuntimeError,
        r"found one of them on device: meta \('weight'\)",
        r"module\.to\('cpu'\)",
    ),
    (
        "compiled module",
        lambda: dpteach.DataParallel(torch.compile(lin()), S),
        TypeError,
        r"torch\.compile'd module",
        r"torch\.compile\(DataParallel\(model",
    ),
    (
        "empty batch",
        lambda: dpteach.DataParallel(lin(), S)(torch.ones(0, 4)),
        ValueError,
        r"empty batch: inputs\[0\] has size 0",
        r"Skip empty batches",
    ),
    (
        "batch sizes differ",
        lambda: dpteach.DataParallel(nn.Bilinear(4, 4, 2), S)(torch.ones(8, 4), torch.ones(1, 4)),
        ValueError,
        r"inputs\[0\] has size 8 .*inputs\[1\] has size 1,.* 2 and 1 pieces",
        r"same batch size.*on the module",
    ),
    (
        "keyword batch differs",
        lambda: dpteach.data_parallel(lin(), torch.ones(8, 4), S, module_kwargs={"mask": torch.ones(1, 4)}),
        ValueError,
        r"kwargs\['mask'\] has size 1",
        r"same batch size",
    ),
    (
        "keywords not a dict",
        lambda: dpteach.data_parallel(lin(), torch.ones(8, 4), S, module_kwargs=[1]),
        TypeError,
        r"keyword inputs must be a dict",
        r"dict of name -> value",
    ),
    (
        "sparse input",
        lambda: dpteach.DataParallel(lin(), S)(torch.ones(4, 4).to_sparse()),
        ValueError,
        r"inputs\[0\] is a sparse_coo tensor",
        r"pass it dense \(\.to_dense\(\)\)",
    ),
    (
        "0-d input",
        lambda: dpteach.DataParallel(lin(), S)(torch.ones(4, 4), torch.tensor(2.0)),
        ValueError,
        r"inputs\[1\] is a 0-d tensor",
        r"Python number \(\.item\(\)\)",
    ),
    (
        "meta input",
        lambda: dpteach.DataParallel(lin(), S)(torch.ones(4, 4, device="meta")),
        ValueError,
        r"inputs\[0\] is on the meta device",
        r"create it on a real device",
    ),
    (
        "None beside a tensor",
        disagreeing(lambda y: None, lambda y: y),
        ValueError,
        r"replica 1 returned a tensor at output where replica 0 returned None",
        r"return the same kinds of values",
    ),
    (
        "dict keys differ",
        disagreeing(lambda y: {"a": y}, lambda y: {"b": y}),
        ValueError,
        r"same keys",
        r"same structure for every piece",
    ),
    (
        "list lengths differ",
        disagreeing(lambda y: [y], lambda y: [y, y]),
        ValueError,
        r"different lengths \[1, 2\] \(at output\)",
        r"same structure for every piece",
    ),
    (
        "shapes differ",
        disagreeing(lambda y: y, lambda y: y[:, :1]),
        ValueError,
        r"replica 1 returned shape \(2, 1\) at output where replica 0 returned \(2, 2\)",
        r"Return the batch along dim 0",
    ),
    (
        "rewire double backward",
        rewire_double_backward,
        RuntimeError,
        r"ReduceAdd can only be used during the backward pass",
        r"use strategy='broadcast' for double backward",
    ),
    (
        "modules and inputs",
        lambda: dpteach.parallel_apply([lin(), lin()], [torch.ones(1, 4)]),
        AssertionError,
        r"number of modules 2 is not equal to the number of inputs 1",
        r"one input per module",
    ),
    (
        "modules and keyword dicts",
        lambda: dpteach.parallel_apply([lin()], [torch.ones(1, 4)], [{}, {}]),
        AssertionError,
        r"number of kwargs_tup 2",
        r"one dict of keyword inputs per module",
    ),
    (
        "modules and devices",
        lambda: dpteach.parallel_apply([lin()], [torch.ones(1, 4)], None, S),
        AssertionError,
        r"number of devices 2",
        r"one device per module",
    ),
]


@pytest.mark.parametrize("call, exc, problem, fix", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_names_problem_and_fix(call, exc, problem, fix):
    with pytest.raises(exc) as caught:
        call()
    message = str(caught.value)
    assert caught.match(problem), f"the message does not name the problem: {message}"
    assert caught.match(fix), f"the message does not say what to do: {message}"
    where = traceback.extract_tb(caught.value.__traceback__)[-1].filename
    assert where.startswith(DPTEACH), f"raised deep inside {where}, not by dpteach: {message}"


def test_cuda_slots_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("CUDA is here")
    with pytest.raises(RuntimeError, match=r"CUDA is not available here; use 'cpu' slots"):
        dpteach.DataParallel(lin(), ["cuda:0", "cuda:0"])


def test_refused_inputs_leave_the_model_as_it_was():
    model = lin()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for _, call, exc, _, _ in CASES:
        try:
            call()
        except exc:
            pass
    for bad in (
        lambda: dpteach.DataParallel(model, S)(torch.ones(0, 4)),
        lambda: dpteach.DataParallel(model, S)(torch.ones(8, 4), torch.ones(1, 4)),
        lambda: dpteach.DataParallel(model, S, dim=3)(torch.ones(4, 4)),
    ):
        with pytest.raises((ValueError, IndexError)):
            bad()
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())  # nothing ran forward, nothing ran backward
