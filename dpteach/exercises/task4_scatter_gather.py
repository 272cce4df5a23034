"""Task 4 (chapter 11 only): scatter and gather nested inputs against dpteach's, alone, then inside DataParallel."""

from __future__ import annotations

import copy
import dataclasses
from collections import namedtuple
from dataclasses import dataclass, field

import torch
from torch import nn

from .._devices import as_devices
from ..course import story
from ..data_parallel import DataParallel
from ..scatter_gather import gather as real_gather
from ..scatter_gather import scatter as real_scatter
from ._feedback import Findings, Result, Task
from ._harness import ATOL, RTOL, NotYet, run_check, slot_lists

TASK = Task(  # the registry finds this record by the file's name
    4,
    "scatter_gather",
    "scatter and gather nested inputs",
    "11",  # no earlier chapter covers nested inputs, so this task lives in chapter 11 only
    names=("scatter", "gather"),
    check="check_scatter_gather",
    imports="import dataclasses\n\nimport torch\n\nfrom dpteach import exercises\n"
    "from dpteach.functions import Gather, Scatter",
)

Pair, Out = namedtuple("Pair", "x y"), namedtuple("Out", "y aux")


@dataclass
class Batch:
    """A batch as a dataclass: two tensor fields and one that is not a tensor."""

    x: torch.Tensor
    mask: torch.Tensor
    tags: list = field(default_factory=list)


@dataclass
class Prediction:
    y: torch.Tensor
    label: str = ""


