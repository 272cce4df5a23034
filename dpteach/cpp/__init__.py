"""The C++ original (chapter 10): libtorch's ``Module::clone()`` replicas and PR #20910's fix.

``dp_original.cpp`` is compiled on first use and cached (see ``_build.py``). Each function takes
a Python model (``nn.Linear``, or ``nn.Sequential`` of ``Linear`` and ``ReLU``) and an input,
builds the same model in C++ with the same weights, and runs one data parallel step there
(``loss = mean(output ** 2)``), so every number compares exactly with the Python strategies::

    dpteach.cpp.build_in_background()       # optional: start the compile in a second process now
    ext, reason = dpteach.cpp.load()        # (module, None), or (None, one sentence on why not)
    step = dpteach.cpp.clone_step(model, x, ["cpu", "cpu"])
    step.grads["weight"]                    # None: issue #19540, in the language it happened in
    broken = dpteach.cpp.source_without(line)  # the source less one line, for exercise 3's own compile

Without a C++ compiler nothing here raises at import; ``load()`` says why, and ``available()``
is False, so a notebook can skip its compiled cells.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType
from typing import Optional, Sequence

import torch
from torch import nn

from .._devices import DeviceLike, as_device, as_devices
from ._build import (
    SOURCE,
    build,
    build_directory,
    build_in_background,
    compiler,
    extension_name,
    is_cached,
    ninja,
    put_ninja_on_path,
)

__all__ = [
    "load",
    "build_in_background",
    "available",
    "Step",
    "single_step",
    "clone_step",
    "rewire_step",
    "member_handle",
    "find_line",
    "source_without",
    "SOURCE",
    "build_directory",
    "is_cached",
    "compiler",
    "ninja",
    "put_ninja_on_path",
    "extension_name",
    "architecture",
]

_state: dict = {}  # the first load()'s outcome: "module" and "reason"; one compile per process


def load(
    *, progress: bool = True, verbose: bool = False, retry: bool = False
) -> tuple[Optional[ModuleType], Optional[str]]:
    """The compiled module and None, or None and one sentence on why it is not there.

    Never raises. The outcome is remembered for the process; ``retry=True`` forgets a failure.
    """
    if retry and _state.get("module") is None:
        _state.clear()
    if not _state:  # filled only once an outcome is known: an interrupted compile is tried again
        module, reason = None, None
        if compiler() is None and not is_cached():  # a cached binary needs no compiler
            reason = (
                "No C++ compiler was found, so the compiled cells are skipped "
                "(install g++ or clang, e.g. `apt install g++` or `conda install gxx`, and restart)."
            )
        elif ninja() is None and not is_cached():
            reason = (
                "ninja, the build tool torch compiles extensions with, was not found, so the compiled cells "
                "are skipped (`pip install ninja`, then restart the kernel)."
            )
        else:
            try:
                module = build(progress=progress, verbose=verbose)
            except Exception as err:  # a failed compile is reported, never raised into a lesson
                lines = str(err).splitlines() or [type(err).__name__]
                first = next(
                    (line for line in lines if ": error:" in line), lines[0]
                )  # the compiler's own words
                reason = (
                    f"Compiling {SOURCE.name} failed ({first.strip()[:200]}), so the compiled cells are skipped; "
                    "dpteach.cpp.load(verbose=True, retry=True) shows the compiler's output."
                )
        _state.update(module=module, reason=reason)
    put_ninja_on_path()  # so that a later load_inline of an edited copy (chapter 10, exercise 3) finds ninja too
    return _state["module"], _state["reason"]


def find_line(line: int | str) -> int:
    """The number (from 1) of the one line of ``dp_original.cpp`` that ``line`` names.

    ``line`` is the line's text (all of it, or a piece that is on no other line) or its number, as
    the chapter's listing prints it. Raises ``ValueError``, saying what to give instead, when it
    names no line or more than one."""
    lines = SOURCE.read_text().splitlines()
    if isinstance(line, int) and not isinstance(line, bool):
        if not 1 <= line <= len(lines):
            raise ValueError(f"{SOURCE.name} has lines 1 to {len(lines)}; there is no line {line}.")
        return line
    if not isinstance(line, str) or not line.strip():
        raise ValueError(
            f"Give the line to delete as its text (or its number), e.g. a line from the listing; got {line!r}."
        )
    needle = line.strip()
    found = [n for n, text in enumerate(lines, 1) if needle in text]
    if not found:
        raise ValueError(
            f"{needle!r} is on no line of {SOURCE.name}: copy the line from the listing "
            "(print(cpp.SOURCE.read_text()) shows the whole file)."
        )
    if len(found) > 1:
        numbers = ", ".join(map(str, found))
        quoted = "".join(f"\n  line {n}: {lines[n - 1].strip()}" for n in found)
        raise ValueError(
            f"{needle!r} is on {len(found)} lines ({numbers}): give more of the line, so it names one, "
            f"or give its number:{quoted}"
        )
    return found[0]


def source_without(line: int | str) -> str:
    """``dp_original.cpp`` with one line removed (see :func:`find_line`): chapter 10's exercise 3 compiles it."""
    lines = SOURCE.read_text().splitlines(keepends=True)
    del lines[find_line(line) - 1]
    return "".join(lines)


def available() -> bool:
    """True when the C++ module compiled (or came from the cache); compiles on the first call."""
    return load(progress=False)[0] is not None


def _extension() -> ModuleType:
    module, reason = load(progress=False)
    if module is None:
        raise RuntimeError(reason)
    return module


