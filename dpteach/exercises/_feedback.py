"""What a check says: a :class:`Result` that prints kindly, and the collector that builds one.

What went wrong is said in sentences a learner can act on (a mistake seen in twelve places once, with what the
others are), each with its hint, whose steps follow how often that mistake came back; "Correct!" when all holds.
"""

from __future__ import annotations

import html
import linecache
import os
import re
import traceback
from dataclasses import dataclass, field
from typing import NoReturn

import torch

_LIBRARY_DIRS = (
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),  # dpteach/
    os.path.dirname(os.path.abspath(torch.__file__)),
    os.path.dirname(os.path.abspath(traceback.__file__)),  # the standard library
)


@dataclass(frozen=True)
class Task:
    """One exercise's record, kept in its own ``taskN_*.py``; every table about the exercises derives from these."""

    number: int
    key: str  # TASKS[key], stub_source(key)
    title: str
    chapter: str  # the chapter whose "Try it yourself" holds the task ("11": chapter 11 only)
    names: tuple[str, ...] = ()  # what the learner writes (stubs.py, solutions.py), in check order
    check: str = ""  # the check function's name in the task's module
    helpers: tuple[str, ...] = ()  # other names of that module a learner calls (exercises.rewire_with)
    imports: str = ""  # the first lines of the stub and solution cells
    taught: str = ""  # the chapters that teach the idea, where they are not just `chapter`

    @property
    def label(self) -> str:
        return f"Task {self.number} ({self.title})"


@dataclass
class Result:
    """A check's answer. ``passed`` is True only when everything held; ``messages`` say what was found."""

    task: Task
    passed: bool
    messages: list[str]
    hints: list[str] = field(default_factory=list)
    implemented: bool = True  # False: the stub still raises NotImplementedError
    kinds: list[str] = field(default_factory=list)  # the kind of each problem found ("fresh_leaf", "error")
    error: BaseException | None = None  # what the learner's code raised, if it did: `raise result.error`

    def __bool__(self) -> bool:
        return self.passed

    @property
    def headline(self) -> str:
        if self.passed:
            return f"Correct! {self.task.label}"
        if not self.implemented:
            return f"{self.task.label}: not written yet (see the cell above)."
        n, shown = max(len(self.kinds), len(self.messages)), len(self.messages)
        first = f"; the first {shown}, each with what to change, below" if shown < n else ""
        return f"Not yet: {self.task.label}, {n} problem{'s' if n != 1 else ''} found{first}."

    def __str__(self) -> str:
        mark = "✓" if self.passed else ("·" if not self.implemented else "✗")
        lines = [self.headline, *(f"  {mark} {m}" for m in self.messages)]
        return "\n".join([*lines, *(f"  Hint: {h}" for h in self.hints)])

    __repr__ = __str__

    def _repr_html_(self) -> str:
        colour = "#1a7f37" if self.passed else ("#9a6700" if not self.implemented else "#cf222e")
        mark = "✓" if self.passed else ("·" if not self.implemented else "✗")
        items = "".join(f"<li>{mark} {_inline(m)}</li>" for m in self.messages)
        hints = "".join(f"<p style='margin:.3em 0'><b>Hint:</b> {_inline(h)}</p>" for h in self.hints)
        return (
            f"<div style='border-left:4px solid {colour};padding:.4em .8em;margin:.2em 0'>"
            f"<b style='color:{colour}'>{_inline(self.headline)}</b>"
            f"<ul style='list-style:none;padding-left:.5em;margin:.3em 0'>{items}</ul>{hints}</div>"
        )


def _inline(text: str) -> str:
    """Escape for HTML, then show `code` spans as code and *stressed* words in italics."""
    text = re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))
    return re.sub(r"(?<![\w*])\*([^*\s<>][^*<>]*?)\*(?![\w*])", r"<em>\1</em>", text)  # never across a tag


class Stop(Exception):
    """Raised inside a check to stop at a problem that makes every later step meaningless."""


Hint = str | tuple[str, ...]  # one hint, or its steps: the idea first, the code last

