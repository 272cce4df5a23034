"""Run each replica on its own input, a thread per device: ``torch.nn.parallel.parallel_apply`` on any device."""

from __future__ import annotations

import contextlib
import hashlib
import threading
from typing import Any, Callable, Sequence

import torch
from torch import nn
from torch._utils import ExceptionWrapper

from ._devices import DeviceLike, as_device

__all__ = ["parallel_apply", "get_a_var", "cores_shared"]


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


def _rng_state(device: torch.device) -> torch.Tensor:
    """The state of ``device``'s default generator, the one dropout and torch.rand draw from."""
    return torch.get_rng_state() if device.type == "cpu" else torch.cuda.get_rng_state(device)


def _set_rng_state(device: torch.device, state: torch.Tensor) -> None:
    if device.type == "cpu":
        torch.set_rng_state(state)
    else:
        torch.cuda.set_rng_state(state, device)


def _slot_state(device: torch.device, state: torch.Tensor, slot: int) -> torch.Tensor:
    """A generator state for ``slot``, derived from the caller's ``state`` and the slot's number alone.

    The same caller state gives the same slot states, so a seeded run repeats; the next step's caller
    state differs, and so do its slots' states. Nothing is drawn from the caller's generator."""
    digest = hashlib.blake2b(state.numpy().tobytes() + slot.to_bytes(4, "little"), digest_size=8).digest()
    generator = torch.Generator(device=device)
    generator.manual_seed(int.from_bytes(digest, "little") & (2**63 - 1))
    return generator.get_state()


class _SharedGenerator:
    """Slots that sit on one device and so share its one default generator (``["cpu", "cpu"]``).

    In torch each replica runs on a GPU of its own and draws from that GPU's generator. Here slots
    of one device take turns on one thread (``parallel_apply`` runs a device's slots in order), each
    forward with the slot's own state installed, so its dropout masks depend only on that state, and
    ``torch.utils.checkpoint``, which stashes the device's state at forward and restores it to
    recompute, replays the slot's own masks. The first slot continues the caller's state (so one
    slot draws what the module alone would); the others get states derived from it. Afterwards
    the device's generator holds the first slot's final state."""

    def __init__(self, device: torch.device, slots: list[int]) -> None:
        self.device, self.slots = device, slots
        start = _rng_state(device)
        self.states = {i: start if k == 0 else _slot_state(device, start, i) for k, i in enumerate(slots)}

    @contextlib.contextmanager
    def turn(self, slot: int):
        _set_rng_state(self.device, self.states[slot])
        try:
            yield
        finally:
            self.states[slot] = _rng_state(self.device)

    def finish(self) -> None:
        _set_rng_state(self.device, self.states[self.slots[0]])


def _shared_generators(devices: list[torch.device | None]) -> dict[int, _SharedGenerator]:
    """For each slot that shares its device's generator with another slot, that device's group."""
    groups: dict[torch.device, list[int]] = {}
    for i, d in enumerate(devices):
        if d is not None and d.type in ("cpu", "cuda"):
            groups.setdefault(d, []).append(i)
    shared = {}
    for device, slots in groups.items():
        if len(slots) > 1:
            group = _SharedGenerator(device, slots)
            shared.update({i: group for i in slots})
    return shared


def _thread_modes() -> Callable[[], contextlib.ExitStack]:
    """The caller's thread-local modes, as a context a worker thread enters: grad mode, inference mode,
    and autocast (enabled, dtype, cache) per device type. A new thread starts with torch's defaults."""
    grad_enabled = torch.is_grad_enabled()
    inference = torch.is_inference_mode_enabled()
    cache = torch.is_autocast_cache_enabled()
    autocast = {
        kind: torch.get_autocast_dtype(kind)
        for kind in ("cpu", "cuda")
        if (kind == "cpu" or torch.cuda.is_available()) and torch.is_autocast_enabled(kind)
    }

    def enter() -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        stack.enter_context(torch.set_grad_enabled(grad_enabled))
        if inference:  # tensors made under inference mode (replicas' buffers) may only change inside it
            stack.enter_context(torch.inference_mode())
        for kind, dtype in autocast.items():
            stack.enter_context(torch.autocast(kind, dtype=dtype, cache_enabled=cache))
        return stack

    return enter


