"""Device-agnostic counterparts of ``torch.cuda.comm``: broadcast, reduce, scatter and gather.

PyTorch's ``torch.cuda.comm`` works between GPUs: it refuses CPU destinations for broadcast and
scatter, and CPU inputs to ``reduce_add`` and ``gather`` (a CPU source for broadcast or scatter is
accepted, and so is a CPU destination for gather). These functions keep its names, signatures and
semantics but work on any list of slots, duplicates allowed: ``["cpu", "cpu"]``, ``["cuda:0",
"cuda:0"]`` or ``[0, 1, 2, 3]``. When every slot is a distinct CUDA device they hand the work to
``torch.nn.parallel.comm`` (NCCL where it is there); the results are the same. Which path a slot list
takes, and which copies block, is decided by two small functions, :func:`fast_path` and
:func:`non_blocking`.

Two rules give the slots their meaning:

* the first slot on a tensor's own device gets the tensor itself (as ``torch.cuda.comm`` returns the
  source tensor on its own device), every other slot gets a copy that owns its storage, even on the
  same physical device;
* every copy made here is counted, so ``with dpteach.comm.traffic() as t: ...`` tells how many bytes
  each step really moved (chapter 06).
"""

from __future__ import annotations

import contextlib
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

# ``import torch`` does not import torch.cuda.comm; torch's own DataParallel imports these functions
# from torch.nn.parallel.comm, where they live (torch.cuda.comm only re-exports them).
from torch.nn.parallel import comm as torch_comm

from ._devices import DeviceLike, as_device, as_devices, as_output_device, distinct_cuda

__all__ = [
    "broadcast",
    "broadcast_coalesced",
    "reduce_add",
    "reduce_add_coalesced",
    "scatter",
    "gather",
    "traffic",
    "Traffic",
    "nbytes",
]

BUFFER_SIZE = 10 * 1024 * 1024  # torch.cuda.comm's default bucket: 10 MiB


# --------------------------------------------------------------------------------------------
# Counting the bytes every copy moves
# --------------------------------------------------------------------------------------------


@dataclass
class Copy:
    """One copy made by dpteach: what asked for it, how many bytes, from where to where."""

    op: str
    nbytes: int
    src: torch.device
    dst: torch.device

    @property
    def crosses_devices(self) -> bool:
        return self.src != self.dst


@dataclass
class Traffic:
    """Every copy recorded while a ``traffic()`` block was open."""

    copies: list[Copy] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(c.nbytes for c in self.copies)

    @property
    def transfers(self) -> list[Copy]:
        """The copies that carry data to where it is used: every copy but the local ``"pack"`` passes."""
        return [c for c in self.copies if c.op != "pack"]

    @property
    def cross_device_bytes(self) -> int:
        return sum(c.nbytes for c in self.copies if c.crosses_devices)

    def by_op(self) -> dict[str, int]:
        """Bytes per operation name, e.g. ``{'broadcast': ..., 'reduce_add': ...}``."""
        totals: dict[str, int] = defaultdict(int)
        for c in self.copies:
            totals[c.op] += c.nbytes
        return dict(totals)

    def __repr__(self) -> str:
        parts = ", ".join(f"{op}={n:,}" for op, n in sorted(self.by_op().items()))
        return f"Traffic({self.bytes:,} bytes in {len(self.copies)} copies: {parts or 'none'})"


_meters: list[Traffic] = []
_meters_lock = threading.Lock()


@contextlib.contextmanager
def traffic() -> Iterator[Traffic]:
    """Record every copy dpteach makes while the block is open (replicate, scatter, gather, reduce),
    including the local pass that packs tensors into a flat bucket before it travels (op ``"pack"``,
    ``src == dst``): coalescing saves copy calls, not bytes. A bucket of one contiguous tensor is
    not packed: torch flattens it into a view of itself (see ``_packs``).

    The meter counts the copies of *every* thread, not only the caller's: the replicas' threads
    and backward's copies belong to the step being measured, and so would another thread's step
    running at the same time. Blocks nest and may close in any order, from any thread; each block
    sees every copy made while it was open.
    """
    meter = Traffic()
    with _meters_lock:
        _meters.append(meter)
    try:
        yield meter
    finally:
        with _meters_lock:
            # by identity: two meters that saw the same copies are equal, and list.remove would take the wrong one
            _meters[:] = [m for m in _meters if m is not meter]


