"""The CUDA paths, traced on a CPU: which path each slot list takes, what torch is handed, which copies block.

No GPU is needed. CUDA is faked: ``torch.cuda.is_available`` and ``device_count`` are patched, CUDA
tensors are FakeTensors (``torch._subclasses.fake_tensor``: a device and a shape, no data), torch's
comm functions in ``torch.nn.parallel.comm`` are replaced by recorders, and every tensor copy
(``aten._to_copy``) is logged with its ``non_blocking`` flag. What this can check is the dispatch, not
the numbers; ``tests/core/test_cuda.py`` checks the numbers on a real GPU.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
import warnings

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

import dpteach
from dpteach import _devices, comm

pa = importlib.import_module("dpteach.parallel_apply")  # the module; dpteach.parallel_apply is the function

GPUS = 2
REAL_GPUS = torch.cuda.device_count()  # read before any test patches it


def needs_fake_cuda_1():
    """Skip where a real CUDA runtime has fewer GPUs than the fake: a FakeTensor on ``cuda:1`` still asks
    the real driver for that device there ("invalid device ordinal"). ``test_cuda.py`` covers such a machine."""
    if 0 < REAL_GPUS < GPUS:
        pytest.skip(f"this machine's real CUDA runtime has {REAL_GPUS} GPU, the fake needs cuda:1")


class CopyLog(TorchDispatchMode):
    """Logs every tensor copy between devices: (source device, destination device, non_blocking)."""

    def __init__(self):
        super().__init__()
        self.copies: list[tuple[str, str, bool]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default and "device" in kwargs:
            self.copies.append(
                (str(args[0].device), str(kwargs["device"]), bool(kwargs.get("non_blocking", False)))
            )
        return func(*args, **kwargs)

    def to(self, device: str) -> list[tuple[str, str, bool]]:
        return [c for c in self.copies if c[1] == device]


@pytest.fixture
def fake_cuda(monkeypatch):
    """Two fake GPUs: patched availability, recorders for torch's comm, fake CUDA tensors, a copy log."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: GPUS)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    calls: list[tuple[str, list[int]]] = []

    def broadcast_coalesced(tensors, devices, buffer_size=comm.BUFFER_SIZE):
        devices = list(devices)
        calls.append(("broadcast_coalesced", devices))
        assert len(set(devices)) == len(devices), "the fast path was handed a device twice"
        return tuple(tuple(t.to(f"cuda:{d}", copy=True) for t in tensors) for d in devices)

    def reduce_add(inputs, destination=None):
        calls.append(("reduce_add", [t.device.index for t in inputs]))
        assert len({t.device for t in inputs}) == len(inputs), "the fast path was handed a device twice"
        return sum(t.to(f"cuda:{destination}") for t in inputs)

    def reduce_add_coalesced(inputs, destination=None, buffer_size=comm.BUFFER_SIZE):
        calls.append(("reduce_add_coalesced", [g[0].device.index for g in inputs]))
        assert len({g[0].device for g in inputs}) == len(inputs), "the fast path was handed a device twice"
        return [sum(t.to(f"cuda:{destination}") for t in ts) for ts in zip(*inputs)]

    from torch.nn.parallel import comm as torch_comm

    for f in (broadcast_coalesced, reduce_add, reduce_add_coalesced):
        monkeypatch.setattr(torch_comm, f.__name__, f)
    log = CopyLog()
    with FakeTensorMode(allow_non_fake_inputs=True), log:
        yield calls, log


SLOT_LISTS = {  # slot list -> does it go to torch.nn.parallel.comm?
    "[0, 1]": ([0, 1], True),
    "['cuda:0', 'cuda:0']": (["cuda:0", "cuda:0"], False),
    "['cuda:0', 'cpu']": (["cuda:0", "cpu"], False),
    "['cpu', 'cuda:0']": (["cpu", "cuda:0"], False),
}


