"""Which tensor is which: the original module's parameters, each replica's copies, the learner's own names.

The autograd graph holds no names. A leaf is reachable as ``AccumulateGrad.variable``, so it is
found by identity. A replica parameter under ``"rewire"`` or ``"broadcast"`` is not a leaf: it is
output number ``output_nr`` of its ``grad_fn`` (a ``ReduceAddBackward`` or ``BroadcastBackward``
node), and a node cannot hand back its output tensors, so it is found by the *site*
``(grad_fn, output_nr)`` that every consumer's ``next_functions`` entry points at.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain
from typing import Iterator, Mapping, Sequence

import torch
from torch import nn


@dataclass(frozen=True)
class Param:
    """One parameter of the original module (``slot=None``) or of the replica in ``slot``."""

    name: str  # the dotted name in the original module, e.g. "0.weight"
    slot: int | None = None
    device: str = "cpu"
    # the original's place in named_parameters() (module order): drawings line parameters up by it
    index: int = field(default=-1, compare=False)

    def __str__(self) -> str:
        if self.slot is None:
            return f"original {self.name}"
        return f"replica {self.slot} · {self.name} · {self.device}"

    __repr__ = __str__


@dataclass(frozen=True)
class Named:
    """What the graph should call one tensor: its role, its name and its shape."""

    kind: str  # "original", "replica", "input" (a named leaf) or "tensor" (a named non-leaf)
    label: str
    param: Param | None
    shape: tuple[int, ...]
    device: str


class TensorNames:
    """Look-up tables from the graph's handles (a leaf, or a ``(grad_fn, output_nr)`` site) to names."""

    def __init__(self) -> None:
        self.leaves: dict[int, Named] = {}  # id(leaf tensor) -> name
        self.sites: dict[tuple[int, int], Named] = {}  # (id(grad_fn), output_nr) -> name
        self.originals: list[tuple[Param, torch.Tensor]] = []  # in module order, for .unreached
        self.canonical: dict[str, str] = {}  # every name of an original -> its first name (tied weights)
        self.order: dict[str, int] = {}  # an original's first name -> its place in module order
        self.named_leaves: list[tuple[Named, torch.Tensor]] = []  # names= leaves, drawn even when unreached
        self._keep: list[object] = []  # hold every tensor and grad_fn so their id()s stay theirs

    def add(self, tensor: torch.Tensor, named: Named) -> None:
        """Remember ``tensor`` under ``named``; the first name given to a tensor wins (tied weights)."""
        self._keep.append(tensor)
        if tensor.grad_fn is None:
            self.leaves.setdefault(id(tensor), named)
        else:
            fn = tensor.grad_fn
            self._keep.append(fn)
            self.sites.setdefault((id(fn), tensor.output_nr), named)

    @property
    def join_fns(self) -> set[int]:
        """id() of every grad_fn that produced a replica parameter: the ReduceAdd / Broadcast nodes."""
        return {fid for (fid, _), n in self.sites.items() if n.kind == "replica"}


def resolve(module: nn.Module, dotted: str) -> torch.Tensor | None:
    """``module.a.b.weight`` by name, whatever holds it: ``_parameters``, ``_buffers`` or a plain attribute.

    Replicas made by ``"broadcast"`` and ``"rewire"`` keep their parameters as plain attributes
    (replicate.py: "parameters in replicas are no longer leaves"), so ``named_parameters()`` misses them.
    """
    path, _, key = dotted.rpartition(".")
    value = getattr(_submodule(module, path), key, None)
    return value if isinstance(value, torch.Tensor) else None


_PLAIN = {bool, int, float, str, tuple, type(None)}  # what most attributes of a module are: nothing inside


