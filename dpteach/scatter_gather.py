"""Split nested inputs over the slots and join nested outputs back: tuples, lists, dicts,
namedtuples and dataclasses (PyTorch passes dataclasses through unsplit and cannot gather them:
issues #41327, #45840).

Non-tensors are shared between replicas, not copied: every slot sees the same object.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Sequence

import torch
from torch.nn.utils.rnn import PackedSequence

from ._devices import DeviceLike, as_device, as_devices
from .functions import Gather, Scatter

__all__ = ["scatter", "scatter_kwargs", "gather"]


PACKED = (
    "its fields are not batch-aligned (data holds every sequence's steps interleaved, batch_sizes one count per "
    "time step), so splitting each field would give every slot half the time steps of every sequence. Pass the "
    "padded batch and its lengths instead, and pack inside forward: nn.utils.rnn.pack_padded_sequence(x, "
    "lengths, enforce_sorted=False), then pad_packed_sequence(out, total_length=x.size(1)) before returning, "
    "so every slot's output has the same length"
)


def _is_namedtuple(obj: Any) -> bool:
    return isinstance(obj, tuple) and hasattr(obj, "_asdict") and hasattr(obj, "_fields")


def _is_dataclass_instance(obj: Any) -> bool:
    return dataclasses.is_dataclass(obj) and not isinstance(obj, type)


def _dataclass_fields(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


def _rebuild_dataclass(template: Any, values: dict[str, Any]) -> Any:
    """A copy of ``template`` with new field values; works for frozen and ``init=False`` fields too."""
    out = copy.copy(template)
    for name, value in values.items():
        object.__setattr__(out, name, value)
    return out


def scatter(inputs: Any, target_gpus: Sequence[DeviceLike], dim: int = 0) -> list[Any]:
    """Slice tensors into roughly equal chunks, one per slot; everything else is shared.

    The result has one entry per chunk, which can be fewer than the slots when a batch is small.
    Tensors that would split into different numbers of pieces (a batch of 8 beside a tensor of 1
    row) are refused: torch would silently drop the extra pieces.
    """
    slots = as_devices(target_gpus, "target_gpus")
    result, pieces = _scatter(inputs, slots, dim, "inputs")
    return result[: _check_pieces(pieces, dim, len(slots))]


def _scatter(
    inputs: Any, slots: list, dim: int, root: str
) -> tuple[list[Any], dict[str, tuple[int, int, torch.Tensor]]]:
    """Scatter ``inputs``; also say, for each tensor by its path, its size along ``dim``, how many pieces
    it gave, and the tensor."""
    pieces: dict[str, tuple[int, int, torch.Tensor]] = {}

    def scatter_map(obj, path):
        if isinstance(obj, torch.Tensor):
            _check_splittable(obj, path, dim, slots)
            out = Scatter.apply(slots, None, dim, obj)
            pieces[path] = (obj.size(dim), len(out), obj)
            return out
        if isinstance(obj, PackedSequence):  # a namedtuple, but not one to split field by field
            raise ValueError(
                f"scatter: {path} is a PackedSequence, which cannot be split over the slots: {PACKED}"
            )
        if _is_namedtuple(obj):
            return [
                type(obj)(*args)
                for args in zip(*(scatter_map(v, f"{path}.{k}") for k, v in zip(obj._fields, obj)))
            ]
        if _is_dataclass_instance(obj):
            fields = _dataclass_fields(obj)
            if fields:
                names = list(fields)
                per_slot = zip(*(scatter_map(v, f"{path}.{k}") for k, v in fields.items()))
                return [_rebuild_dataclass(obj, dict(zip(names, vals))) for vals in per_slot]
        if isinstance(obj, tuple) and len(obj) > 0:
            return list(zip(*(scatter_map(v, f"{path}[{i}]") for i, v in enumerate(obj))))
        if isinstance(obj, list) and len(obj) > 0:
            return [list(i) for i in zip(*(scatter_map(v, f"{path}[{i}]") for i, v in enumerate(obj)))]
        if isinstance(obj, dict) and len(obj) > 0:
            items = [[(k, piece) for piece in scatter_map(v, f"{path}[{k!r}]")] for k, v in obj.items()]
            return [type(obj)(i) for i in zip(*items)]
        return [obj for _ in slots]  # non-tensors and empty containers: the same object for every slot

    try:
        return scatter_map(inputs, root), pieces
    finally:
        scatter_map = None  # type: ignore[assignment]  # break the closure's reference cycle


def _check_splittable(tensor: torch.Tensor, path: str, dim: int, slots: list) -> None:
    """Refuse, in the caller's words, a tensor that Scatter could only fail on deep inside torch."""
    if tensor.is_meta and any(d.type != "meta" for d in slots):
        raise ValueError(
            f"scatter: {path} is on the meta device, which holds shapes but no data, so it cannot be copied to the "
            "slots; create it on a real device, e.g. torch.randn(..., device='cpu')"
        )
    if tensor.is_nested:
        raise ValueError(
            f"scatter: {path} is a nested tensor, whose rows have different lengths, which cannot be split over "
            "the slots; pass it padded with its lengths (torch.nested.to_padded_tensor(x, 0.0)), or as a list of "
            "tensors"
        )
    if tensor.layout != torch.strided:
        raise ValueError(
            f"scatter: {path} is a {str(tensor.layout).replace('torch.', '')} tensor, which cannot be split over "
            "the slots; pass it dense (.to_dense()), or keep it on the module instead of passing it"
        )
    if tensor.dim() == 0:
        raise ValueError(
            f"scatter: {path} is a 0-d tensor, which has no batch dimension to split over the slots; pass it as "
            "a Python number (.item()), or give it a batch dimension"
        )
    if isinstance(dim, int) and not isinstance(dim, bool) and not -tensor.dim() <= dim < tensor.dim():
        raise IndexError(
            f"scatter: dim {dim} is out of range for {path}, which has {tensor.dim()} dimension(s) (shape "
            f"{tuple(tensor.shape)}); dim names the batch dimension, from {-tensor.dim()} to {tensor.dim() - 1} "
            "(DataParallel(model, ..., dim=0) for a batch in the first dimension)"
        )