def _device_groups(devices: list[torch.device | None]) -> list[list[int]]:
    """The slots grouped by device, in slot order; a slot of unknown device is a group of its own."""
    groups: dict[Any, list[int]] = {}
    for i, d in enumerate(devices):
        groups.setdefault(d if d is not None else ("unknown", i), []).append(i)
    return list(groups.values())


@contextlib.contextmanager
def cores_shared(devices: Sequence[torch.device | None]):
    """While CPU slots take their turns, each runs with its share of the intra-op threads.

    In torch every replica has a GPU of its own. Slots that are all the one CPU share its cores, so
    inside this block each gets ``torch.get_num_threads() // len(devices)`` of them (at least one),
    and the learner's setting is back when the block ends. A small replica's operations are too short
    to pay for a team of threads that must all meet at the end of each one, which costs most when
    another program holds the cores. Anything else (one slot, GPUs, several devices): nothing changes."""
    cpu = torch.device("cpu")
    if len(devices) < 2 or any(d != cpu for d in devices):
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, before // len(devices)))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _thread_name(group: list[int]) -> str:
    return "dpteach-replica-" + "-".join(map(str, group))


def parallel_apply(
    modules: Sequence[nn.Module],
    inputs: Sequence[Any],
    kwargs_tup: Sequence[dict[str, Any]] | None = None,
    devices: Sequence[DeviceLike | None] | None = None,
) -> list[Any]:
    """Call ``modules[i](*inputs[i], **kwargs_tup[i])`` for every i, a thread per device.

    In torch every replica sits on a GPU of its own, and each runs in a thread of its own, all at
    once. Slots that share a device (``["cpu", "cpu"]``, ``["cuda:0", "cuda:0"]``) share its one
    random generator, so here they take turns, each drawing from a generator state of its own
    (:class:`_SharedGenerator`): a seeded run repeats, and checkpointing replays the right dropout
    masks. Since they take turns, they run one after the other on one thread: the caller's when
    every slot is on one device, so CPU slots start no thread, and no second team of intra-op
    threads, of their own; each runs with its share of the caller's (:func:`cores_shared`). Grad mode, inference mode and autocast (enabled flag, dtype, cache) are thread-local,
    so they are carried from the caller into every thread. A failure is re-raised here as the same
    exception type, its message naming the replica and device, with the original traceback.
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
    resolved = [
        d if d is not None else getattr(get_a_var(inp), "device", None) for d, inp in zip(devices, inputs)
    ]
    streams = [caller_stream(d) for d in resolved]
    modes = _thread_modes()
    shared = _shared_generators(resolved) if len(modules) > 1 else {}
    lock = threading.Lock()
    results: dict[int, Any] = {}
    interrupts: list[BaseException] = []

    def _worker(i: int, module, input, kwargs, device, stream=None) -> None:
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
                stack.enter_context(modes())
                stack.enter_context(_device_context(device, stream))
                if i in shared:
                    stack.enter_context(shared[i].turn(i))
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

    def _run_group(group: list[int]) -> None:
        for i in group:
            _worker(i, modules[i], inputs[i], kwargs_tup[i], devices[i], streams[i])

    groups = _device_groups(resolved)
    if len(groups) > 1:  # one thread per device, as in torch; a device's slots in turn on its thread
        threads = [
            threading.Thread(target=_run_group, args=(group,), name=_thread_name(group)) for group in groups
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    elif groups:  # one device: its slots take turns anyway, so they run on the caller's thread
        with cores_shared(resolved):
            _run_group(groups[0])

    for group in set(shared.values()):
        group.finish()
    if interrupts:  # Ctrl-C or sys.exit() in a replica stops the caller too, as itself
        raise interrupts[0]
    outputs = []
    for i in range(len(inputs)):
        output = results[i]
        if isinstance(output, ExceptionWrapper):
            output.reraise()
        outputs.append(output)
    return outputs