def nbytes(tensor: torch.Tensor) -> int:
    """Bytes of a tensor's data (values and indices for a sparse tensor)."""
    if tensor.is_sparse:
        return nbytes(tensor._indices()) + nbytes(tensor._values())
    return tensor.numel() * tensor.element_size()


def record(op: str, count: int, src: torch.device, dst: torch.device) -> None:
    """Tell the open ``traffic()`` blocks that ``count`` bytes were copied (used by the strategies too)."""
    if _meters:
        with _meters_lock:
            for meter in _meters:
                meter.copies.append(Copy(op, count, src, dst))


def copy_to(tensor: torch.Tensor, device: torch.device, op: str) -> torch.Tensor:
    """A copy of ``tensor`` on ``device`` that owns its storage (and its own version counter).

    Copies are data, not graph: autograd history is the business of ``dpteach.functions``.
    """
    record(op, nbytes(tensor), tensor.device, device)
    tensor = tensor.detach()
    if tensor.device == device:
        return tensor.clone()
    return tensor.to(device, copy=True)


def fast_path(devices: Sequence[torch.device], tensors: Sequence[torch.Tensor] = ()) -> bool:
    """True when a slot list goes to ``torch.nn.parallel.comm``: two or more slots, each a different
    CUDA device, and no complex tensors. Every other list (``["cuda:0", "cuda:0"]``, one slot, any
    CPU slot) takes dpteach's own copies."""
    return len(devices) > 1 and distinct_cuda(devices) and not any(t.is_complex() for t in tensors)


def non_blocking(destination: torch.device) -> bool:
    """Whether a copy onto ``destination`` may return before the data has arrived.

    Only onto a GPU, where the next kernel on the stream waits for it; a copy onto the CPU is read by
    the CPU at once, so it must block. torch's gather decides the same way (``non_blocking`` is
    ``out_tensor.is_cuda()`` in ``torch/csrc/cuda/comm.cpp``).
    """
    return destination.type == "cuda"


def _packs(chunk: Sequence[torch.Tensor]) -> bool:
    """Whether flattening ``chunk`` into one buffer copies it: torch's ``flatten_dense_tensors``
    (``aten/src/ATen/native/TensorShape.cpp``) returns a lone tensor as ``t.contiguous().view({-1})``,
    a view of it when it is contiguous, and concatenates (copies) anything more."""
    return len(chunk) > 1 or not chunk[0].is_contiguous()


def _buckets(tensors: Sequence[torch.Tensor], size_limit: int) -> list[list[int]]:
    """Indices of ``tensors`` in buckets of one dtype and layout, each at most ``size_limit`` bytes
    (a bucket holds at least one tensor). Like ``torch._utils._take_tensors``, but by index and
    blind to the device, so lists whose copies land on another device type reorder safely
    (torch groups by ``tensor.type()``, which differs between ``cpu`` and ``cuda``)."""
    open_: dict[tuple, list] = {}
    done: list[list[int]] = []
    for i, t in enumerate(tensors):
        key = (t.dtype, t.layout)
        size = nbytes(t)
        bucket = open_.setdefault(key, [[], 0])
        if bucket[1] + size > size_limit and bucket[1] > 0:
            done.append(bucket[0])
            bucket = open_[key] = [[], 0]
        bucket[0].append(i)
        bucket[1] += size
    return done + [b[0] for b in open_.values() if b[0]]


