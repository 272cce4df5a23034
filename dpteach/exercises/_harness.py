"""Run a learner's strategy through DataParallel against one device, and say what differs.

Every strategy check runs each model of ``_models.CASES`` on 1 to 4 slots: one DataParallel step
(its replicas kept), the loss ``(out * w).sum()``, backward, then the comparisons below, each of
which records sentences in a :class:`Findings` and none of which raises on a learner's bug."""

from __future__ import annotations

import contextlib
import inspect
import re
import warnings
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch
from torch import nn
from torch.utils._python_dispatch import _pop_mode

from .._devices import as_devices
from ..course import story
from ..data_parallel import step
from ..graph.names import _submodule, resolve
from ..replicate import resolve_strategy
from ._feedback import ACROSS, Findings, Result, Stop, Task, _learner_frame, explain, not_implemented_message
from ._models import CASES, Case, Reference, gradients, reference
from ._paths import edge_problem, places, shares_storage
from ._time_limit import TimeLimit, time_limit

RTOL, ATOL = 1e-4, 1e-5
GRAD_COUNT = re.compile(r"(\w+?)Backward returned an incorrect number of grad\D+(\d+)\D+(\d+)")  # autograd's
SLOTS = ["cpu", "cpu"]  # where `try_it` runs an answer once


@dataclass
class Run:
    """One DataParallel step of one model on some slots, and what one device computed."""

    case: Case
    slots: list[torch.device]
    model: nn.Module
    replicas: list[nn.Module]
    output: torch.Tensor
    grads: dict[str, torch.Tensor | None]
    second: dict[str, torch.Tensor | None] | None
    ref: Reference
    where: str  # "On the MLP replicated onto 2 slots": how its sentences start


def slot_lists(devices: Sequence | None) -> list[list[torch.device]]:
    """The slot lists a check runs: 1 to 4 CPU slots, or every prefix of ``devices``."""
    slots = [torch.device("cpu")] * 4 if devices is None else as_devices(devices)
    return [slots[:n] for n in range(1, len(slots) + 1)]


def run_strategy(
    findings: Findings, strategy, case: Case, slots: list[torch.device], double: bool = False
) -> Run:
    """One DataParallel step of ``case``'s model under ``strategy`` on ``slots``; one slot is replicated too."""
    n = len(slots)
    findings.context = f"On {case.name} replicated onto {n} slot{'s' if n != 1 else ''}"
    model, x, w = case.make()
    ref = reference(model, x, w, n, double)
    model.to(slots[0])
    x, w = x.to(slots[0]), w.to(slots[0])
    done = step(model, x, slots, strategy=strategy, loss_fn=lambda out: (out * w).sum(), backward=False)
    params = dict(model.named_parameters())
    grads, second = {k: None for k in params}, None  # the loss needs no grad: check_replicas says why
    if done.loss.requires_grad and double:
        grads, second = gradients(done.loss, params, double=True)
    elif done.loss.requires_grad:
        done.loss.backward()  # not autograd.grad: a replica's own leaves keep what reaches them
        grads = {k: p.grad for k, p in params.items()}
    return Run(case, slots, model, done.replicas, done.out.detach(), grads, second, ref, findings.context)


class NotYet(Exception):
    """What ``try_step`` found wrong, said as what to change: ``try_it`` prints it, not autograd's traceback."""


def try_step(strategy, model: nn.Module | None = None, x: torch.Tensor | None = None, why=False) -> str:
    """One DataParallel step on two CPU slots under ``strategy`` (of chapter 01's model, unless given); a sentence.
    :class:`NotYet` when the loss requires no grad or (unless ``why``: the caller says why) a parameter no .grad."""
    if model is None:
        model, x = story.make_model(), story.make_data(n=16)[0]
    before = {k: b.clone() for k, b in model.named_buffers()}  # BatchNorm's statistics: reached?
    done = step(model, x, SLOTS, strategy=strategy, backward=False)
    if not done.loss.requires_grad:
        raise NotYet(_no_history(model, done.replicas))
    done.loss.backward()
    missing = ", ".join(name for name, p in model.named_parameters() if p.grad is None)
    if missing and not why:  # ran, but the fix is not there: a problem, not a success
        raise NotYet(f"the step ran, but the original's .grad is None for {missing}: no gradient reached it")
    grads = f".grad is None for {missing}" if missing else "every parameter of the original has a .grad"
    changed = ", ".join(k for k, b in model.named_buffers() if not torch.equal(b, before[k])) or "none"
    grads += f"; the original's buffers that changed: {changed}" if before else ""
    return f"one DataParallel step on {len(SLOTS)} CPU slots ran without an error ({grads})"