@pytest.mark.parametrize("name", SLOT_LISTS)
def test_which_path_each_slot_list_takes(fake_cuda, name):
    slots, fast = SLOT_LISTS[name]
    assert comm.fast_path(_devices.as_devices(slots)) is fast


def test_one_slot_and_complex_tensors_never_take_the_fast_path(fake_cuda):
    assert not comm.fast_path(_devices.as_devices([0]))  # nothing to copy
    assert not comm.fast_path(_devices.as_devices([0, 1]), [torch.zeros(2, dtype=torch.complex64)])


@pytest.mark.parametrize("name", SLOT_LISTS)
def test_broadcast_coalesced_hands_torch_distinct_gpus_only(fake_cuda, name):
    calls, log = fake_cuda
    slots, fast = SLOT_LISTS[name]
    devices = _devices.as_devices(slots)
    if fast:
        needs_fake_cuda_1()
    tensors = [
        torch.zeros(3, 2, device=devices[0]),
        torch.zeros(5, device=devices[0]),
        torch.zeros(4, dtype=torch.int64, device=devices[0]),
    ]
    out = comm.broadcast_coalesced(tensors, slots)
    assert calls == ([("broadcast_coalesced", [0, 1])] if fast else [])  # torch's fast path, or none at all
    assert out[0] == tensors  # slot 0 keeps the inputs themselves
    for device, replica in zip(devices, out):
        assert [t.device for t in replica] == [device] * len(tensors)  # every copy on its slot
        assert [t.shape for t in replica] == [t.shape for t in tensors]  # in the input order
        assert [t.dtype for t in replica] == [t.dtype for t in tensors]


@pytest.mark.parametrize("name", SLOT_LISTS)
def test_reduce_add_coalesced_hands_torch_distinct_gpus_only(fake_cuda, name):
    calls, log = fake_cuda
    slots, fast = SLOT_LISTS[name]
    devices = _devices.as_devices(slots)
    if fast:
        needs_fake_cuda_1()
    groups = [
        [torch.zeros(3, 2, device=d), torch.zeros(4, dtype=torch.int64, device=d), torch.zeros(5, device=d)]
        for d in devices
    ]
    out = comm.reduce_add_coalesced(groups, devices[0])
    assert calls == ([("reduce_add_coalesced", [0, 1])] if fast else [])
    assert [(t.device, t.shape, t.dtype) for t in out] == [(devices[0], t.shape, t.dtype) for t in groups[0]]


def test_reduce_add_onto_one_of_the_gpus_takes_the_fast_path(fake_cuda):
    needs_fake_cuda_1()
    calls, log = fake_cuda
    out = comm.reduce_add([torch.zeros(3, device="cuda:0"), torch.zeros(3, device="cuda:1")], 1)
    assert calls == [("reduce_add", [0, 1])] and out.device == torch.device("cuda:1")


def test_fast_path_traffic_counts_one_copy_per_bucket_and_its_packing(fake_cuda):
    needs_fake_cuda_1()
    # the NCCL path counts what the other paths count: per bucket one local pack, then one copy per GPU
    tensors = [torch.zeros(256, device="cuda:0") for _ in range(4)]  # 1 KiB each, two per 2 KiB bucket
    with comm.traffic() as t:
        comm.broadcast_coalesced(tensors, ["cuda:0", "cuda:1"], buffer_size=2048)
    assert [(c.op, c.nbytes, str(c.src), str(c.dst)) for c in t.copies] == [
        ("pack", 2048, "cuda:0", "cuda:0"),
        ("broadcast", 2048, "cuda:0", "cuda:1"),
    ] * 2
    groups = [[torch.zeros(256, device=d) for _ in range(4)] for d in ("cuda:0", "cuda:1")]
    with comm.traffic() as t:
        comm.reduce_add_coalesced(groups, "cuda:0", buffer_size=2048)
    assert [(c.op, str(c.src), str(c.dst)) for c in t.copies] == [
        ("pack", "cuda:0", "cuda:0"),
        ("pack", "cuda:1", "cuda:1"),
        ("reduce_add", "cuda:1", "cuda:0"),
    ] * 2
    assert t.by_op() == {"pack": 2 * 4096, "reduce_add": 4096}
    with comm.traffic() as t:  # 1 KiB buckets: one tensor each, which torch flattens into a view
        comm.broadcast_coalesced(tensors, ["cuda:0", "cuda:1"], buffer_size=1024)
    assert [c.op for c in t.copies] == ["broadcast"] * 4


