"""Device lists as dpteach reads them: each entry is a replica *slot*, duplicates allowed."""

from __future__ import annotations

import warnings
from typing import Iterable, Sequence, Union

import torch

DeviceLike = Union[int, str, torch.device]


def as_device(device: DeviceLike) -> torch.device:
    """One device-like value as a full ``torch.device`` (ints are CUDA indices, as in torch.nn.parallel)."""
    if isinstance(device, bool):  # bool is an int; True is never a device
        raise TypeError(f"expected a device (int, str or torch.device), got {device!r}")
    if isinstance(device, int):
        if device < 0:
            raise ValueError(
                f"device index {device} is negative; use 'cpu' for the CPU (torch.nn.parallel's -1 is not a slot)"
            )
        device = torch.device("cuda", device)
    elif isinstance(device, str):
        try:
            device = torch.device(device)
        except RuntimeError:
            raise RuntimeError(
                f"{device!r} is not a device; use 'cpu', 'cuda:0' or a CUDA index such as 0"
            ) from None
    elif not isinstance(device, torch.device):
        raise TypeError(
            f"expected a device (int, str or torch.device), got {type(device).__name__}: {device!r}"
        )
    if device.type == "cpu":
        return torch.device("cpu")  # "cpu:0" is the CPU, where tensors report plain "cpu"
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(
                f"{device} was asked for, but CUDA is not available here; use 'cpu' slots, e.g. ['cpu', 'cpu']"
            )
        index = torch.cuda.current_device() if device.index is None else device.index
        if index >= torch.cuda.device_count():
            raise RuntimeError(
                f"cuda:{index} was asked for, but only {torch.cuda.device_count()} CUDA device(s) exist"
            )
        device = torch.device("cuda", index)
    return device


def as_output_device(device: DeviceLike) -> torch.device:
    """Where outputs are gathered: a device, or torch.nn.parallel's deprecated ``-1`` for the CPU.

    torch's DataParallel and gather both accept ``-1`` (gather warns that it is deprecated); so does
    dpteach, with the same FutureWarning. As a slot, -1 stays refused (:func:`as_device`)."""
    if isinstance(device, int) and not isinstance(device, bool) and device == -1:
        warnings.warn(
            'Using -1 to represent CPU tensor is deprecated. Please use a device object or string instead, e.g., "cpu".',
            FutureWarning,
            stacklevel=3,
        )
        return torch.device("cpu")
    return as_device(device)


def as_devices(devices: Iterable[DeviceLike] | DeviceLike, what: str = "devices") -> list[torch.device]:
    """A device list as ``torch.device`` slots; refuses an empty list."""
    if devices is None:
        raise ValueError(f"{what} is None; pass a list such as ['cpu', 'cpu'] or dpteach.default_devices()")
    if isinstance(devices, (int, str, torch.device)):
        # One device where a list belongs: "cpu" would otherwise be taken silently as one slot
        # (torch.nn.DataParallel would iterate the string's letters). Each entry is a slot.
        raise TypeError(
            f"{what} must be a list of slots, got the single device {devices!r}; "
            f"write [{devices!r}, {devices!r}] for two slots there (or [{devices!r}] for one)"
        )
    slots = [as_device(d) for d in devices]
    if not slots:
        raise ValueError(f"{what} is empty: give at least one device, e.g. ['cpu', 'cpu'] or [0, 1]")
    return slots


def default_devices() -> list[torch.device]:
    """Every CUDA device when there are two or more; otherwise two slots on the one device there is."""
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        if count >= 2:
            return [torch.device("cuda", i) for i in range(count)]
        return [torch.device("cuda", 0), torch.device("cuda", 0)]
    return [torch.device("cpu"), torch.device("cpu")]


def distinct_cuda(devices: Sequence[torch.device]) -> bool:
    """True when every slot is a different CUDA device: torch.cuda.comm's (NCCL) fast paths apply."""
    return all(d.type == "cuda" for d in devices) and len({d.index for d in devices}) == len(devices)