def _no_history(model: nn.Module, replicas: Sequence[nn.Module]) -> str:
    """Why the loss of a step requires no grad: the replicas' parameters, copies autograd never recorded."""
    name = next(iter(places(model))).name
    t = resolve(replicas[-1], name)
    found = f"replica {len(replicas) - 1}'s `{name}` has no `grad_fn` and does not require grad"
    if t is None or t.requires_grad:
        found = "no replica parameter requires grad"
    return (
        f"the loss does not require grad, so `backward()` cannot run: {found}. Its copy was made outside "
        "autograd (`detach()`, `.data` or `torch.no_grad()` make a tensor that forgot `param`), so nothing the "
        "loss was computed from leads back to the model. Make the copy with one operation on `param` itself "
        "that autograd records; its `grad_fn` then has an edge back to `param`."
    )


def check_replicas(findings: Findings, model: nn.Module, replicas, slots, where: str) -> None:
    """Every replica's parameter: present, on its slot, its own memory after slot 0, a path to the original."""
    unit = f"replica parameters, {ACROSS}"
    for slot, replica in enumerate(replicas):
        for place in places(model):
            t = resolve(replica, place.name)
            problems = [edge_problem(t, place, slot)]
            if problems[0] is None:  # a path to the original: is it on its slot, in memory of its own?
                who = f"replica {slot}'s `{place.name}`"
                if t.device != slots[slot]:
                    problems.append(("device", f"{who} is on {t.device}, but slot {slot} is {slots[slot]}"))
                if slot > 0 and shares_storage(t, place.tensor):
                    said = f"shares memory with the original `{place.original_name}`: every slot after slot 0"
                    said += " needs a copy of its own (on a second GPU the original is not even there)"
                    problems.append(("shared", f"{who} {said}"))
            for kind, text in filter(None, problems):
                findings.problem(kind, f"{where}: {text}", unit)


def compare(findings: Findings, run: Run, what: str = "grads") -> None:
    """The output, and the original's gradients (``what="grads"``) or second gradients (``"second"``), vs one device."""
    out, ref = run.output.cpu(), run.ref.output
    if what == "grads" and not (out.shape == ref.shape and torch.allclose(out, ref, rtol=RTOL, atol=ATOL)):
        largest = f"differs from one device's (largest difference {_largest(out, ref):.1e})"
        shapes = f"has shape {tuple(out.shape)}, one device's {tuple(ref.shape)}"
        said = f"DataParallel's output {largest if out.shape == ref.shape else shapes}"
        findings.problem("output", f"{run.where}: {said}", "runs (a model on some slots)")
    got = run.grads if what == "grads" else run.second
    want = run.ref.grads if what == "grads" else run.ref.second
    scale = max(1.0, max(t.abs().max().item() for t in want.values()))  # rounding grows with the gradients
    unit = f"of the original's {'gradients' if what == 'grads' else 'second gradients'}, {ACROSS}"
    for name, expected in want.items():
        g = got.get(name)
        subject = f"`{name}.grad`" if what == "grads" else f"`{name}` gradient of the gradient penalty"
        if g is None:
            landed = _landed(run, name) if what == "grads" else ""
            said = f"the original's {subject} is None: nothing reached it{landed}"
            findings.problem(f"{what}_none", f"{run.where}: {said}", unit)
        elif g.shape != expected.shape or not torch.allclose(g.cpu(), expected, rtol=RTOL, atol=ATOL * scale):
            ratio = g.norm().item() / max(expected.norm().item(), 1e-12)
            findings.problem(
                f"{what}_wrong",
                f"{run.where}: the original's {subject} differs from one device's "
                f"(largest difference {_largest(g, expected):.1e}; yours is {ratio:.2f}× as large)",
                unit,
            )


BUFFERS = f"replica buffers, {ACROSS}"  # what a buffer problem's repeats are
SAID = {  # each kind of problem of a replica's buffer, said after "replica 0's `1.running_mean`"
    "buffer_unregistered": "is a plain attribute in its module's `__dict__`, which forward reads, not a buffer: put "
    "it in `_buffers[{key!r}]`, where `named_buffers()`, `state_dict()` and `.to()` look",
    "buffer_missing": "is missing from its module's `_buffers`",
    "buffer_copied": "is a copy, not the original's `{place.original_name}`: BatchNorm on slot 0 updates the copy, and the "
    "update is thrown away with the replica (see chapter 05)",
    "buffer_shared": "shares memory with the original's: slot {slot}'s BatchNorm writes its own statistics into "
    "the original too (only slot 0 should)",
    "buffer_dotted": "is still a copy: the original's buffer went to the top module under the name `{place.name}`, "
    "which forward never reads; `{key}` belongs in the `_buffers` of submodule `{owner}`",
}


