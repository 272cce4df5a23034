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

from ._devices import DeviceLike, as_device, as_devices
from .functions import Gather, Scatter

__all__ = ["scatter", "scatter_kwargs", "gather"]


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
    """
    slots = as_devices(target_gpus, "target_gpus")

    def scatter_map(obj):
        if isinstance(obj, torch.Tensor):
            return Scatter.apply(slots, None, dim, obj)
        if _is_namedtuple(obj):
            return [type(obj)(*args) for args in zip(*map(scatter_map, obj))]
        if _is_dataclass_instance(obj):
            fields = _dataclass_fields(obj)
            if fields:
                names = list(fields)
                per_slot = zip(*(scatter_map(v) for v in fields.values()))
                return [_rebuild_dataclass(obj, dict(zip(names, vals))) for vals in per_slot]
        if isinstance(obj, tuple) and len(obj) > 0:
            return list(zip(*map(scatter_map, obj)))
        if isinstance(obj, list) and len(obj) > 0:
            return [list(i) for i in zip(*map(scatter_map, obj))]
        if isinstance(obj, dict) and len(obj) > 0:
            return [type(obj)(i) for i in zip(*map(scatter_map, obj.items()))]
        return [obj for _ in slots]  # non-tensors and empty containers: the same object for every slot

    try:
        return scatter_map(inputs)
    finally:
        scatter_map = None  # type: ignore[assignment]  # break the closure's reference cycle


def scatter_kwargs(
    inputs: Any, kwargs: dict[str, Any] | None, target_gpus: Sequence[DeviceLike], dim: int = 0
) -> tuple[tuple[Any, ...], tuple[dict[str, Any], ...]]:
    """Scatter positional and keyword inputs; pad the shorter result with ``()`` or ``{}``."""
    scattered_inputs = scatter(inputs, target_gpus, dim) if inputs else []
    scattered_kwargs = scatter(kwargs, target_gpus, dim) if kwargs else []
    if len(scattered_inputs) < len(scattered_kwargs):
        scattered_inputs.extend(() for _ in range(len(scattered_kwargs) - len(scattered_inputs)))
    elif len(scattered_kwargs) < len(scattered_inputs):
        scattered_kwargs.extend({} for _ in range(len(scattered_inputs) - len(scattered_kwargs)))
    return tuple(scattered_inputs), tuple(scattered_kwargs)


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

    def gather_map(outs):
        out = outs[0]
        if isinstance(out, torch.Tensor):
            return Gather.apply(target, dim, *outs)
        if out is None:
            return None
        if isinstance(out, dict):
            keys = set(out)
            if not all(isinstance(d, dict) and len(d) == len(out) for d in outs):
                raise ValueError("All dicts must have the same number of keys")
            if not all(set(d) == keys for d in outs):
                raise ValueError(f"All dicts must have the same keys; replica 0 has {sorted(map(str, keys))}")
            return type(out)((k, gather_map([d[k] for d in outs])) for k in out)
        if _is_namedtuple(out):
            return type(out)._make(map(gather_map, zip(*outs)))
        if _is_dataclass_instance(out):
            fields = _dataclass_fields(out)
            return _rebuild_dataclass(out, {k: gather_map([_dataclass_fields(o)[k] for o in outs]) for k in fields})
        if isinstance(out, (list, tuple)):
            lengths = {len(o) for o in outs}
            if len(lengths) != 1:
                raise ValueError(f"gather: replicas returned sequences of different lengths {sorted(lengths)}")
            return type(out)(map(gather_map, zip(*outs)))
        return list(outs)  # strings, numbers, other objects: one per replica

    try:
        return gather_map(outputs)
    finally:
        gather_map = None  # type: ignore[assignment]
