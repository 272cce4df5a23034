"""Where results land when devices differ, on a CPU-only machine: ``meta`` is the second device.

A ``meta`` tensor has a shape, a dtype and a device but no data, so these tests check *where*
things go (destination, output_device, which slot gets which rows) and how many bytes moved; the
values are checked on CPU slots in the other files. Each test names the one-line change of the
library it catches.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.testing import assert_close

import dpteach
from dpteach import comm, parallel_apply, replicate

CPU2 = ["cpu", "cpu"]
STRATEGIES = list(dpteach.STRATEGIES)  # history order, from the one registry


# comm's coalesced functions group tensors into buckets by dtype and by index, not by tensor type
# (which differs between devices), so mixed device types work.
def mlp():
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))


# --------------------------------------------------------------------------------------------
# comm.reduce_add: the sum lands on `destination` (mutation: destination ignored)
# --------------------------------------------------------------------------------------------


def test_reduce_add_puts_the_sum_on_the_destination():
    x, y = torch.randn(4, 4), torch.randn(4, 4)
    with comm.traffic() as t:
        out = comm.reduce_add([x, y], destination="meta")
    assert out.device.type == "meta" and out.shape == x.shape  # not the inputs' device
    assert t.cross_device_bytes == 2 * comm.nbytes(x)  # both inputs travelled to the destination
    assert comm.reduce_add([x], destination="meta").device.type == "meta"  # a single input is moved too
    assert comm.reduce_add([x, y], destination="cpu").device.type == "cpu"


def test_reduce_add_with_the_destination_among_the_inputs_moves_only_the_others():
    on_meta, on_cpu = torch.empty(4, 4, device="meta"), torch.randn(4, 4)
    with comm.traffic() as t:
        out = comm.reduce_add([on_meta, on_cpu], destination="meta")
    assert out.device.type == "meta"
    assert [(c.src.type, c.dst.type) for c in t.copies] == [
        ("cpu", "meta")
    ]  # the root input stays where it is


def test_reduce_add_coalesced_onto_one_device_sums_each_position():
    groups = [[torch.randn(3, 2), torch.randn(5)] for _ in range(3)]
    out = comm.reduce_add_coalesced(groups, destination="cpu")
    assert_close(out[0], groups[0][0] + groups[1][0] + groups[2][0])
    assert_close(out[1], groups[0][1] + groups[1][1] + groups[2][1])


def test_reduce_add_coalesced_onto_another_device_goes_through_the_buckets():
    groups = [[torch.randn(3, 2), torch.randint(0, 9, (5,)), torch.randn(7)] for _ in range(2)]
    out = comm.reduce_add_coalesced(groups, destination="meta", buffer_size=32)
    assert [t.device.type for t in out] == ["meta"] * 3
    assert [t.shape for t in out] == [g.shape for g in groups[0]] and [t.dtype for t in out] == [
        g.dtype for g in groups[0]
    ]


def test_broadcast_coalesced_onto_another_device_keeps_shapes_and_types():
    tensors = [torch.randn(3, 4), torch.arange(6), torch.randn(2, dtype=torch.float64)]
    outs = comm.broadcast_coalesced(tensors, ["cpu", "meta"], buffer_size=64)
    assert [t.device.type for t in outs[1]] == ["meta"] * 3
    assert [(t.shape, t.dtype) for t in outs[1]] == [(t.shape, t.dtype) for t in tensors]


# --------------------------------------------------------------------------------------------
# scatter / gather across devices
# --------------------------------------------------------------------------------------------


def test_scatter_and_gather_cross_devices_and_count_the_bytes():
    x = torch.randn(6, 4)
    with comm.traffic() as t:
        a, b = comm.scatter(x, ["cpu", "meta"])
    assert (a.device.type, b.device.type) == ("cpu", "meta") and b.shape == (3, 4)
    assert t.by_op() == {"scatter": comm.nbytes(x[3:])}  # only the piece for the other device moved
    with comm.traffic() as t:
        g = comm.gather([x[:2], x[2:]], destination="meta")
    assert g.device.type == "meta" and g.shape == x.shape
    assert t.cross_device_bytes == comm.nbytes(x)
    a, b = comm.broadcast(x, ["meta", "cpu"])
    assert (
        a.device.type == "meta" and b is x
    )  # the first slot on the source's own device gets the tensor itself


# --------------------------------------------------------------------------------------------
# output_device (mutation: DataParallel / data_parallel gather on slot 0 whatever output_device says)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_dataparallel_gathers_on_output_device(strategy):
    model, x = nn.Linear(4, 2), torch.randn(6, 4)
    out = dpteach.DataParallel(model, CPU2, output_device="meta", strategy=strategy)(x)
    assert out.device.type == "meta" and out.shape == (6, 2)
    assert dpteach.DataParallel(model, CPU2, strategy=strategy)(x).device.type == "cpu"  # default: slot 0


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_data_parallel_function_gathers_on_output_device(strategy):
    model, x = nn.Linear(4, 2), torch.randn(6, 4)
    out = dpteach.data_parallel(model, x, CPU2, output_device="meta", strategy=strategy)
    assert out.device.type == "meta" and out.shape == (6, 2)
    assert dpteach.data_parallel(model, x, CPU2, strategy=strategy).device.type == "cpu"


# --------------------------------------------------------------------------------------------
# Uneven batches (mutation: a chunking off-by-one that drops the remainder rows)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rows,slots", [(7, 2), (7, 3), (10, 4), (5, 4)])
def test_uneven_batches_keep_every_row(rows, slots):
    x = torch.arange(rows * 2.0).view(rows, 2)
    pieces = comm.scatter(x, ["cpu"] * slots)
    assert [p.shape[0] for p in pieces] == [c.shape[0] for c in x.chunk(slots)]  # torch.chunk's sizes
    assert_close(torch.cat(pieces), x)  # every row once, in order
    nested = dpteach.scatter((x, {"y": x + 1}), ["cpu"] * slots)
    assert_close(torch.cat([p[0] for p in nested]), x)
    assert_close(torch.cat([p[1]["y"] for p in nested]), x + 1)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_dataparallel_on_an_uneven_batch_equals_one_device(strategy):
    model, x = mlp(), torch.randn(7, 4)
    out = dpteach.DataParallel(model, ["cpu"] * 3, strategy=strategy)(x)
    assert_close(out, model(x))  # 7 rows in, 7 rows out, the same ones


# --------------------------------------------------------------------------------------------
# Grad-requiring buffers under "rewire" (mutation: buffers never rewired)
# --------------------------------------------------------------------------------------------


class ScaledByBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.randn(5, requires_grad=True))
        self.lin = nn.Linear(5, 5)

    def forward(self, x):
        return self.lin(x * self.scale)


@pytest.mark.parametrize("strategy", ["rewire", "broadcast"])
def test_a_buffer_that_requires_grad_gets_the_one_device_gradient(strategy):
    model, x = ScaledByBuffer(), torch.randn(6, 5)
    model(x).pow(2).sum().backward()
    expected = model.scale.grad.clone()  # one device: the reference
    model.scale.grad = None
    dpteach.DataParallel(model, ["cpu"] * 3, strategy=strategy)(x).pow(2).sum().backward()
    assert model.scale.grad is not None, f"{strategy}: the buffer's gradient never came back"
    assert_close(
        model.scale.grad, expected
    )  # the replicas' gradients summed onto the buffer (#20910 rewired them too)


def test_rewire_gives_each_grad_requiring_buffer_a_reduce_add_node():
    model = ScaledByBuffer()
    for r in replicate(model, CPU2, strategy="rewire"):
        assert type(r.scale.grad_fn).__name__ == "ReduceAddBackward"  # hangs off the buffer's node
        assert not r.scale.is_leaf


# --------------------------------------------------------------------------------------------
# Grad mode in the worker threads (mutation: grad mode not carried into the threads)
# --------------------------------------------------------------------------------------------


class RecordsGradMode(nn.Module):
    def __init__(self, seen):
        super().__init__()
        self.seen = seen
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        self.seen.append(torch.is_grad_enabled())
        return self.lin(x)


@pytest.mark.parametrize("grad", [False, True])
def test_parallel_apply_carries_grad_mode_into_every_thread(grad):
    seen = []
    modules = [RecordsGradMode(seen), RecordsGradMode(seen)]
    with torch.set_grad_enabled(grad):
        outs = parallel_apply(modules, [torch.randn(2, 3), torch.randn(2, 3)], devices=CPU2)
    assert seen == [grad, grad]  # each thread ran in the caller's mode
    assert [o.requires_grad for o in outs] == [grad, grad]  # no graph is built under no_grad


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_dataparallel_under_no_grad_builds_no_graph(strategy):
    model = mlp()
    with torch.no_grad():
        out = dpteach.DataParallel(model, ["cpu"] * 3, strategy=strategy)(torch.randn(6, 4))
    assert not out.requires_grad and out.grad_fn is None


# --------------------------------------------------------------------------------------------
# Replicas on two device types
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_replicas_land_on_their_slots_device(strategy):
    model = mlp()
    a, b = replicate(model, ["cpu", "meta"], strategy=strategy)
    for t in (a[0].weight, a[0].bias, a[2].weight):
        assert t.device.type == "cpu"
    for t in (b[0].weight, b[0].bias, b[2].weight):
        assert t.device.type == "meta"
    x = torch.randn(5, 4)
    assert_close(a(x), model(x))  # slot 0 computes what the module computes
    assert b(x.to("meta")).shape == (5, 3)  # slot 1 runs on its own device