def _cpp_buckets(tensors: Sequence[torch.Tensor], size_limit: int) -> list[list[int]]:
    """Indices of ``tensors`` in the buckets torch's C++ ``broadcast_coalesced`` makes: the rule of
    ``torch::utils::take_tensors`` (``torch/csrc/utils/tensor_flatten.cpp``), which
    ``torch/csrc/cuda/comm.cpp`` calls. A tensor joins the open bucket of its type first, and the
    bucket closes once its size reaches ``size_limit`` (``>=``), so it may end one tensor past the
    limit, where :func:`_buckets` (the Python rule) closes before. Two 6 MiB float32 tensors under
    10 MiB make one bucket here, two there. Buckets still open at the end follow in order of first
    use (torch orders them by type id; the bytes counted are the same)."""
    open_: dict[tuple, list] = {}
    done: list[list[int]] = []
    for i, t in enumerate(tensors):
        key = (t.dtype, t.layout)
        if t.is_sparse:  # take_tensors sizes a sparse tensor's values by its indices' element size
            indices, values = t._indices(), t._values()
            size = (indices.numel() + values.numel()) * indices.element_size()
        else:
            size = nbytes(t)
        bucket = open_.setdefault(key, [[], 0])
        bucket[0].append(i)
        bucket[1] += size
        if bucket[1] >= size_limit:
            done.append(bucket[0])
            del open_[key]
    return done + [b[0] for b in open_.values()]


def _check_dim(dim: int, ndim: int, what: str) -> int:
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise TypeError(f"{what}: dim must be an int, got {dim!r}")
    if ndim == 0 or not -ndim <= dim < ndim:
        raise IndexError(
            f"{what}: dim {dim} is out of range for a tensor of {ndim} dimension(s) "
            f"(valid: {-ndim} to {ndim - 1})"
            if ndim
            else f"{what}: cannot split or join 0-d tensors along dim {dim}"
        )
    return dim % ndim


# --------------------------------------------------------------------------------------------
# Broadcast
# --------------------------------------------------------------------------------------------


def broadcast(
    tensor: torch.Tensor, devices: Sequence[DeviceLike] | None = None, *, out=None
) -> tuple[torch.Tensor, ...]:
    """Copy ``tensor`` to every slot; the first slot on its own device gets the tensor itself.

    Exactly one of ``devices`` and ``out`` is given, as in ``torch.cuda.comm.broadcast``.
    """
    if (devices is None) == (out is None):
        raise RuntimeError(
            f"Exactly one of 'devices' and 'out' must be specified, but got devices={devices} and out={out}"
        )
    if out is not None:
        out = list(out)
        for i, o in enumerate(out):
            if o.shape != tensor.shape:
                raise RuntimeError(
                    f"Expected all output tensors to have same shape as the source tensor {tuple(tensor.shape)}, "
                    f"but output tensor at index {i} has shape {tuple(o.shape)}"
                )
        for o in out:
            record("broadcast", nbytes(tensor), tensor.device, o.device)
            with torch.no_grad():
                o.copy_(tensor)
        return tuple(out)
    slots = as_devices(devices)
    aliased = False
    result = []
    for device in slots:
        if device == tensor.device and not aliased:
            aliased = True
            result.append(tensor)
        else:
            result.append(copy_to(tensor, device, "broadcast"))
    return tuple(result)


def broadcast_coalesced(
    tensors: Sequence[torch.Tensor], devices: Sequence[DeviceLike], buffer_size: int = BUFFER_SIZE
) -> list[list[torch.Tensor]]:
    """Broadcast a list of tensors, all on ``devices[0]``; slot 0's outputs are the inputs as they are.

    Between distinct devices small tensors travel flattened into buckets of about
    ``buffer_size`` bytes (fewer, larger copies; see :func:`_buckets` and :func:`_cpp_buckets`); onto the same device each tensor is cloned
    directly, one pass over memory. Every copy gets its own version counter, so an in-place
    update of one replica's buffer never trips autograd on another's
    (NOTE [Version Counter in comm.*_coalesced] in PyTorch).
    """
    slots = as_devices(devices)
    tensors = list(tensors)
    for i, t in enumerate(tensors):
        if t.device != slots[0]:
            raise ValueError(
                f"broadcast_coalesced: all tensors must be on devices[0] ({slots[0]}), but tensor {i} is on {t.device}"
            )
    if fast_path(slots, tensors):
        outs = torch_comm.broadcast_coalesced(tensors, [d.index for d in slots], buffer_size)
        # the logical count, as on the other paths: torch's comm.cpp packs each bucket once on slot 0
        # and hands it to NCCL, whose own route between the GPUs is not counted; its buckets are
        # C++ take_tensors' (closed at >= the limit), not the Python rule of the other paths
        for bucket in _cpp_buckets(tensors, buffer_size):
            size = sum(nbytes(tensors[i]) for i in bucket)
            if not tensors[bucket[0]].is_sparse and _packs([tensors[i] for i in bucket]):
                record("pack", size, slots[0], slots[0])
            for device in slots[1:]:
                record("broadcast", size, slots[0], device)
        return [list(tensors)] + [list(o) for o in outs[1:]]
    result = [list(tensors)]
    for device in slots[1:]:
        if device == slots[0]:
            result.append([copy_to(t, device, "broadcast") for t in tensors])
        else:
            result.append(_coalesced_copy(tensors, device, buffer_size))
    return result