def test_copies_onto_the_cpu_block_and_onto_a_gpu_need_not(fake_cuda):
    needs_fake_cuda_1()
    calls, log = fake_cuda
    pieces = [torch.zeros(2, 3, device="cuda:0"), torch.zeros(2, 3, device="cuda:1")]
    comm.gather(pieces, 0, "cpu")  # output_device="cpu"; Scatter.backward for CPU inputs
    comm.reduce_add(pieces, "cpu")  # the sum onto the CPU
    comm.reduce_add_coalesced([[p] for p in pieces], "cpu")
    comm.broadcast_coalesced([pieces[0]], ["cuda:0", "cpu"])
    onto_cpu = log.to("cpu")
    assert len(onto_cpu) >= 6  # every path above copied from a GPU to the CPU
    assert not any(nb for _, _, nb in onto_cpu), f"a copy onto the CPU did not block: {onto_cpu}"
    comm.gather(pieces, 0, "cuda:0")  # onto a GPU the copy is stream-ordered, as torch's gather makes it
    assert log.to("cuda:0")[-1] == ("cuda:1", "cuda:0", True)


def test_non_blocking_decision():
    assert comm.non_blocking(torch.device("cuda", 0))
    assert not comm.non_blocking(torch.device("cpu"))


def test_fast_path_functions_come_from_a_module_torch_imports():
    # ``import torch`` does not import torch.cuda.comm; torch.nn.parallel.comm is where torch's own
    # DataParallel takes these functions from
    from torch.nn.parallel import comm as torch_comm

    assert comm.torch_comm is torch_comm
    for name in ("broadcast_coalesced", "reduce_add", "reduce_add_coalesced"):
        assert callable(getattr(comm.torch_comm, name))


# ---- mixing device types: grouping by tensor.type() would break these; meta is a real device


def test_broadcast_coalesced_from_cpu_onto_another_device_type():
    tensors = [torch.randn(3, 2), torch.arange(4), torch.randn(5), torch.arange(2, dtype=torch.int32)]
    out = comm.broadcast_coalesced(tensors, ["cpu", "meta"], buffer_size=24)
    assert [(t.device.type, t.shape, t.dtype) for t in out[1]] == [
        ("meta", t.shape, t.dtype) for t in tensors
    ]


def test_reduce_add_coalesced_onto_another_device_type():
    groups = [[torch.randn(3, 2), torch.arange(4), torch.randn(5)] for _ in range(2)]
    out = comm.reduce_add_coalesced(groups, "meta", buffer_size=24)
    assert [(t.device.type, t.shape, t.dtype) for t in out] == [("meta", t.shape, t.dtype) for t in groups[0]]


def test_reduce_add_coalesced_across_device_types_keeps_values_and_order():
    groups = [
        [torch.full((2,), 1.0), torch.arange(3), torch.full((4,), 2.0)],
        [torch.full((2,), 10.0), torch.arange(3) * 10, torch.full((4,), 20.0)],
    ]
    out = comm.reduce_add_coalesced(groups, "cpu", buffer_size=8)
    for got, *parts in zip(out, *groups):
        torch.testing.assert_close(got, sum(parts))


# ---- parallel_apply: the caller's current stream on each device, as torch's parallel_apply