def _check_pieces(pieces: dict[str, tuple[int, int, torch.Tensor]], dim: int, n_slots: int) -> int | None:
    """Every tensor must split into as many pieces as the others, or zip would drop the extra ones.

    One exception loses nothing, and torch's zip drops it the same way: a tensor with one row per slot,
    every row alike (transformers' Trainer passes ``num_items_in_batch`` so, one row per GPU), beside a
    batch too small to give every slot a piece. Its extra rows go with the slots that get no data.
    Returns how many pieces to keep (``None``: all of them)."""
    counts = {n for _, n, _ in pieces.values()}
    if len(counts) <= 1:
        return None
    fewest = min(counts)
    if all(n == fewest or _one_alike_row_per_slot(t, dim, n_slots) for _, n, t in pieces.values()):
        return fewest
    extra = {
        p: v for p, v in pieces.items() if v[1] > fewest and not _one_alike_row_per_slot(v[2], dim, n_slots)
    }
    p1, (s1, n1, _) = max(extra.items(), key=lambda kv: kv[1][1])
    p2, (s2, n2, _) = min(pieces.items(), key=lambda kv: kv[1][1])
    raise ValueError(
        f"scatter: {p1} has size {s1} along dim {dim} and {p2} has size {s2}, so over {n_slots} slots they split "
        f"into {n1} and {n2} pieces and the extra pieces would be dropped. Every tensor passed in is split along "
        f"dim {dim}: give them all the same batch size, and keep a tensor that is not part of the batch on the "
        "module (an attribute or buffer) instead of passing it"
    )


def _one_alike_row_per_slot(tensor: torch.Tensor, dim: int, n_slots: int) -> bool:
    """Whether ``tensor`` holds one row per slot along ``dim`` and every row equals the first."""
    if tensor.size(dim) != n_slots:
        return False
    first = tensor.narrow(dim, 0, 1)
    return bool((tensor == first).all())


def scatter_kwargs(
    inputs: Any, kwargs: dict[str, Any] | None, target_gpus: Sequence[DeviceLike], dim: int = 0
) -> tuple[tuple[Any, ...], tuple[dict[str, Any], ...]]:
    """Scatter positional and keyword inputs; pad the shorter result with ``()`` or ``{}``."""
    slots = as_devices(target_gpus, "target_gpus")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(f"keyword inputs must be a dict of name -> value, got {type(kwargs).__name__}")
    scattered_inputs, pieces = _scatter(inputs, slots, dim, "inputs") if inputs else ([], {})
    scattered_kwargs, kw_pieces = _scatter(kwargs, slots, dim, "kwargs") if kwargs else ([], {})
    keep = _check_pieces({**pieces, **kw_pieces}, dim, len(slots))
    scattered_inputs, scattered_kwargs = scattered_inputs[:keep], scattered_kwargs[:keep]
    if len(scattered_inputs) < len(scattered_kwargs):
        scattered_inputs.extend(() for _ in range(len(scattered_kwargs) - len(scattered_inputs)))
    elif len(scattered_kwargs) < len(scattered_inputs):
        scattered_kwargs.extend({} for _ in range(len(scattered_inputs) - len(scattered_kwargs)))
    return tuple(scattered_inputs), tuple(scattered_kwargs)