def _coalesced_copy(
    tensors: list[torch.Tensor], device: torch.device, buffer_size: int
) -> list[torch.Tensor]:
    """Copy tensors to another device in flat buckets, then hand back per-tensor pieces."""
    out: list[torch.Tensor | None] = [None] * len(tensors)
    for bucket in _buckets(tensors, buffer_size):
        chunk = [tensors[i] for i in bucket]
        if chunk[0].is_sparse:
            for i, t in zip(bucket, chunk):
                out[i] = copy_to(t, device, "broadcast")
            continue
        flat = _flatten_dense_tensors(chunk)
        if _packs(chunk):  # a full local copy too; a lone contiguous tensor's flat form is a view
            record("pack", nbytes(flat), flat.device, flat.device)
        moved = copy_to(flat, device, "broadcast")
        # pieces of one flat buffer would share a version counter; .data gives each its own
        for i, t in zip(bucket, _unflatten_dense_tensors(moved, chunk)):
            out[i] = t.data
    return out


# --------------------------------------------------------------------------------------------
# Reduce
# --------------------------------------------------------------------------------------------


def reduce_add(inputs: Sequence[torch.Tensor], destination: DeviceLike | None = None) -> torch.Tensor:
    """Sum tensors from several slots onto ``destination`` (default: the first input's device).

    Like every function here it moves data and records no autograd history, on one device as
    across several; ``dpteach.functions.ReduceAddCoalesced`` is the differentiable form. The
    ``traffic()`` meter records one ``reduce_add`` copy per input not on ``destination``: a logical
    count (N - 1 tensors are summed into the destination). On the NCCL path NCCL decides how the
    data moves between the GPUs, so the records do not say which bytes crossed which link.
    """
    with torch.no_grad():
        return _reduce_add(list(inputs), destination)


def _reduce_add(inputs: list[torch.Tensor], destination: DeviceLike | None) -> torch.Tensor:
    if not inputs:
        raise ValueError("reduce_add expects at least one input tensor")
    dest = inputs[0].device if destination is None else as_device(destination)
    size, dtype = inputs[0].size(), inputs[0].dtype
    for i, t in enumerate(inputs):
        if t.size() != size:
            got, expected = "x".join(map(str, t.size())), "x".join(map(str, size))
            raise ValueError(f"input {i} has invalid size: got {got}, but expected {expected}")
        if t.dtype != dtype:
            raise ValueError(
                f"input {i} has dtype {t.dtype}, but input 0 has {dtype}; reduce_add adds like dtypes only"
            )
    if len(inputs) == 1:
        return inputs[0] if inputs[0].device == dest else copy_to(inputs[0], dest, "reduce_add")
    devices = [t.device for t in inputs]
    if fast_path(devices, inputs[:1]) and dest in devices:
        for t in inputs:
            if t.device != dest:
                record("reduce_add", nbytes(t), t.device, dest)
        return torch_comm.reduce_add(inputs, dest.index)
    root = next((i for i, t in enumerate(inputs) if t.device == dest), None)
    if root is None:
        result = copy_to(inputs[0], dest, "reduce_add")
        others = inputs[1:]
    else:
        others = [t for i, t in enumerate(inputs) if i != root]
        first = others.pop(0)
        result = inputs[root] + _moved(first, dest)  # a new tensor, no extra clone
    for other in others:
        result.add_(_moved(other, dest))
    return result