@dataclass
class Step:
    """One step in C++: the loss, the gathered output, and where the gradients ended up.

    ``output`` keeps its autograd graph (already used by backward): walk ``output.grad_fn``
    down through the C++ nodes, ``ReduceAdd`` included, to the parameters' ``AccumulateGrad``.
    ``grads`` are the original model's ``.grad`` by parameter name (None: nothing arrived);
    ``params`` are the C++ model's own tensors, whose ``grad_fn`` graph Python can walk.
    ``replica_grads`` holds one dict per replica; under ``rewire_step`` its values are all None:
    a rewired replica's parameters are no longer leaves.
    """

    loss: torch.Tensor
    output: torch.Tensor
    grads: dict[str, Optional[torch.Tensor]]
    params: dict[str, torch.Tensor]
    replica_grads: list[dict[str, Optional[torch.Tensor]]] = field(default_factory=list)
    replica_params: list[dict[str, torch.Tensor]] = field(default_factory=list)
    order: list[str] = field(default_factory=list)  # the Python model's parameter names, in its order

    def modules(self) -> tuple[nn.Module, list[nn.Module]]:
        """The original and each replica as an ``nn.Module`` holding the C++ tensors themselves.

        For ``dpteach.autograd_graph(step.output, module=..., replicas=...)``: C++ hands the tensors
        back sorted by name (bias first); these modules hold them under their dotted names in the
        Python model's order, so the drawing names and orders them as the Python pictures do.
        """

        def holding(tensors: dict[str, torch.Tensor]) -> nn.Module:
            root = nn.Module()
            for name in self.order or sorted(tensors):
                *path, key = name.split(".")
                module = root
                for part in path:
                    module = module._modules.setdefault(part, nn.Module())
                module._parameters[key] = tensors[name]  # the tensor itself, not a Parameter copy
            return root

        return holding(self.params), [holding(params) for params in self.replica_params]


def architecture(model: nn.Module) -> list[str]:
    """``["Linear"]`` or ``["Sequential", "Linear", "ReLU", ...]``: what the C++ side rebuilds."""

    def check_linear(m: nn.Module) -> None:
        if type(m) is not nn.Linear or m.bias is None:
            raise TypeError(f"dpteach.cpp rebuilds nn.Linear with a bias and nn.ReLU in C++; got {m!r}")

    if isinstance(model, nn.Sequential):
        layers = []
        for child in model:
            if type(child) is nn.ReLU:
                layers.append("ReLU")
            else:
                check_linear(child)
                layers.append("Linear")
        return ["Sequential", *layers]
    check_linear(model)
    return ["Linear"]


def _step(result: dict, n_replicas: int, model: nn.Module) -> Step:
    def part(kind: str, who: str) -> dict:
        prefix = f"{kind}/{who}/"
        return {k[len(prefix) :]: v for k, v in result.items() if k.startswith(prefix)}

    return Step(
        loss=result["loss"],
        output=result["output"],
        grads=part("grad", "original"),
        params=part("param", "original"),
        replica_grads=[part("grad", f"replica{i}") for i in range(n_replicas)],
        replica_params=[part("param", f"replica{i}") for i in range(n_replicas)],
        order=[name for name, _ in model.named_parameters()],
    )


def _weights(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach() for p in model.parameters()]


def single_step(model: nn.Module, x: torch.Tensor, device: DeviceLike = "cpu", *, extension=None) -> Step:
    """The model on one device in C++: the reference every strategy must match."""
    ext = extension or _extension()
    return _step(ext.single_step(architecture(model), _weights(model), x, str(as_device(device))), 0, model)


def clone_step(
    model: nn.Module, x: torch.Tensor, devices: Sequence[DeviceLike] = ("cpu", "cpu"), *, extension=None
) -> Step:
    """Replicas from ``Module::clone()``, as C++ ``data_parallel`` made them before PR #20910.

    ``extension``: a module compiled from an edited copy of ``SOURCE`` (chapter 10's exercise 3);
    by default the one :func:`load` compiled."""
    slots = [str(d) for d in as_devices(devices)]
    ext = extension or _extension()
    return _step(ext.clone_step(architecture(model), _weights(model), x, slots), len(slots), model)


def rewire_step(
    model: nn.Module, x: torch.Tensor, devices: Sequence[DeviceLike] = ("cpu", "cpu"), *, extension=None
) -> Step:
    """``clone()``, then one ``ReduceAdd`` per original parameter: PR #20910. ``extension``: as in :func:`clone_step`."""
    slots = [str(d) for d in as_devices(devices)]
    ext = extension or _extension()
    return _step(ext.rewire_step(architecture(model), _weights(model), x, slots), len(slots), model)


def member_handle(linear: nn.Linear, x: torch.Tensor) -> dict:
    """The PR's "Failed Attempt" in C++: assign into ``parameters_["weight"]``, see ``Linear::weight`` not move.

    Keys: ``shared_before`` / ``shared_after`` (do registry and member share one TensorImpl?),
    ``register_parameter_error``, ``registry_weight``, ``member_weight``, ``forward`` (what the
    replica computes), ``forward_with_member``, ``forward_with_registry``, and
    ``member_grad_fn_after_set_history`` (what the fix's ``set_history`` shows through the member).
    """
    if architecture(linear) != ["Linear"]:
        raise TypeError("member_handle needs an nn.Linear: its weight member is the point")
    return dict(_extension().member_handle(linear.weight.detach(), linear.bias.detach(), x))