def _kind(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return "a tensor"
    if value is None:
        return "None"
    if isinstance(value, dict):
        return "a dict"
    if _is_namedtuple(value) or _is_dataclass_instance(value):
        return f"a {type(value).__name__}"
    if isinstance(value, (list, tuple)):
        return f"a {type(value).__name__}"
    return "another value"


ONE_STRUCTURE_HINT = "make forward return the same structure for every piece of the batch"


def _check_shapes(outs: list[torch.Tensor], path: str, dim: int) -> None:
    """Tensors are joined along ``dim``, so they must agree everywhere else."""
    ndim = outs[0].dim()
    if ndim == 0 or not isinstance(dim, int) or not -ndim <= dim < ndim:
        return  # 0-d outputs become a vector (Gather warns); a bad dim is Gather's to report
    d = dim % ndim
    for i, t in enumerate(outs[1:], start=1):
        if t.dim() != ndim or any(t.size(k) != outs[0].size(k) for k in range(ndim) if k != d):
            raise ValueError(
                f"gather: replica {i} returned shape {tuple(t.shape)} at {path} where replica 0 returned "
                f"{tuple(outs[0].shape)}; outputs are joined along dim {dim}, so they may differ only there. Does "
                f"forward's output depend on the batch size in another dimension? Return the batch along dim {dim}"
            )


def _check_same_kind(outs: list[Any], path: str) -> None:
    """Every replica must return the same structure: a tensor beside None (or a dict beside a list) is refused."""
    first = _kind(outs[0])
    for i, o in enumerate(outs[1:], start=1):
        if _kind(o) != first:
            raise ValueError(
                f"gather: replica {i} returned {_kind(o)} at {path} where replica 0 returned {first}; every replica "
                "must return the same structure. Does forward return something else for some inputs (an `if` on "
                "the batch, or on its size, which differs between slots)? Make it return the same kinds of values "
                "for every piece of the batch"
            )


def gather(outputs: Sequence[Any], target_device: DeviceLike, dim: int = 0) -> Any:
    """Join per-slot outputs on ``target_device``, keeping their nested types.

    Tensors are concatenated along ``dim`` (0-d tensors become a vector, with a warning);
    ``None`` stays ``None``; other non-tensors come back as a list, one value per slot.
    """
    if isinstance(target_device, int) and target_device == -1:
        target_device = "cpu"
    target = as_device(target_device)
    outputs = list(outputs)
    if not outputs:
        raise ValueError("gather expects at least one output")

    def gather_map(outs, path):
        out = outs[0]
        _check_same_kind(outs, path)
        if isinstance(out, torch.Tensor):
            _check_shapes(outs, path, dim)
            return Gather.apply(target, dim, *outs)
        if out is None:
            return None
        if isinstance(out, PackedSequence):
            raise ValueError(
                f"gather: the replicas returned a PackedSequence at {path}, which cannot be joined by joining its "
                f"fields: {PACKED}"
            )
        if isinstance(out, dict):
            keys = set(out)
            if not all(len(d) == len(out) for d in outs):
                raise ValueError(
                    f"All dicts must have the same number of keys (at {path}); {ONE_STRUCTURE_HINT}"
                )
            if not all(set(d) == keys for d in outs):
                raise ValueError(
                    f"All dicts must have the same keys; replica 0 has {sorted(map(str, keys))} (at {path}); {ONE_STRUCTURE_HINT}"
                )
            return type(out)((k, gather_map([d[k] for d in outs], f"{path}[{k!r}]")) for k in out)
        if _is_namedtuple(out):
            return type(out)._make(gather_map(v, f"{path}.{k}") for k, v in zip(out._fields, zip(*outs)))
        if _is_dataclass_instance(out):
            fields = _dataclass_fields(out)
            return _rebuild_dataclass(
                out, {k: gather_map([_dataclass_fields(o)[k] for o in outs], f"{path}.{k}") for k in fields}
            )
        if isinstance(out, (list, tuple)):
            lengths = {len(o) for o in outs}
            if len(lengths) != 1:
                raise ValueError(
                    f"gather: replicas returned sequences of different lengths {sorted(lengths)} (at {path}); {ONE_STRUCTURE_HINT}"
                )
            return type(out)(gather_map(v, f"{path}[{i}]") for i, v in enumerate(zip(*outs)))
        return list(outs)  # strings, numbers, other objects: one per replica

    try:
        return gather_map(outputs, "output")
    finally:
        gather_map = None  # type: ignore[assignment]
