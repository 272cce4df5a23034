"""Run each replica on its own input in its own thread: ``torch.nn.parallel.parallel_apply`` on any device."""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Sequence

import torch
from torch import nn
from torch._utils import ExceptionWrapper

from ._devices import DeviceLike, as_device

__all__ = ["parallel_apply", "get_a_var"]


def get_a_var(obj: Any) -> torch.Tensor | None:
    """The first tensor found in a nested input, to tell which device a replica runs on."""
    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, (list, tuple)):
        for item in obj:
            t = get_a_var(item)
            if t is not None:
                return t
    if isinstance(obj, dict):
        for item in obj.values():
            t = get_a_var(item)
            if t is not None:
                return t
    return None


def caller_stream(device: torch.device | None):
    """The caller's current CUDA stream on ``device`` (None for CPU or an unknown device).

    Read in the calling thread, as torch's parallel_apply does: a new thread's current stream is
    always the default stream, so reading it in the worker would ignore a ``torch.cuda.stream(s)``
    block the caller is in."""
    if device is None or device.type != "cuda":
        return None
    return torch.cuda.current_stream(device)


def _device_context(device: torch.device, stream=None):
    """Make ``device`` current in this thread, and ``stream`` (the caller's) its stream; nothing for CPU."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    stack.enter_context(torch.cuda.device(device))
    stack.enter_context(
        torch.cuda.stream(stream if stream is not None else torch.cuda.current_stream(device))
    )
    return stack


def parallel_apply(
    modules: Sequence[nn.Module],
    inputs: Sequence[Any],
    kwargs_tup: Sequence[dict[str, Any]] | None = None,
    devices: Sequence[DeviceLike | None] | None = None,
) -> list[Any]:
    """Call ``modules[i](*inputs[i], **kwargs_tup[i])`` for every i at once, one thread each.

    Grad mode and autocast (enabled flag and dtype) are thread-local, so they are carried from
    the caller into every thread. A failure is re-raised here as the same exception type, its
    message naming the replica and device, with the original traceback.
    """
    if len(modules) != len(inputs):
        raise AssertionError(
            f"The number of modules {len(modules)} is not equal to the number of inputs {len(inputs)}; "
            "give one input per module"
        )
    if kwargs_tup is None:
        kwargs_tup = ({},) * len(modules)
    elif len(kwargs_tup) != len(modules):
        raise AssertionError(
            f"The number of modules {len(modules)} is not equal to the number of kwargs_tup {len(kwargs_tup)}; "
            "give one dict of keyword inputs per module"
        )
    if devices is None:
        devices = [None] * len(modules)
    elif len(devices) != len(modules):
        raise AssertionError(
            f"The number of modules {len(modules)} is not equal to the number of devices {len(devices)}; "
            "give one device per module"
        )
    devices = [None if d is None else as_device(d) for d in devices]
    streams = [
        caller_stream(d if d is not None else getattr(get_a_var(inp), "device", None))
        for d, inp in zip(devices, inputs)
    ]

    grad_enabled = torch.is_grad_enabled()
    autocast = {
        kind: (torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind))
        for kind in ("cpu", "cuda")
        if kind == "cpu" or torch.cuda.is_available()
    }
    lock = threading.Lock()
    results: dict[int, Any] = {}
    interrupts: list[BaseException] = []

    def _worker(i: int, module, input, kwargs, device, stream=None) -> None:
        torch.set_grad_enabled(grad_enabled)
        if device is None:
            t = get_a_var(input)
            if t is None:
                try:  # ExceptionWrapper reads the exception being handled (torch's own call here has none)
                    raise RuntimeError(
                        f"in replica {i}, no device was provided and no tensor input was found; "
                        "device cannot be resolved: pass devices=[...] to parallel_apply"
                    )
                except RuntimeError:
                    with lock:
                        results[i] = ExceptionWrapper(where=f"in replica {i}")
                return
            device = t.device
        try:
            with contextlib.ExitStack() as stack:
                stack.enter_context(_device_context(device, stream))
                for kind, (enabled, dtype) in autocast.items():
                    if enabled:
                        stack.enter_context(torch.autocast(kind, dtype=dtype))
                if not isinstance(input, (list, tuple)):  # also avoids slicing a tensor input
                    input = (input,)
                output = module(*input, **kwargs)
            with lock:
                results[i] = output
        except Exception:
            with lock:
                results[i] = ExceptionWrapper(where=f"in replica {i} on device {device}")
        except BaseException as exc:  # KeyboardInterrupt, SystemExit: handed to the caller as themselves
            with lock:
                interrupts.append(exc)
                results[i] = None

    if len(modules) > 1:
        threads = [
            threading.Thread(target=_worker, args=(i, m, inp, kw, dev, st), name=f"dpteach-replica-{i}")
            for i, (m, inp, kw, dev, st) in enumerate(zip(modules, inputs, kwargs_tup, devices, streams))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    elif modules:
        _worker(0, modules[0], inputs[0], kwargs_tup[0], devices[0], streams[0])

    if interrupts:  # Ctrl-C or sys.exit() in a replica stops the caller too, as itself
        raise interrupts[0]
    outputs = []
    for i in range(len(inputs)):
        output = results[i]
        if isinstance(output, ExceptionWrapper):
            output.reraise()
        outputs.append(output)
    return outputs