def _moved(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` on ``device``: itself when already there, else a counted copy."""
    if tensor.device == device:
        return tensor
    record("reduce_add", nbytes(tensor), tensor.device, device)
    return tensor.to(device, non_blocking=non_blocking(device))


def reduce_add_coalesced(
    inputs: Sequence[Sequence[torch.Tensor]],
    destination: DeviceLike | None = None,
    buffer_size: int = BUFFER_SIZE,
) -> tuple[torch.Tensor, ...]:
    """Sum lists of tensors, one list per slot, element by element, onto ``destination``.

    Across distinct devices dense tensors travel flattened in buckets; on one device each
    tensor is summed in place of flattening, which would only add two passes over memory.
    Sparse tensors are reduced one by one. Outputs have their own version counters.
    """
    with torch.no_grad():
        return _reduce_add_coalesced([list(g) for g in inputs], destination, buffer_size)


def _reduce_add_coalesced(
    groups: list[list[torch.Tensor]], destination, buffer_size: int
) -> tuple[torch.Tensor, ...]:
    if not groups:
        raise ValueError("reduce_add_coalesced expects at least one list of tensors")
    n = len(groups[0])
    for i, g in enumerate(groups):
        if len(g) != n:
            raise ValueError(f"reduce_add_coalesced: list {i} holds {len(g)} tensors, but list 0 holds {n}")
    if n == 0:
        return ()
    dest = groups[0][0].device if destination is None else as_device(destination)
    devices = [g[0].device for g in groups]
    if fast_path(devices, groups[0]) and dest in devices:
        # the logical count, as on the other paths: torch packs each dense bucket on every GPU
        # (torch/nn/parallel/comm.py) and sums the flat buckets onto ``dest``
        for bucket in _buckets(groups[0], buffer_size):
            for g in groups:
                size = sum(nbytes(g[i]) for i in bucket)
                if not g[bucket[0]].is_sparse and _packs([g[i] for i in bucket]):
                    record("pack", size, g[0].device, g[0].device)
                if g[0].device != dest:
                    record("reduce_add", size, g[0].device, dest)
        return tuple(torch_comm.reduce_add_coalesced(groups, dest.index, buffer_size))
    if all(t.device == dest for g in groups for t in g):
        return tuple(reduce_add(ts, dest) for ts in zip(*groups))
    # Across devices: PyTorch's algorithm, sparse first, then dense in flat buckets.
    # outputs are placed by index, not matched by tensor.type(), which differs between device types
    output: list[torch.Tensor | None] = [None] * n
    dense: list[list[torch.Tensor]] = [[] for _ in groups]
    dense_at: list[int] = []
    for k, at_slots in enumerate(zip(*groups)):
        if all(t.is_sparse for t in at_slots):
            output[k] = reduce_add(at_slots, dest)
        else:
            for coll, t in zip(dense, at_slots):
                coll.append(t.to_dense() if t.is_sparse else t)
            dense_at.append(k)
    for bucket in _buckets(dense[0], buffer_size):
        chunks = [[ts[i] for i in bucket] for ts in dense]
        flats = [_flatten_dense_tensors(c) for c in chunks]
        for c, f in zip(chunks, flats):
            if _packs(c):  # a full local copy too; a lone contiguous tensor's flat form is a view
                record("pack", nbytes(f), f.device, f.device)
        flat = reduce_add(flats, dest)
        for i, t in zip(bucket, _unflatten_dense_tensors(flat, chunks[0])):
            output[dense_at[i]] = t.data
    return tuple(output)


# --------------------------------------------------------------------------------------------
# Scatter and gather
# --------------------------------------------------------------------------------------------


def scatter(
    tensor: torch.Tensor,
    devices: Sequence[DeviceLike] | None = None,
    chunk_sizes: Sequence[int] | None = None,
    dim: int = 0,
    streams=None,
    *,
    out=None,
) -> tuple[torch.Tensor, ...]:
    """Split ``tensor`` along ``dim`` and place piece ``i`` on slot ``i``.

    Without ``chunk_sizes`` it uses ``tensor.chunk(len(devices), dim)``, which may give fewer
    pieces than slots (3 rows over 4 slots give 3 pieces), exactly as PyTorch does. A piece that
    is already on its slot's device is a view, not a copy.
    """
    dim = _check_dim(dim, tensor.dim(), "scatter")
    if out is not None:
        if devices is not None:
            raise RuntimeError(
                f"'devices' must not be specified when 'out' is specified, but got devices={devices}"
            )
        if chunk_sizes is not None:
            raise RuntimeError(
                f"'chunk_sizes' must not be specified when 'out' is specified, but got chunk_sizes={chunk_sizes}"
            )
        out = list(out)
        sizes = [o.size(dim) for o in out]
        if sum(sizes) != tensor.size(dim):
            raise RuntimeError(
                f"Total size for output tensors along scatter dim ({sum(sizes)}) does not match "
                f"the size of input tensor ({tensor.size(dim)})"
            )
        for o, piece in zip(out, tensor.split(sizes, dim)):
            record("scatter", nbytes(piece), piece.device, o.device)
            with torch.no_grad():
                o.copy_(piece)
        return tuple(out)
    if devices is None or len(list(devices)) == 0:
        raise ValueError("Expected at least one device to scatter to")
    slots = as_devices(devices)
    if chunk_sizes is None:
        pieces = tensor.chunk(len(slots), dim)
    else:
        chunk_sizes = list(chunk_sizes)
        if len(chunk_sizes) != len(slots):
            raise ValueError(
                "Expected devices and chunk_sizes to be of same length, but got "
                f"len(devices) = {len(slots)} and len(chunk_sizes) = {len(chunk_sizes)}"
            )
        for size in chunk_sizes:
            if size <= 0:
                raise ValueError(f"Expected positive chunk size, but got {size}")
        if sum(chunk_sizes) != tensor.size(dim):
            raise ValueError(
                f"Chunk sizes sum to {sum(chunk_sizes)}, but the tensor has {tensor.size(dim)} along dim {dim}"
            )
        pieces = tensor.split(chunk_sizes, dim)
    result = []
    for i, (piece, device) in enumerate(zip(pieces, slots)):
        if piece.device == device:
            result.append(piece)
            continue
        record("scatter", nbytes(piece), piece.device, device)
        stream = streams[i] if streams is not None else None
        ctx = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
        with ctx:
            result.append(piece.to(device, non_blocking=stream is not None and non_blocking(device)))
    return tuple(result)


def gather(
    tensors: Sequence[torch.Tensor], dim: int = 0, destination: DeviceLike | None = None, *, out=None
) -> torch.Tensor:
    """Concatenate tensors from several slots along ``dim`` on ``destination`` (default: the first's device)."""
    tensors = list(tensors)
    if not tensors:
        raise ValueError("Expected at least one tensor to gather from")
    ndim = tensors[0].dim()
    dim = _check_dim(dim, ndim, "gather")
    for i, t in enumerate(tensors):
        if t.dim() != ndim or any(t.size(d) != tensors[0].size(d) for d in range(ndim) if d != dim):
            raise ValueError(
                f"gather: tensor {i} has shape {tuple(t.shape)}, which does not match tensor 0's "
                f"{tuple(tensors[0].shape)} outside dim {dim}"
            )
    if out is not None:
        if destination is not None:
            raise RuntimeError(
                f"'destination' must not be specified when 'out' is specified, but got destination={destination}"
            )
        dest = out.device
    else:
        dest = tensors[0].device if destination is None else as_output_device(destination)  # -1: the CPU
    for t in tensors:
        record("gather", nbytes(t), t.device, dest)
    moved = [t if t.device == dest else t.to(dest, non_blocking=non_blocking(dest)) for t in tensors]
    if out is not None:
        return torch.cat(moved, dim, out=out)
    return torch.cat(moved, dim)