def check_buffers(findings: Findings, run: Run) -> None:
    """Slot 0's buffers are the original's, later slots own theirs, the original saw exactly slot 0's piece.

    A buffer is what its module's ``_buffers`` holds (replicate.py's ``setattr`` reaches ``register_buffer``,
    ``named_buffers()`` and ``.to()`` read it); a ``__dict__`` entry of that name wins attribute lookup."""
    for slot, replica in enumerate(run.replicas):
        for place in places(run.model, "buffer"):
            owner, _, key = place.name.rpartition(".")
            module = _submodule(replica, owner)
            t = None if module is None else module._buffers.get(key)
            if module is not None and key in vars(module):
                kind = "buffer_unregistered"
            elif not isinstance(t, torch.Tensor):
                kind = "buffer_missing"
            elif shares_storage(t, place.tensor) != (slot == 0):  # slot 0 must share, the others must not
                dotted = owner and place.name in {**vars(replica), **replica._buffers}  # `_buffers["1.x"]`
                kind = "buffer_shared" if slot else "buffer_dotted" if dotted else "buffer_copied"
            else:
                continue
            said = SAID[kind].format(key=key, place=place, slot=slot, owner=owner)
            findings.problem(kind, f"{run.where}: replica {slot}'s `{place.name}` {said}", BUFFERS)
    if any(kind.startswith("buffer") for kind in findings._first):  # the statistics follow from the buffers
        return
    for name, expected in run.ref.buffers.items():
        b = dict(run.model.named_buffers())[name].detach().cpu()
        if not torch.allclose(b.to(expected.dtype), expected, rtol=RTOL, atol=ATOL):
            change = _change(run, name)  # unchanged: slot 0 updated a copy; changed wrongly: others wrote
            findings.problem(
                "stats_lost" if change == "did not change" else "stats",
                f"{run.where}: after one training-mode step the original's `{name}` {change} "
                f"(expected {_short(expected)}, got {_short(b)})",
                f"of the original's buffers, {ACROSS}",
            )


def require_strategy(findings: Findings, strategy, check: str, example: str) -> None:
    """Stop with a usage message unless ``strategy`` is something ``DataParallel(strategy=...)`` accepts."""
    if strategy is None:
        findings.stop("usage", f"pass your function: `exercises.{check}({example})`")
    try:
        resolve_strategy(strategy)
    except ValueError as exc:
        findings.stop("usage", f"{check} expects a replicate function or a strategy name: {exc}")


def require_function(findings: Findings, cls, check: str, example: str, what: str) -> None:
    """Stop with a usage message unless ``cls`` (the learner's ``what``) is a ``torch.autograd.Function``."""
    if not (inspect.isclass(cls) and issubclass(cls, torch.autograd.Function)):
        usage = f"`exercises.{check}({example})`"
        findings.stop("usage", f"{check} expects your {what} (a Function subclass), got {cls!r}: {usage}")


def run_cases(
    findings: Findings, strategy, devices, *checks: Callable[[Findings, Run], None], double: bool = False
) -> None:
    """Run ``strategy`` on every model and slot count, check its replicas, run each of ``checks``, then compare
    with one device: the gradients, and with ``double=True`` those of a gradient penalty too."""
    for case in CASES:
        for slots in slot_lists(devices):
            run = run_strategy(findings, strategy, case, slots, double)
            check_replicas(findings, run.model, run.replicas, run.slots, run.where)
            for check in checks:
                check(findings, run)
            compare(findings, run)
            if double:
                compare(findings, run, "second")