def test_parallel_apply_runs_each_replica_on_the_callers_stream(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: GPUS)
    read_in, entered = [], []

    def current_stream(device=None):
        read_in.append((torch.device(device).index, threading.current_thread().name))
        return f"stream of {threading.current_thread().name} on {device}"

    @contextlib.contextmanager
    def stream(s):
        entered.append((threading.current_thread().name, s))
        yield

    monkeypatch.setattr(torch.cuda, "current_stream", current_stream)
    monkeypatch.setattr(torch.cuda, "stream", stream)
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    caller = threading.current_thread().name
    modules = [nn.Identity(), nn.Identity()]
    pa.parallel_apply(modules, [(torch.zeros(1),), (torch.zeros(1),)], devices=["cuda:0", "cuda:1"])
    assert sorted(read_in) == [(0, caller), (1, caller)]  # read once per device, in the calling thread
    assert sorted(s for _, s in entered) == [f"stream of {caller} on cuda:0", f"stream of {caller} on cuda:1"]


def test_caller_stream_is_none_off_the_gpu():
    assert pa.caller_stream(torch.device("cpu")) is None and pa.caller_stream(None) is None


# ---- the rest of the likely breaks, each decided without a GPU


def test_nccl_without_cuda_is_one_clear_sentence(monkeypatch):
    from dpteach.distributed import launch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    ranks = None
    try:
        with pytest.raises(RuntimeError, match=r"backend='nccl' needs a CUDA GPU .* use backend='gloo'"):
            ranks = launch.Ranks(2, backend="nccl", timeout=10)
    finally:
        if ranks is not None:
            ranks.close(grace=0.0)


def test_nccl_with_fewer_gpus_than_ranks_is_one_clear_sentence(monkeypatch):
    from dpteach.distributed import launch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    ranks = None
    try:
        with pytest.raises(RuntimeError, match=r"2 ranks, but only 1 GPU\(s\) exist"):
            ranks = launch.Ranks(2, backend="nccl", timeout=10)
    finally:
        if ranks is not None:
            ranks.close(grace=0.0)


def test_data_parallel_takes_output_device_minus_one_as_torch_does():
    model = nn.Linear(3, 2)
    with pytest.warns(FutureWarning, match="-1 to represent CPU"):
        dp = dpteach.DataParallel(model, ["cpu", "cpu"], output_device=-1)
    assert dp.output_device == torch.device("cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        out = dpteach.data_parallel(model, torch.randn(4, 3), ["cpu", "cpu"], output_device=-1)
    assert out.device == torch.device("cpu") and out.shape == (4, 2)


def test_the_timer_waits_for_every_gpu_around_each_timed_call(monkeypatch):
    from dpteach.measure import timer

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: GPUS)
    events = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda index=None: events.append(f"sync{index}"))
    threads = torch.get_num_threads()
    timer.time_in_turns(
        {"a": lambda: events.append("a"), "b": lambda: events.append("b")},
        ["cuda:1", "cuda:0", "cuda:1"],
        repeats=2,
        warmup=0,
    )
    around = ["sync0", "sync1"]
    assert events == [*around, "a", *around, *around, "b", *around] * 2  # in turns, each GPU waited for once
    assert torch.get_num_threads() == threads  # GPU slots only: the CPU's threads are left alone


def test_cpp_build_option_only_where_torch_has_it():
    from dpteach.cpp import _build

    def old_load_inline(name, cpp_sources, extra_cflags=None, build_directory=None, verbose=False):
        pass

    def new_load_inline(
        name, cpp_sources, extra_cflags=None, build_directory=None, verbose=False, no_implicit_headers=False
    ):
        pass

    assert _build.header_options(old_load_inline) == {}  # torch 2.4 to 2.7
    assert _build.header_options(new_load_inline) == {"no_implicit_headers": True}


def test_costs_copy_coalesced_onto_another_device_type():
    from dpteach.measure import costs

    tensors = [torch.randn(3, 2), torch.arange(4), torch.randn(5)]
    out = costs.copy_coalesced(tensors, "meta", buffer_size=24)
    assert [(t.device.type, t.shape, t.dtype) for t in out] == [("meta", t.shape, t.dtype) for t in tensors]
