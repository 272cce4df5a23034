"""``DataParallel`` and ``data_parallel``: drop-ins for PyTorch's, on any device list, with a strategy.

One step is four moves (``torch/nn/parallel/data_parallel.py``):
scatter the batch over the slots, replicate the module, run the replicas in parallel threads,
gather the outputs on ``output_device``. Backward runs the same graph in reverse; how the
replicas' gradients reach ``module`` is what the replication strategy decides.
"""

from __future__ import annotations

import dataclasses
from itertools import chain
from typing import Any, Sequence

import torch
from torch import nn

from ._devices import DeviceLike, as_devices, as_output_device, default_devices
from .parallel_apply import parallel_apply
from .replicate import Strategy, replicate, resolve_strategy
from .replicate._modules import check_not_compiled
from .scatter_gather import gather, scatter_kwargs

__all__ = ["DataParallel", "data_parallel"]


def _check_module_device(module: nn.Module, src: torch.device) -> None:
    for name, t in chain(module.named_parameters(), module.named_buffers()):
        if t.device != src:
            raise RuntimeError(
                f"module must have its parameters and buffers on device {src} (device_ids[0]) "
                f"but found one of them on device: {t.device} ({name!r}). Move it first: module.to({str(src)!r})"
            )


def _tensors(obj: Any, path: str):
    """Every tensor in a nested input, with its path (``inputs[0]``, ``kwargs['mask']``)."""
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from _tensors(getattr(obj, f.name), f"{path}.{f.name}")
    elif isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj):
            yield from _tensors(item, f"{path}[{i}]")
    elif isinstance(obj, dict):
        for k, item in obj.items():
            yield from _tensors(item, f"{path}[{k!r}]")


def _check_not_empty(inputs: Any, kwargs: Any, dim: int, who: str) -> None:
    """An empty batch fails now, in words, rather than in backward ("Expected positive chunk size")."""
    if not torch.is_grad_enabled():
        return  # inference on an empty batch runs, as in torch: each slot gets an empty piece
    for path, t in chain(_tensors(inputs, "inputs"), _tensors(kwargs or {}, "kwargs")):
        if t.dim() > 0 and -t.dim() <= dim < t.dim() and t.size(dim) == 0:
            raise ValueError(
                f"{who} got an empty batch: {path} has size 0 along dim {dim}, so there is nothing to split over "
                "the slots, and backward would fail. Skip empty batches before calling the model (or run them "
                "under torch.no_grad(), where they pass through)"
            )


def _check_dim(dim: Any) -> int:
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise TypeError(f"dim must be an int (the batch dimension), got {dim!r}")
    return dim