COMMON_HINTS: dict[str, Hint] = {  # the kinds of problem every check can find
    "error": (
        "the message names the case the check was trying and the line of yours that raised, if one did; if none "
        "did, PyTorch or dpteach raised on what your code returned: make your code work for that case.",
        "to see the whole traceback, keep the check's result and raise its error: `r = exercises.check(...)` "
        "with your objects, then `raise r.error`.",
    ),
    "grad_count": "a Function's backward returns one value per input of its forward, in forward's order: a "
    "gradient for each tensor input that needs one, `None` for every other input.",
    "exit": "a check calls your code like any function: end it with `return`, never with `sys.exit()`.",
    "usage": "pass the objects your stub cell defines, in its order, as the check cell below the stub does.",
    "missing": "keep every parameter and buffer in each replica where the original has it: replace a tensor, "
    "never delete it.",
    "fresh_leaf": "make each replica's tensor with an operation autograd records on the original's, so its "
    "`grad_fn` leads back there (chapter 02).",
    "no_grad": "make each replica's tensor with gradients on: no `torch.no_grad()`, no `.detach()`.",
    "wrong_leaf": "compute each replica's tensor from the original itself, not from a detached copy of it.",
    "device": "put each replica's tensors on its own slot's device.",
    "shared": "give every slot after slot 0 a copy of its own.",
    "output": "change only how the replicas are made: they must compute what the model computes.",
    "grads_none": "follow each replica parameter's `grad_fn`, then `next_functions`: the walk must end at the "
    "original parameter (chapter 02).",
    "grads_wrong": "let each slot's gradient reach the original exactly once: one copy per slot, each summed once.",
    "second_none": "make every backward on the way differentiable (chapter 07): nodes autograd records, "
    "not raw copies.",
    "second_wrong": "make every backward on the way compute its gradient with recorded operations only, so its "
    "own backward is right too (chapter 07).",
    "buffer_missing": "keep every buffer in each replica where the original has it.",  # check_buffers' (Task 5)
    "buffer_copied": (
        "slot 0's replica must hold the original's buffer *objects*: a tensor with their values (a deep copy, "
        "`.clone()`, `.copy_`) is still a copy, and BatchNorm's in-place updates on slot 0 stay in it.",
        "a module keeps its buffers in its `_buffers` dict (chapter 05): for each of `network.named_buffers()`, "
        "find the owning submodule in `replicas[0]` (chapter 03's Step 3 does it for parameters) and put the "
        "original buffer there.",
        "`owner, _, key = name.rpartition('.')`, then `replicas[0].get_submodule(owner)._buffers[key] = buffer`.",
    ),
    "buffer_unregistered": (
        "a module's buffers live in its `_buffers` dict, where `replicate.py` puts a replica's and `.to()` looks; "
        "a tensor of that name in its `__dict__` only hides the entry (chapter 05 names both dicts).",
        "`replicas[0].get_submodule(owner)._buffers[key] = buffer`, not `.__dict__[key] = buffer`; "
        "`setattr(submodule, key, buffer)` registers it too, since `key` is already a buffer's name.",
    ),
    "buffer_shared": "give only slot 0 the original's buffers; leave the other slots' copies as they are.",
    "buffer_dotted": "`_buffers` holds plain names: a dotted name such as `1.running_mean` is a path, "
    "submodule `1` then buffer `running_mean`, and the buffer belongs in that submodule's `_buffers`.",
    "stats": "only slot 0's BatchNorm should write into the original's statistics: make slot 0's buffers the "
    "original's and leave the later slots' copies alone.",
    "time": "print inside your loop, or run the stub cell's last line (`exercises.try_it(...)`), to see "
    "where your code spends its time.",
}
WRITE_IT = (  # the one hint for a stub that still raises
    "replace the `raise NotImplementedError(...)` in the stub cell with your code, run that cell, then run "
    "this check again."
)
ANSWER_AFTER = 3  # failed checks of one task (any mistakes) before its worked answer is offered
SHOWN = 3  # problems said per check, each with its hint: the first found, which later ones often follow from
ACROSS = "across the models and slot counts tried"  # where a strategy check's repeats of one problem are
_failures: dict[str, dict[str, int]] = {}  # task -> {kind: checks that showed it, "": failed checks}


def forget_failures() -> None:
    """Start every task's hints again from their first step."""
    _failures.clear()