class NestedNet(nn.Module):
    """Takes a Batch and a keyword dict, returns a namedtuple holding a tensor and a dict."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 2)

    def forward(self, batch: Batch, scale=None):
        y = self.lin(batch.x) * batch.mask
        if scale is not None:
            y = y * scale["s"]
        return Out(y=y, aux={"h": batch.x.sum(1, keepdim=True), "tags": len(batch.tags)})


HINTS = {  # a tuple is a hint in steps: the idea on the first failure, closer on the next, the code last
    "type": (
        "each container comes back as its own type, on every slot: a namedtuple as that namedtuple, a dict as "
        "that dict's type, a dataclass as that dataclass.",
        "a namedtuple takes its fields as arguments, not one iterable; a dataclass is rebuilt from its fields.",
        "`type(obj)(*fields)` for a namedtuple, `dataclasses.replace(obj, **fields)` for a dataclass, "
        "`type(obj)(pairs)` for a dict.",
    ),
    "rows": "split every tensor with `Scatter.apply` and join it with `Gather.apply` along `dim`, at any depth: a "
    "dataclass's tensor fields too (PyTorch passes them through whole, #41327 and #45840), visited with "
    "`dataclasses.fields(obj)`.",
    "dropped": "rebuild a dataclass from *all* its fields, tensors or not: `dataclasses.replace(obj, **fields)` "
    "keeps every field you do not pass.",
    "shared": "send anything that is not a tensor or a container to every slot as it is: the same object, not a "
    "copy, and not dropped.",
    "grad": "split and join with the differentiable `Scatter.apply` / `Gather.apply` (or tensor operations), never "
    "on `.detach()`ed tensors or under `torch.no_grad()`.",
    "count": "return one entry per piece: `tensor.chunk(n)` can give fewer than n pieces (2 rows over 4 slots "
    "give 2), and `zip` stops at the shortest.",
    "pieces": "return one structure per slot: every item of a container must give one value per slot (a "
    "non-tensor, or an empty container, the same object each time), or the `zip` over the items stops short.",
    "values": "give each piece the rows `tensor.chunk(n, dim)` gives it, in order: `Scatter.apply(devices, None, "
    "dim, tensor)` cuts them so; `Gather.apply(target_device, dim, *tensors)` joins them back in slot order.",
    "device": "put each piece on its own slot's device and the joined result on `target_device`: `Scatter` and "
    "`Gather` do both.",
}


def _inputs():
    """(description, inputs, number of slots, dim) for every scatter case; x requires grad."""
    torch.manual_seed(0)  # inside run_check, which forks the random state: the learner's is left alone
    x = torch.randn(8, 4, requires_grad=True)
    y = torch.randn(8, 2)
    mask = (torch.rand(8, 1) > 0.3).float()
    wide = torch.randn(3, 6, requires_grad=True)
    tags = ["cat", "dog"]
    return [
        ("a tensor", x, 3, 0),
        ("a tuple (x, y, (), [], {}): empty ones are shared", (x, y, (), [], {}), 2, 0),
        ("a list [x, 'label']", [x, "label"], 4, 0),
        ("a dict {'x': x, 'n': 5}", {"x": x, "n": 5}, 2, 0),
        ("a namedtuple Pair(x, y)", Pair(x, y), 3, 0),
        ("a dataclass Batch(x, mask, tags)", Batch(x, mask, tags), 2, 0),
        ("a dict holding a Batch and a tuple", {"batch": Batch(x, mask, tags), "extra": (y, [x])}, 4, 0),
        ("2 rows over 4 slots", x[:2], 4, 0),
        ("a tensor split along dim=1", wide, 3, 1),
    ]


def _outputs():
    """(description, per-slot outputs, dim) for every gather case; the tensors require grad."""
    torch.manual_seed(1)  # inside run_check, as above
    ys = [torch.randn(2, 3, requires_grad=True) for _ in range(3)]
    return [
        ("tensors", ys, 0),
        ("tuples (y, None)", [(y, None) for y in ys], 0),
        ("dicts {'y': y, 'n': slot}", [{"y": y, "n": i} for i, y in enumerate(ys)], 0),
        ("namedtuples Out(y, aux={'h': y})", [Out(y, {"h": y * 2}) for y in ys], 0),
        ("dataclasses Prediction(y, label)", [Prediction(y, "p") for y in ys], 0),
        ("tensors joined along dim=1", ys, 1),
    ]


def first_difference(got, want, path: str) -> tuple[str, str] | None:
    """(kind, sentence) for the first place where ``got`` differs from ``want``; None when they agree."""
    if isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return "type", f"`{path}` is a {type(got).__name__}, expected a tensor"
        if got.shape != want.shape:  # as many dimensions: cut or joined wrong; fewer or more: picked, not cut
            kind = "rows" if got.dim() == want.dim() and got.dim() > 0 else "values"
            return kind, f"`{path}` has shape {tuple(got.shape)}, expected {tuple(want.shape)}"
        if got.device != want.device:
            return "device", f"`{path}` is on {got.device}, expected {want.device}"
        if not torch.allclose(got.detach(), want.detach(), rtol=RTOL, atol=ATOL):
            return "values", f"`{path}` holds the wrong values (the wrong rows of the input?)"
        if want.requires_grad and not got.requires_grad:
            return "grad", f"`{path}` has no gradient path back to the tensor it came from"
        return None
    if type(got) is not type(want):
        return "type", f"`{path}` is a {type(got).__name__}, expected a {type(want).__name__}"
    if isinstance(want, tuple) and hasattr(want, "_fields"):
        pairs = [(f".{k}", getattr(got, k), getattr(want, k)) for k in want._fields]
    elif dataclasses.is_dataclass(want):
        fields = dataclasses.fields(want)
        for f in fields:
            g, w = getattr(got, f.name), getattr(want, f.name)
            if not isinstance(w, torch.Tensor) and _is_default(f, g) and not _is_default(f, w):
                return "dropped", f"`{path}.{f.name}` is {g!r}, its default, not {w!r}: the field was dropped"
        pairs = [(f".{f.name}", getattr(got, f.name), getattr(want, f.name)) for f in fields]
    elif isinstance(want, (list, tuple)):
        if len(got) != len(want):
            kind = "count" if path.count("[") == 0 else "type"
            return kind, f"`{path}` has {len(got)} entries, expected {len(want)}"
        pairs = [(f"[{i}]", g, w) for i, (g, w) in enumerate(zip(got, want))]
    elif isinstance(want, dict):
        if list(got) != list(want):
            return "type", f"`{path}` has keys {list(got)}, expected {list(want)}"
        pairs = [(f"[{k!r}]", got[k], want[k]) for k in want]
    else:
        if got is want:
            return None
        if got == want:
            return "shared", f"`{path}` is a copy of {want!r}; a non-tensor is shared: the same object"
        return "shared", f"`{path}` is {got!r}, expected {want!r} (the same object the input holds)"
    for suffix, g, w in pairs:
        found = first_difference(g, w, path + suffix)
        if found is not None:
            return found
    return None


def _is_default(f: dataclasses.Field, value) -> bool:
    if f.default is not dataclasses.MISSING:
        return value is f.default or value == f.default
    if f.default_factory is not dataclasses.MISSING:
        return value == f.default_factory()
    return False


class _Plugged(DataParallel):
    """DataParallel with the learner's scatter and gather in place of dpteach's."""

    def __init__(self, module, device_ids, scatter, gather) -> None:
        super().__init__(module, device_ids)
        self._scatter, self._gather = scatter, gather

    def scatter(self, inputs, kwargs, device_ids):  # the check passes both, so neither needs padding
        split = self._scatter
        return tuple(split(inputs, device_ids, self.dim)), tuple(split(kwargs, device_ids, self.dim))

    def gather(self, outputs, output_device):
        return self._gather(outputs, output_device, self.dim)


def _check_scatter(findings: Findings, scatter) -> None:
    for what, inputs, n, dim in _inputs():
        findings.context = f"Scattering {what} over {n} slots"
        slots = [torch.device("cpu")] * n
        want = real_scatter(inputs, slots, dim)
        got = scatter(inputs, slots, dim)  # a list (or tuple) with one entry per piece, each like dpteach's
        if found := first_difference(list(got) if isinstance(got, tuple) else got, list(want), "pieces"):
            # the hint on `chunk` only where a tensor gave fewer pieces than slots, and yours more than it
            kind = "pieces" if found[0] == "count" and len(want) >= min(n, len(got)) else found[0]
            findings.problem(kind, f"scatter({what}, {n} slots): {found[1]}")


def _check_gather(findings: Findings, gather) -> None:
    for what, outputs, dim in _outputs():
        findings.context = f"Gathering {what}"
        want = real_gather(outputs, "cpu", dim)
        if found := first_difference(gather(outputs, torch.device("cpu"), dim), want, "result"):
            findings.problem(found[0], f"gather(3 slots' {what}): {found[1]}")


def _check_data_parallel(findings: Findings, scatter, gather, devices) -> None:
    """The learner's pair inside DataParallel against dpteach's own, on a dataclass batch and a keyword dict."""
    for slots in slot_lists(devices)[1:]:
        n = len(slots)
        findings.context = f"Running DataParallel with your scatter and gather on {n} slots"
        torch.manual_seed(2)  # inside run_check, as above
        model = NestedNet()
        x, mask, s = torch.randn(8, 4), (torch.rand(8, 1) > 0.3).float(), torch.rand(8, 1)
        twin = copy.deepcopy(model)
        outs = []
        runs = ((_Plugged(model, slots, scatter, gather), model), (DataParallel(twin, slots), twin))
        for net, module in runs:
            xi = x.to(slots[0]).requires_grad_()
            out = net(Batch(xi, mask.to(slots[0]), ["a", "b"]), scale={"s": s.to(slots[0])})
            if isinstance(out, Out) and out.y is not None:
                (out.y * torch.arange(1.0, 3.0, device=out.y.device)).sum().backward()
            outs.append((out, xi.grad, module.lin.weight.grad))
        (got, gx, gw), (want, wx, ww) = outs
        if found := first_difference(got, want, "output"):
            findings.problem(found[0], f"{findings.context}: {found[1]}")
        elif gx is None or not torch.allclose(gx, wx, rtol=RTOL, atol=ATOL):
            why = "the pieces must stay connected to the batch they came from"
            findings.problem("grad", f"{findings.context}: the input's gradient is not dpteach's; {why}")
        elif gw is None or not torch.allclose(gw, ww, rtol=RTOL, atol=ATOL):
            findings.problem("grad", f"{findings.context}: the model's gradient is not dpteach's")


def check_scatter_gather(scatter=None, gather=None, *, devices=None) -> Result:
    """Check a learner's ``scatter`` and ``gather`` on nested structures and inside DataParallel."""

    def body(findings: Findings) -> None:
        if not (callable(scatter) and callable(gather)):
            findings.stop("usage", "pass both functions: `exercises.check_scatter_gather(scatter, gather)`")
        if devices is not None:
            as_devices(devices)
        _check_scatter(findings, scatter)
        _check_gather(findings, gather)
        if findings.ok:
            _check_data_parallel(findings, scatter, gather, devices)
        findings.held += [
            "scatter splits tensors, tuples, lists, dicts, namedtuples and dataclasses like dpteach.scatter: types and "
            "fields kept, non-tensors shared, gradients flowing back",
            "gather joins them back like dpteach.gather, nested types kept",
            "inside DataParallel, a dataclass batch and a keyword dict give dpteach's outputs and gradients on 2-4 slots",
        ]

    return run_check(TASK, HINTS, body)


def try_answer(scatter, gather) -> str:
    """The learner's scatter and gather once, each against dpteach's (``try_it("scatter_gather", s, g)``)."""
    x, slots = story.make_data(n=16)[0].requires_grad_(), [torch.device("cpu")] * 3  # 3 slots: rows 6, 6, 4
    pieces, want = scatter((x, {"n": 3}), slots, 0), real_scatter((x, {"n": 3}), slots, 0)
    found = first_difference(list(pieces) if isinstance(pieces, tuple) else pieces, list(want), "pieces")
    joined = gather([p[0] for p in want], torch.device("cpu"), 0)  # dpteach's pieces: each function alone
    if found := found or first_difference(joined, real_gather([p[0] for p in want], "cpu", 0), "joined"):
        raise NotYet(f"scatter((x, {{'n': 3}}), 3 slots) then gather: {found[1]}")
    return f"scatter gave {len(pieces)} pieces like dpteach's and gather joined them into shape {tuple(joined.shape)}"