class DataParallel(nn.Module):
    """Implements data parallelism at the module level, on any list of slots.

    The same as ``torch.nn.DataParallel``, with two differences: ``device_ids`` may hold CPU
    devices and duplicates (``["cpu", "cpu"]``, ``["cuda:0", "cuda:0"]``), and ``strategy``
    chooses how replicas are made (``"broadcast"``, ``"rewire"``, ``"clone"`` or a callable).
    ``device_ids=None`` means :func:`dpteach.default_devices`.

    As in PyTorch, the module is replicated on every forward, so changes a replica makes to
    itself are lost, except in-place updates of slot 0's tensors, which share storage with
    ``module`` when slot 0 is on its device (BatchNorm's running statistics rely on this).

    Also as in PyTorch, with one slot nothing is replicated: ``module`` itself runs, so every
    strategy learns there, ``"clone"`` included; its bug shows from two slots on. A
    ``torch.compile``'d module is refused (replicating the wrapper would empty the model it
    wraps): compile the DataParallel instead. Under grad mode an empty batch is refused.
    """

    def __init__(
        self,
        module: nn.Module,
        device_ids: Sequence[DeviceLike] | None = None,
        output_device: DeviceLike | None = None,
        dim: int = 0,
        *,
        strategy: Strategy = "broadcast",
    ) -> None:
        super().__init__()
        if not isinstance(module, nn.Module):
            raise TypeError(
                f"DataParallel wraps an nn.Module, got {type(module).__name__}; wrap it in an nn.Module whose "
                "forward calls it"
            )
        resolve_strategy(strategy)  # an unknown strategy fails here, not at the first forward
        self.module = module
        self.device_ids = as_devices(default_devices() if device_ids is None else device_ids, "device_ids")
        self.output_device = self.device_ids[0] if output_device is None else as_output_device(output_device)
        self.dim = _check_dim(dim)
        self.strategy = strategy
        self.src_device_obj = self.device_ids[0]
        if len(self.device_ids) == 1:
            self.module.to(self.src_device_obj)
        else:  # refused now, before a forward copies it into the learner's model
            check_not_compiled(module, "DataParallel")

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        _check_module_device(self.module, self.src_device_obj)  # replicate() checks the rest (lazy modules...)
        if len(self.device_ids) > 1:
            _check_not_empty(inputs, kwargs, self.dim, "DataParallel")
        inputs, module_kwargs = self.scatter(inputs, kwargs, self.device_ids)
        if not inputs and not module_kwargs:  # a forward with no inputs still runs, once per slot
            inputs, module_kwargs = ((),), ({},)
        if len(self.device_ids) == 1:
            return self.module(*inputs[0], **module_kwargs[0])
        replicas = self.replicate(self.module, self.device_ids[: len(inputs)])
        outputs = self.parallel_apply(replicas, inputs, module_kwargs)
        return self.gather(outputs, self.output_device)

    def replicate(self, module: nn.Module, device_ids: Sequence[torch.device]) -> list[nn.Module]:
        return replicate(module, device_ids, not torch.is_grad_enabled(), strategy=self.strategy)

    def scatter(self, inputs, kwargs, device_ids):
        return scatter_kwargs(inputs, kwargs, device_ids, dim=self.dim)

    def parallel_apply(self, replicas, inputs, kwargs):
        return parallel_apply(replicas, inputs, kwargs, self.device_ids[: len(replicas)])

    def gather(self, outputs, output_device):
        return gather(outputs, output_device, dim=self.dim)

    def extra_repr(self) -> str:
        slots = ", ".join(str(d) for d in self.device_ids)
        return f"device_ids=[{slots}], output_device={self.output_device}, dim={self.dim}, strategy={self.strategy!r}"


def data_parallel(
    module: nn.Module,
    inputs: Any,
    device_ids: Sequence[DeviceLike] | None = None,
    output_device: DeviceLike | None = None,
    dim: int = 0,
    module_kwargs: dict[str, Any] | None = None,
    *,
    strategy: Strategy = "broadcast",
) -> Any:
    """Evaluate ``module(*inputs)`` in parallel over ``device_ids``: the functional form of DataParallel."""
    resolve_strategy(strategy)
    _check_dim(dim)
    if not isinstance(inputs, tuple):
        inputs = (inputs,) if inputs is not None else ()
    slots = as_devices(default_devices() if device_ids is None else device_ids, "device_ids")
    output_device = slots[0] if output_device is None else as_output_device(output_device)
    if not isinstance(module, nn.Module):
        raise TypeError(
            f"data_parallel runs an nn.Module, got {type(module).__name__}; wrap it in an nn.Module whose "
            "forward calls it"
        )
    if len(slots) > 1:
        check_not_compiled(module, "data_parallel")
    _check_module_device(module, slots[0])
    if len(slots) > 1:
        _check_not_empty(inputs, module_kwargs, dim, "data_parallel")
    inputs, module_kwargs = scatter_kwargs(inputs, module_kwargs, slots, dim)
    if not inputs and not module_kwargs:
        inputs, module_kwargs = ((),), ({},)
    if len(slots) == 1:
        return module(*inputs[0], **module_kwargs[0])
    used = slots[: len(inputs)]
    replicas = replicate(module, used, not torch.is_grad_enabled(), strategy=strategy)
    outputs = parallel_apply(replicas, inputs, module_kwargs, used)
    return gather(outputs, output_device, dim)