def held_tensors(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Tensors a module holds outside its registries: plain attributes, and one level into plain objects.

    A C++-style module keeps its tensors in member fields that ``replicate`` cannot see
    (``demos.CppStyleLinear.members``, the "failed attempt" of PR #20910); its forward reads those.
    """
    for key, value in list(vars(module).items()):
        # a module's own bookkeeping starts with _; plain values and submodules hold no stray tensor
        if key[:1] == "_" or type(value) in _PLAIN or isinstance(value, nn.Module):
            continue
        if isinstance(value, torch.Tensor):
            yield key, value
        elif hasattr(value, "__dict__") and not callable(value):
            for field, inner in vars(value).items():
                if isinstance(inner, torch.Tensor):
                    yield f"{key}.{field}", inner


def _name_originals(table: TensorNames, module: nn.Module) -> None:
    first_name: dict[int, str] = {}
    # parameters and buffers that require grad, under every name they have (a tied weight twice)
    every = chain(
        module.named_parameters(remove_duplicate=False), module.named_buffers(remove_duplicate=False)
    )
    for name, t in every:
        if not t.requires_grad:
            continue
        table.canonical[name] = first_name.setdefault(id(t), name)
        if table.canonical[name] == name:  # a tied weight is one original, named once
            param = Param(name, None, str(t.device), len(table.originals))
            table.order[name] = param.index
            table.originals.append((param, t))
            table.add(t, Named("original", str(param), param, tuple(t.shape), str(t.device)))


def _submodule(root: nn.Module, path: str) -> nn.Module | None:
    """``root.get_submodule(path)`` along ``_modules``, or None where a module on the way is missing."""
    module = root
    for part in path.split(".") if path else ():
        module = module._modules.get(part)
        if not isinstance(module, nn.Module):
            return None
    return module


def _name_replica(table: TensorNames, paths: list[str], slot: int, replica: nn.Module) -> None:
    def add(name: str, copy: torch.Tensor | None) -> None:
        if copy is not None and copy.requires_grad:  # a frozen copy is not in the graph
            param = Param(name, slot, str(copy.device), table.order.get(table.canonical.get(name, name), -1))
            table.add(copy, Named("replica", str(param), param, tuple(copy.shape), param.device))

    # every alias: "clone" unties tied weights (two copies), "broadcast" does not; a copy named already
    # keeps its first name
    for name in list(table.canonical):
        add(name, resolve(replica, name))
    for path in paths:  # then what the replica's modules hold besides
        sub = _submodule(replica, path)
        if sub is None:
            replica.get_submodule(path)  # raises, saying which module is missing
        prefix = f"{path}." if path else ""
        for attr, t in held_tensors(sub):
            name = prefix + attr
            key = prefix + attr.rpartition(".")[2]  # members.weight stands in for weight
            if key in table.canonical:
                table.canonical.setdefault(name, table.canonical[key])
            add(name, t)


def build_names(
    module: nn.Module | None, replicas: Sequence[nn.Module] | None, names: Mapping[str, torch.Tensor] | None
) -> TensorNames:
    """Name the original's parameters, every replica's copies (by the original's names) and the learner's tensors."""
    table = TensorNames()
    if replicas is not None and module is None:
        raise ValueError(
            "replicas= needs module= too: the original module they were made from, whose names they take"
        )
    if module is not None:
        if not isinstance(module, nn.Module):
            raise TypeError(f"module= expects an nn.Module, got {type(module).__name__}")
        from ..data_parallel import DataParallel

        if isinstance(module, (DataParallel, nn.DataParallel)):  # names read 0.weight, not module.0.weight
            module = module.module
        _name_originals(table, module)
        paths = [path for path, _ in module.named_modules()]
        for slot, replica in enumerate(replicas or ()):
            if not isinstance(replica, nn.Module):
                raise TypeError(
                    f"replicas= expects a list of modules, got {type(replica).__name__} in slot {slot}"
                )
            try:
                _name_replica(table, paths, slot, replica)
            except AttributeError as err:  # get_submodule: the replica is not shaped like the module
                raise ValueError(f"replica {slot} does not have the modules of module=: {err}") from None
    for name, t in (names or {}).items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"names= maps names to tensors, but {name!r} is a {type(t).__name__}")
        named = Named("input" if t.grad_fn is None else "tensor", name, None, tuple(t.shape), str(t.device))
        table.add(t, named)
        if t.grad_fn is None and t.requires_grad:
            table.named_leaves.append((named, t))
    return table