# Global settings an answer can change and that a check reads: (getter, setter) pairs, restored after
# every check. Grad mode, inference mode, autocast and the random state are restored by the
# context managers `_clean` enters; the global default device and leaked modes are handled there too.
_SETTINGS = (
    (torch.get_default_dtype, torch.set_default_dtype),
    (torch.get_num_threads, torch.set_num_threads),
    (
        lambda: (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()),
        lambda v: torch.set_anomaly_enabled(*v),
    ),
    (
        lambda: (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
        ),
        lambda v: torch.use_deterministic_algorithms(v[0], warn_only=v[1]),
    ),
    (torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
    (torch._C._is_multithreading_enabled, torch._C._set_multithreading_enabled),
    (lambda: torch.backends.cudnn.deterministic, lambda v: setattr(torch.backends.cudnn, "deterministic", v)),
    (lambda: torch.backends.cudnn.benchmark, lambda v: setattr(torch.backends.cudnn, "benchmark", v)),
)
_CLEAN = (torch.float32, 1, (False, False), (False, False), "highest", True, False, False)


@contextlib.contextmanager
def _clean() -> Iterator[None]:
    """Run a check in torch's default settings (one thread: tiny models run 3-4x faster so), then give the
    learner back every one an answer can change: an answer that turned grad mode off, left a mode
    entered or changed the default dtype must not fail the next check, nor change the learner's notebook."""
    saved = [get() for get, _ in _SETTINGS]
    context = getattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context", None)  # torch.set_default_device's
    device = None if context is None else context.device
    torch.set_default_device(None)
    modes = torch._C._len_torch_dispatch_stack(), torch._C._len_torch_function_stack()
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    try:
        for (_, put), value in zip(_SETTINGS, _CLEAN):
            put(value)
        with contextlib.ExitStack() as stack:
            for manager in (torch.enable_grad(), torch.inference_mode(False), torch.random.fork_rng(cuda)):
                stack.enter_context(manager)
            for kind in ("cpu", "cuda") if cuda else ("cpu",):
                stack.enter_context(torch.autocast(kind, enabled=False))
            yield
    finally:
        torch.set_default_device(None)
        while torch._C._len_torch_function_stack() > modes[1]:
            torch._C._pop_torch_function_stack()
        while torch._C._len_torch_dispatch_stack() > modes[0]:
            _pop_mode()
        torch.set_default_device(device)
        for (_, put), value in zip(_SETTINGS, saved):
            put(value)


def run_check(task: Task, hints: dict[str, str], body: Callable[[Findings], None]) -> Result:
    """Run a check's ``body``; turn a learner's exception into a sentence, a stub into 'not implemented yet'."""
    findings = Findings(task, hints)
    limit = TimeLimit(time_limit())
    try:
        with _clean(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with limit:
                body(findings)
    except KeyboardInterrupt:
        if not limit.fired:
            raise  # the learner pressed stop: stop
        findings.problem(
            "time",
            f"{findings.context}, the check stopped after {limit.seconds:g} seconds with your code still "
            "running. Each step here takes well under a second, so look for a loop that never ends, or work "
            "far larger than these tiny models need. More time: `exercises.set_time_limit(seconds)`.",
        )
    except NotImplementedError as exc:
        return findings.result(not_implemented=not_implemented_message(task, exc))
    except Stop:
        pass
    except SystemExit:  # sys.exit(), exit() or quit() in an answer would end the learner's kernel
        findings.problem(
            "exit",
            f"{findings.context}, your code called `sys.exit()` (or `exit()`, `quit()`), which ends the "
            "program: remove that call and return a value instead",
        )
    except Exception as exc:  # a learner's bug, whatever it is, becomes a sentence
        if "NotImplementedError" in str(exc) and "Original Traceback" in str(exc):
            return findings.result(not_implemented=not_implemented_message(task, exc))
        findings.error = exc
        if count := GRAD_COUNT.search(str(exc)):  # autograd's words for a backward's wrong count of values
            name, want, got = count.groups()
            findings.problem(
                "grad_count",
                f"{findings.context}, `{name}.backward` returned {got} value(s): return {want}, one per input "
                f"of `{name}.forward` after `ctx`, in order",
            )
        else:  # without a frame of the learner's, torch or dpteach raised on what their code returned
            mine = _learner_frame(exc, str(exc))
            who = "your code" if mine else "PyTorch or dpteach, on what your code returned,"
            findings.problem("error", f"{findings.context}, {who} raised {explain(exc)}")
    return findings.result()


def _largest(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().cpu(), b.detach().cpu()
    return (a - b).abs().max().item() if a.shape == b.shape else float("inf")


def _landed(run: Run, name: str) -> str:
    """', and replica 1 holds one in its own .grad' when a replica kept the gradient the original should have."""
    mine = [dict(r.named_parameters()).get(name) for r in run.replicas]  # a replica's own leaf, if it has one
    held = [i for i, p in enumerate(mine) if p is not None and p.grad is not None]
    if not held:
        return ""
    return f"; replica {held[0]} holds one in its own `.grad`, which nobody reads (see chapter 01)"


def _change(run: Run, name: str) -> str:
    """What the step did to the original's buffer ``name``, which is not what one device has."""
    model, _, _ = run.case.make()
    if torch.equal(dict(run.model.named_buffers())[name].detach().cpu(), dict(model.named_buffers())[name]):
        return "did not change"
    return "is not what one device has after slot 0's piece"


def _short(t: torch.Tensor) -> str:
    values = t.flatten()[:3].tolist()
    text = ", ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in values)
    return f"[{text}{', …' if t.numel() > 3 else ''}]"
