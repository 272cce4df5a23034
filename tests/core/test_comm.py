"""dpteach.comm against torch.cuda.comm's tests (test/test_cuda_multigpu.py, TestCudaComm), on CPU slots."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.testing import assert_close

from dpteach import comm

CPU2 = ["cpu", "cpu"]


def test_broadcast_slot0_is_the_source_other_slots_own_storage():
    x = torch.randn(5, 3)
    a, b = comm.broadcast(x, CPU2)
    assert a is x  # the first slot on the source's device gets the tensor itself
    assert b.data_ptr() != x.data_ptr()  # every other slot owns its storage, even on the same device
    assert_close(b, x)  # ... with the same values


def test_broadcast_out_and_errors():
    x = torch.randn(4)
    out = [torch.empty(4), torch.empty(4)]
    res = comm.broadcast(x, out=out)
    assert res[0] is out[0] and res[1] is out[1]  # out= fills the given tensors
    assert_close(out[1], x)
    with pytest.raises(RuntimeError, match="Exactly one of 'devices' and 'out'"):
        comm.broadcast(x, CPU2, out=out)
    with pytest.raises(RuntimeError, match="Exactly one of 'devices' and 'out'"):
        comm.broadcast(x)
    with pytest.raises(RuntimeError, match="same shape as the source"):
        comm.broadcast(x, out=[torch.empty(3)])


def test_empty_device_list_is_refused():
    with pytest.raises(ValueError, match="empty"):
        comm.broadcast(torch.ones(1), [])


@pytest.mark.parametrize("n_slots", [2, 3])
def test_broadcast_coalesced_equals_per_tensor_broadcast(n_slots):
    tensors = [torch.randn(3, 4), torch.arange(6), torch.randn(2, dtype=torch.float64), torch.randn(0, 5)]
    outs = comm.broadcast_coalesced(tensors, ["cpu"] * n_slots, buffer_size=64)
    assert len(outs) == n_slots
    for o, t in zip(outs[0], tensors):
        assert o is t  # slot 0's outputs are the inputs as they are
    for slot in outs[1:]:
        for o, t in zip(slot, tensors):
            assert o.dtype == t.dtype and o.shape == t.shape  # types preserved
            assert_close(o, t)
            if t.numel():
                assert o.data_ptr() != t.data_ptr()  # a real copy


def test_coalesced_copy_buckets_small_tensors_and_hands_back_each_one():
    # the bucketing path broadcast_coalesced takes between distinct devices, run here onto the CPU itself
    tensors = [
        torch.randn(2, 2),
        torch.randn(3),
        torch.arange(4),
        torch.randn(4),
        torch.randn(2, dtype=torch.float64),
        torch.randn(40),
    ]  # 16 + 12 + 16 float32 bytes share a bucket; 160 bytes need their own
    with comm.traffic() as t:
        out = comm._coalesced_copy(tensors, torch.device("cpu"), buffer_size=64)
    for o, src in zip(out, tensors):
        assert o.dtype == src.dtype and o.shape == src.shape  # each tensor back in its place, with its type
        assert_close(o, src)
        assert o.data_ptr() != src.data_ptr()  # copied
    sent = [c for c in t.copies if c.op == "broadcast"]
    packed = [c for c in t.copies if c.op == "pack"]
    assert sum(c.nbytes for c in sent) == sum(comm.nbytes(x) for x in tensors)  # every byte sent once
    # buckets per type under the 64-byte cap: 3 small float32s, the big one, int64, float64
    assert len(sent) == len(t.transfers) == 4
    # ... and the one bucket of several tensors packed before, a local pass of its own; the buckets of
    # one tensor are sent as they are, since torch flattens a lone contiguous tensor into a view
    assert [c.nbytes for c in packed] == [16 + 12 + 16]
    assert all(c.src == c.dst for c in packed)
    before = out[1]._version
    out[0].add_(1)
    assert out[1]._version == before  # pieces of one bucket keep separate version counters


@pytest.mark.parametrize(
    "chunk",
    [[torch.randn(40)], [torch.randn(4, 5)], [torch.randn(5, 4).t()], [torch.randn(3), torch.randn(2)]],
    ids=["one 1-d", "one 2-d", "one transposed", "two"],
)
def test_a_pack_is_recorded_exactly_when_torch_flattening_copies(chunk):
    from torch._utils import _flatten_dense_tensors

    flat = _flatten_dense_tensors(chunk)
    copied = flat.untyped_storage().data_ptr() != chunk[0].untyped_storage().data_ptr()
    assert copied == (len(chunk) > 1 or not chunk[0].is_contiguous())  # torch's rule, as comm states it
    with comm.traffic() as t:
        comm._coalesced_copy(chunk, torch.device("cpu"), buffer_size=2**20)
    with comm.traffic() as r:
        comm.reduce_add_coalesced([chunk, [c.clone() for c in chunk]], "cpu", buffer_size=2**20)
    packed = [c.nbytes for c in t.copies if c.op == "pack"]
    assert packed == ([comm.nbytes(flat)] if copied else [])  # a pack only where torch copies
    assert len(t.transfers) == 1  # one bucket sent either way
    assert not [c for c in r.copies if c.op == "pack"]  # one device: summed tensor by tensor, no packing


def test_broadcast_coalesced_copies_have_their_own_version_counters():
    tensors = [torch.randn(3), torch.randn(3)]
    outs = comm.broadcast_coalesced(tensors, CPU2)
    before = outs[1][1]._version
    outs[1][0].add_(1)
    assert outs[1][1]._version == before  # an in-place update of one copy does not bump another's counter


def test_broadcast_coalesced_refuses_tensors_off_slot0():
    with pytest.raises(ValueError, match=r"must be on devices\[0\]"):
        comm.broadcast_coalesced([torch.ones(1)], ["meta", "cpu"])


def test_reduce_add_sums_onto_destination():
    x, y, z = torch.randn(4, 4), torch.randn(4, 4), torch.randn(4, 4)
    assert_close(comm.reduce_add([x, y, z]), x + y + z)  # the sum, in input order
    assert comm.reduce_add([x]) is x  # a single input comes back as it is
    with pytest.raises(ValueError, match="invalid size"):
        comm.reduce_add([x, torch.randn(3)])
    with pytest.raises(ValueError, match="dtype"):
        comm.reduce_add([x, y.double()])


def test_reduce_add_sparse():
    i = torch.tensor([[0, 2]])
    a = torch.sparse_coo_tensor(i, torch.tensor([1.0, 2.0]), (4,))
    b = torch.sparse_coo_tensor(i, torch.tensor([3.0, 4.0]), (4,))
    assert_close(comm.reduce_add([a, b]).to_dense(), a.to_dense() + b.to_dense())  # sparse sums stay right


def test_reduce_add_coalesced_equals_per_tensor_reduce_add():
    groups = [[torch.randn(3, 2), torch.randint(0, 9, (5,)), torch.randn(7)] for _ in range(3)]
    res = comm.reduce_add_coalesced(groups, buffer_size=32)
    for k, r in enumerate(res):
        assert_close(r, comm.reduce_add([g[k] for g in groups]))  # element k summed over the slots
        assert all(r.data_ptr() != g[k].data_ptr() for g in groups)  # a new tensor, not an input
    with pytest.raises(ValueError, match="holds 1 tensors"):
        comm.reduce_add_coalesced([[torch.ones(1), torch.ones(1)], [torch.ones(1)]])


def test_scatter_even_uneven_dims_and_views():
    x = torch.arange(24.0).view(6, 4)
    a, b = comm.scatter(x, CPU2)
    assert_close(a, x[:3])
    assert_close(b, x[3:])
    assert a.data_ptr() == x.data_ptr()  # a piece already on its device is a view, not a copy
    c, d = comm.scatter(x, CPU2, dim=1)
    assert_close(torch.cat([c, d], 1), x)  # dim 1
    e, f = comm.scatter(x, CPU2, dim=-2)
    assert_close(e, x[:3])  # negative dims count from the end
    g, h = comm.scatter(x, CPU2, chunk_sizes=(2, 4))
    assert g.shape[0] == 2 and h.shape[0] == 4  # explicit chunk sizes
    assert len(comm.scatter(torch.ones(3, 1), ["cpu"] * 4)) == 3  # chunk() may give fewer pieces than slots


def test_scatter_errors():
    x = torch.ones(6, 4)
    with pytest.raises(ValueError, match="same length"):
        comm.scatter(x, CPU2, chunk_sizes=(6,))
    with pytest.raises(ValueError, match="positive chunk size"):
        comm.scatter(x, CPU2, chunk_sizes=(0, 6))
    with pytest.raises(ValueError, match="sum to 5"):
        comm.scatter(x, CPU2, chunk_sizes=(2, 3))
    with pytest.raises(ValueError, match="at least one device"):
        comm.scatter(x, [])
    with pytest.raises(IndexError, match="out of range"):
        comm.scatter(x, CPU2, dim=2)


def test_gather_and_out_and_errors():
    a, b = torch.randn(2, 4), torch.randn(3, 4)
    assert_close(comm.gather([a, b]), torch.cat([a, b]))  # concatenated along dim 0
    out = torch.empty(5, 4)
    assert comm.gather([a, b], out=out) is out
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert comm.gather([a, b], destination=-1).device.type == "cpu"
    assert any(issubclass(x.category, FutureWarning) for x in w)  # -1 for CPU still works, deprecated
    with pytest.raises(ValueError, match="does not match"):
        comm.gather([a, torch.randn(2, 3)])
    with pytest.raises(IndexError, match="out of range"):
        comm.gather([a, b], dim=3)
    with pytest.raises(RuntimeError, match="'destination' must not be specified"):
        comm.gather([a, b], destination="cpu", out=out)


def test_memory_format_survives_scatter_and_gather():
    x = torch.randn(4, 3, 5, 5).contiguous(memory_format=torch.channels_last)
    pieces = comm.scatter(x, CPU2)
    assert all(p.is_contiguous(memory_format=torch.channels_last) for p in pieces)  # channels_last kept


def test_traffic_counts_every_copy():
    x = torch.randn(10, 10)
    with comm.traffic() as t:
        comm.broadcast(x, ["cpu"] * 3)
    assert t.bytes == 2 * x.numel() * x.element_size()  # two copies: slot 0 is the source itself
    assert t.by_op() == {"broadcast": t.bytes}
    with comm.traffic() as t2:
        comm.scatter(x, CPU2)
    assert t2.bytes == 0  # same-device pieces are views: nothing moved


def test_comm_records_no_autograd_history():
    a, b = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    assert comm.reduce_add([a, b]).grad_fn is None  # comm moves data; the graph is dpteach.functions' job
    assert comm.reduce_add_coalesced([[a], [b]])[0].grad_fn is None
    assert comm.broadcast(a, ["cpu", "cpu"])[1].grad_fn is None


def test_scatter_into_given_tensors():
    x = torch.arange(12.0).view(6, 2)
    out = [torch.empty(2, 2), torch.empty(4, 2)]
    with comm.traffic() as t:
        res = comm.scatter(x, out=out)
    assert res[0] is out[0] and res[1] is out[1]  # out= fills the given tensors, of the sizes they have
    assert_close(out[0], x[:2])
    assert_close(out[1], x[2:])
    assert t.bytes == comm.nbytes(x)  # every byte copied once
    with pytest.raises(RuntimeError, match="does not match"):
        comm.scatter(x, out=[torch.empty(2, 2)])
    with pytest.raises(RuntimeError, match="'devices' must not be specified"):
        comm.scatter(x, CPU2, out=out)
    with pytest.raises(RuntimeError, match="'chunk_sizes' must not be specified"):
        comm.scatter(x, chunk_sizes=(2, 4), out=out)


def test_empty_inputs_and_bad_dims_are_refused_with_a_sentence():
    with pytest.raises(ValueError, match="at least one input"):
        comm.reduce_add([])
    with pytest.raises(ValueError, match="at least one list"):
        comm.reduce_add_coalesced([])
    assert comm.reduce_add_coalesced([[], []]) == ()
    with pytest.raises(ValueError, match="at least one tensor"):
        comm.gather([])
    with pytest.raises(TypeError, match="dim must be an int"):
        comm.scatter(torch.ones(4), CPU2, dim=True)


def test_traffic_counts_sparse_tensors_and_says_what_it_saw():
    i = torch.tensor([[0, 2]])
    a = torch.sparse_coo_tensor(i, torch.tensor([1.0, 2.0]), (4,))
    assert comm.nbytes(a) == i.numel() * 8 + 2 * 4  # indices (int64) and values (float32), not the dense size
    with comm.traffic() as t:
        comm.broadcast(torch.ones(3), ["cpu"] * 2)
    assert repr(t) == "Traffic(12 bytes in 1 copies: broadcast=12)"
    with comm.traffic() as empty:
        pass
    assert "none" in repr(empty)