class Findings:
    """Collects a check's problems by kind, keeping the first sentence of each and counting repeats."""

    def __init__(self, task: Task, hints: dict[str, Hint]) -> None:
        self.task = task
        self._hints = {**COMMON_HINTS, **hints}  # kind of mistake -> its hint, or the hint's steps
        self._first: dict[str, str] = {}  # kind -> the first sentence recorded for it
        self._seen: dict[str, list] = {}  # kind -> [times found, what a repeat is: "replica parameters, ..."]
        self.held: list[str] = []  # what was verified, said on success
        self.context = "While setting up"  # where the check is, for a sentence about an exception
        self.error: BaseException | None = None

    def problem(self, kind: str, text: str, unit: str = "of the cases the check tried") -> None:
        """Record a problem; ``unit`` says what a repeat of it is, in "the same problem in 3 more {unit}"."""
        self._first.setdefault(kind, text)
        self._seen.setdefault(kind, [0, unit])[0] += 1

    def stop(self, kind: str, text: str) -> NoReturn:
        """Record the problem and stop the check (raise :class:`Stop`): what follows would mean nothing."""
        self.problem(kind, text)
        raise Stop

    @property
    def ok(self) -> bool:
        return not self._first

    def _hint(self, kind: str, times: int) -> str:
        """The hint for a problem found in ``times`` checks, labelled with its step: "(step 1 of 2) ..."."""
        steps = self._hints.get(kind, "")
        steps = (steps,) if isinstance(steps, str) and steps else steps  # one hint is a hint of one step
        step = min(times, len(steps))
        return f"(step {step} of {len(steps)}) {steps[step - 1]}" if steps else ""

    def result(self, not_implemented: str | None = None) -> Result:
        if not_implemented is not None:
            messages = [not_implemented] if not_implemented else []
            return Result(self.task, False, messages, [WRITE_IT], implemented=False, kinds=["not_written"])
        if self.ok:
            _failures.pop(self.task.key, None)
            return Result(self.task, True, list(self.held))
        shown = list(self._first.items())[:SHOWN]  # a hint climbs only when it was shown
        counts = _failures.setdefault(self.task.key, {})  # each kind of mistake climbs its own steps
        counts.update({kind: counts.get(kind, 0) + 1 for kind, _ in shown})
        if "usage" not in self._first:  # a wrong call is not a try at the task
            counts[""] = counts.get("", 0) + 1
        messages, hints = [], []
        for kind, text in shown:
            times, unit = self._seen[kind]
            more = f"{times - 1} more" if times <= 10 else "many more"  # a count past ten is noise
            messages.append(text + (f" (the same problem in {more} {unit})" if times > 1 else ""))
            hint = self._hint(kind, counts[kind])  # the step number is in the hint's own text
            hints += [hint] if hint and hint not in hints else []
        if (tries := counts.get("", 0)) >= ANSWER_AFTER:
            answer = f"`print(exercises.solution_source({self.task.key!r}))`"
            hints.append(f"{tries} failed checks of this task so far: {answer} shows a worked answer.")
        return Result(self.task, False, messages, hints, kinds=list(self._first), error=self.error)


def explain(exc: BaseException) -> str:
    """One or two sentences on an exception from a learner's code: its type, message and where it happened."""
    text = str(exc)
    original = _original_error(text)  # parallel_apply re-raises with the worker's traceback as text
    where = _learner_frame(exc, text)
    message = original or f"{type(exc).__name__}: {_first_lines(text)}"
    return message + (f" ({where})" if where else "")


def _original_error(text: str) -> str | None:
    if "Original Traceback" not in text:
        return None
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return _first_lines(lines[-1].strip()) if lines else None


def _first_lines(text: str, limit: int = 300) -> str:
    text = " ".join(text.strip().split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _is_library(filename: str) -> bool:
    path = os.path.abspath(filename)
    return any(path.startswith(d) for d in _LIBRARY_DIRS) or "site-packages" in path


_WORKER_FRAME = r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)'


def _learner_frame(exc: BaseException, text: str) -> str | None:
    """'in `MyReduceAdd.backward`, line 12: `return (total,)`' for the innermost frame that is not library code."""
    frames = []
    for frame, line in traceback.walk_tb(exc.__traceback__):  # co_qualname: `MyReduceAddCoalesced.forward`
        code = frame.f_code
        frames.append((code.co_filename, line, code.co_qualname, linecache.getline(code.co_filename, line)))
    for match in re.finditer(_WORKER_FRAME, text):  # frames in a worker's text
        frames.append((match.group(1), int(match.group(2)), match.group(3), match.group(4)))
    mine = [f for f in frames if not _is_library(f[0])]
    if not mine:
        return None
    _, lineno, name, line = mine[-1]
    code = f": `{line.strip()}`" if line and line.strip() else ""
    return f"in `{name}`, line {lineno}{code}"


def not_implemented_message(task: Task, exc: BaseException) -> str:
    """The sentence for a stub that still raises NotImplementedError; empty for the stub's own
    ``raise NotImplementedError("Task N (...): ...")``, whose words the stub cell's error already shows."""
    detail = _original_error(str(exc)) or f"NotImplementedError: {_first_lines(str(exc))}"
    if detail.removeprefix("NotImplementedError: ").startswith(f"Task {task.number} ("):
        return ""
    return f"Your code still raises {detail}"
