"""Checks for the small exercises of the chapters: each compares the learner's answer with what the
chapter's own objects say, and answers with a ``Verdict``.

A wrong answer gets a message that says what to change, then a hint that grows with each try: the
first names the idea, the second points at the object to look at, and only from the third failed
try on does the hint give the answer (chapter 06's count check matches each wrong count to its
slip instead, and from the third try says where the worked answer is). A right answer resets the
count. Checks never raise on a wrong
answer; an answer not given yet (``...``) gets one sentence on what to fill in, and costs no hint.

One block per chapter below; a chapter shows ``checks.<name>(...)``, the last line of the cell
under its question (or ``display``-ed, inside an ``if``).
"""

from __future__ import annotations

import re
import warnings
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import torch

_failures: defaultdict[str, int] = defaultdict(int)  # failed tries per exercise, in this kernel


@dataclass(frozen=True)
class Verdict:
    """What a check found: ``ok``, and the message the cell shows (its repr, so it prints bare)."""

    ok: bool
    message: str
    problem: str = ""  # the check's finding as a short name ("non-leaf grad"), for tests: never shown

    def __repr__(self) -> str:
        return self.message

    __str__ = __repr__


def _unset(*values: object) -> bool:
    return any(v is ... for v in values)


def _correct(exercise: str, message: str, finding: str = "") -> Verdict:
    _failures.pop(exercise, None)
    return Verdict(True, "Correct! " + message, finding)


def _not_yet(
    exercise: str, change: str, hints: Sequence[str], answer: Callable[[], str] | str, problem: str = ""
) -> Verdict:
    """A failed try: what to change, then hint n of the ladder; the answer only from the third try."""
    _failures[exercise] += 1
    tries = _failures[exercise]
    ladder = [*hints, answer if isinstance(answer, str) else answer()]
    step = min(tries, len(ladder))
    label = "The answer" if step == len(ladder) else f"Hint {step} of {len(ladder) - 1}"
    more = (
        ""
        if step == len(ladder)
        else "\n(Change your answer and run this check again: each wrong try brings the next step.)"
    )
    return Verdict(False, f"Not yet: {change}\n{label}: {ladder[step - 1]}{more}", problem)


_last_slip: dict[str, str] = {}  # the slip a restarting ladder found last, per exercise, in this kernel


def _ladder(
    exercise: str, hints: Sequence[str], answer: str, restart: bool = False
) -> Callable[..., Verdict]:
    """``fail(change)`` for one exercise: each call climbs its hint ladder one rung (see ``_not_yet``).
    ``restart``: a slip other than the one found last starts the hints again from the first, so each kind
    of mistake gets its own climb from the idea to the answer."""

    def fail(change: str, problem: str = "") -> Verdict:
        if restart and _last_slip.get(exercise) != problem:
            _failures.pop(exercise, None)
        _last_slip[exercise] = problem
        verdict = _not_yet(exercise, change, hints, answer, problem)
        if not restart:
            return verdict
        same_kind = verdict.message.replace("each wrong try brings", "each wrong try of the same kind brings")
        return Verdict(verdict.ok, same_kind, verdict.problem)

    return fail


def _whole_numbers(values: object) -> bool:
    """A list or tuple of ints (True and False are ints to Python, but not counts)."""
    return isinstance(values, (list, tuple)) and all(_count(v) for v in values)


def _count(value: object) -> bool:
    """A whole number: an int, or a float such as 4.0 (True and False are not counts)."""
    if isinstance(value, float):
        return value.is_integer()
    return isinstance(value, int) and not isinstance(value, bool)


def _malformed(*fields: tuple[bool, str]) -> Verdict | None:
    """An answer of the wrong kind: a Verdict naming only the fields that are wrong, at no cost of a hint."""
    wrong = [say for bad, say in fields if bad]
    return Verdict(False, "Not yet: " + "; ".join(wrong) + ".", "not an answer") if wrong else None


# what a learner most often forgets to import, and the line that imports it
_IMPORTS = {
    "SimpleNamespace": "from types import SimpleNamespace",
    "nn": "from torch import nn",
    "torch": "import torch",
    "F": "import torch.nn.functional as F",
    "demos": "from dpteach.course import demos",
    "dpteach": "import dpteach",
}


def _missing_name(err: BaseException, then: str) -> Verdict | None:
    """A NameError in the learner's code: a missing import, not a wrong idea, so say which and cost no hint.

    ``None`` for any other error. Also finds the name in an error re-raised from a replica's thread,
    which keeps only the message.
    """
    if not isinstance(err, NameError):
        return None
    named = re.search(r"name '(\w+)' is not defined", str(err))
    found = getattr(err, "name", None) or (named.group(1) if named else "a name")
    how = f"import it ({_IMPORTS[found]})" if found in _IMPORTS else "import it or define it"
    return Verdict(False, f"Not yet: NameError: {found} is not defined — {how}, then {then}.")


def reset() -> None:
    """Forget every failed try (the hints start again from the first)."""
    _failures.clear()


# ---------------------------------------------------------------- chapter 00 · start here


def _word(value: object) -> str:
    """A name as a learner may type it: " Replicate", "'gather'" and "GATHER" read as the same word."""
    return str(value).strip().strip("'\"`").strip().lower()


def _slot_means(slots: int) -> tuple[float, float, bool]:
    """One step of the course's model on ``slots`` CPU slots, two ways, against one device: the largest
    difference of any gradient when gather joins the outputs before one mean loss over all rows, the
    same when each slot takes the mean loss of its own piece and the slots' means are averaged, and
    whether that average's gradients are one device's up to float rounding."""
    from ..data_parallel import DataParallel
    from ..replicate import replicate
    from ..scatter_gather import scatter
    from . import story

    mse = torch.nn.functional.mse_loss
    x, y = story.make_data()
    reference, gathered, averaged = story.make_model(), story.make_model(), story.make_model()  # seed 0
    mse(reference(x), y).backward()
    devices = ["cpu"] * slots
    mse(DataParallel(gathered, devices)(x), y).backward()  # gather, then one mean over every row
    replicas = replicate(averaged, devices)  # the default strategy: the replicas' gradients reach `averaged`
    means = [mse(r(piece), t) for r, piece, t in zip(replicas, scatter(x, devices), scatter(y, devices))]
    (sum(means) / len(means)).backward()  # each slot's own mean, then the average of the slots' means

    def worst(model) -> float:
        return max(
            (p.grad - q.grad).abs().max().item() for p, q in zip(model.parameters(), reference.parameters())
        )

    # the one-step check's tolerance (cell "One step, checked against one device"): float rounding only
    close = all(
        torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-6)
        for p, q in zip(averaged.parameters(), reference.parameters())
    )
    return worst(gathered), worst(averaged), close


def mean_of_means(two_slots: bool | object, three_slots: bool | object) -> Verdict:
    """Exercise 4: does averaging the slots' own mean losses give one device's gradients, on 2 slots
    (``two_slots``) and on 3 (``three_slots``)? The truth is a live step of the course's model on CPU
    slots (``_slot_means``), compared with one device as the chapter's one-step check compares.
    Findings (``Verdict.problem``): ``"equal pieces"`` (``two_slots`` wrong), ``"unequal pieces"``
    (``three_slots`` wrong), ``"both"``. The first wrong try's message names neither prediction; the
    second names the wrong one with its measured difference."""
    from ..scatter_gather import scatter
    from . import story

    name = "ch00.mean_of_means"
    if _unset(two_slots, three_slots) or not all(isinstance(v, bool) for v in (two_slots, three_slots)):
        return Verdict(False, "Set `two_slots` and `three_slots` to True or False, then run this cell again.")
    x, _ = story.make_data()
    rows = len(x)
    sizes = {s: [len(p) for p in scatter(x, ["cpu"] * s)] for s in (2, 3)}
    found = {s: _slot_means(s) for s in (2, 3)}
    truth = {s: found[s][2] for s in (2, 3)}
    pieces = {s: ", ".join(map(str, sizes[s])) for s in (2, 3)}
    weights = {  # the weight of one row's squared error in the average of the means, per piece size
        s: " and ".join(f"1/{s * n} in a piece of {n}" for n in dict.fromkeys(sizes[s])) for s in (2, 3)
    }
    shown = (
        f"the average of the means differs from one device's gradients by {found[2][1]:.1e} on 2 slots and "
        f"{found[3][1]:.1e} on 3 (gather, then one mean: {found[3][0]:.1e} on 3)"
    )
    if (two_slots, three_slots) == (truth[2], truth[3]):
        return _correct(
            name,
            f"{shown[0].upper()}{shown[1:]}. On s slots the average of the means weighs a row of a piece of n rows "
            f"by 1/(s·n): on 2 slots that is {weights[2]}, one device's 1/{rows} for every row; on 3 it is "
            f"{weights[3]}, so the rows of the smaller piece count more.",
        )
    wrong = []
    if two_slots != truth[2]:
        wrong.append(
            f"on 2 slots (pieces of {pieces[2]}) the average of the means differs from one device by "
            f"{found[2][1]:.1e}, float rounding: change `two_slots`"
        )
    if three_slots != truth[3]:
        wrong.append(
            f"on 3 slots (pieces of {pieces[3]}) the average of the means differs from one device by "
            f"{found[3][1]:.1e}, far more than the gathered mean's {found[3][0]:.1e}: change `three_slots`"
        )
    problem = "both" if len(wrong) == 2 else ("equal pieces" if two_slots != truth[2] else "unequal pieces")
    # A first try learns only that the pair is wrong: with two True/False answers, naming the wrong one (or
    # its measured difference) would be the answer itself. From the second try on, the measurement says which.
    first = (
        "at least one of your two predictions disagrees with a live step. Work out each with the hint "
        "below, then change the one that does not hold."
    )
    return _not_yet(
        name,
        first if not _failures.get(name) else "; ".join(wrong) + ".",
        [
            f"Write each loss as a sum over rows. One mean over {rows} rows weighs every row's squared error by "
            f"1/{rows}. What weight does the average of the slots' means give a row in a piece of n rows?",
            f"On s slots that weight is 1/(s·n). Work it out for the pieces of 2 slots ({pieces[2]}) and of 3 "
            f"({pieces[3]}), and compare with 1/{rows}.",
        ],
        f"two_slots = {truth[2]}, three_slots = {truth[3]}. On s slots the average of the means weighs a row of a "
        f"piece of n rows by 1/(s·n): {weights[2]} on 2 slots, {weights[3]} on 3, against one device's "
        f"1/{rows} for every row; {shown}.",
        problem,
    )


def pieces(prediction: Sequence[int] | object, rows: int, slots: int) -> Verdict:
    """Exercise 1: the piece sizes ``dpteach.scatter`` gives for ``rows`` rows over ``slots`` slots."""
    from ..scatter_gather import scatter

    name = f"ch00.pieces.{rows}.{slots}"
    if _unset(prediction):
        return Verdict(False, "Write your prediction as a list of piece sizes, e.g. [3, 3], then run again.")
    if not _whole_numbers(prediction):
        return Verdict(
            False, f"Give a list of whole numbers, one piece size each, e.g. [3, 3], not {prediction!r}."
        )
    truth = [len(p) for p in scatter(torch.arange(rows), ["cpu"] * slots)]
    if list(prediction) == truth:  # type: ignore[call-overload]
        idle = slots - len(truth)
        return _correct(
            name, f"{len(truth)} pieces; {idle} slot(s) get nothing." if idle else "Every slot works."
        )
    guess = list(prediction)  # type: ignore[call-overload]
    if sum(guess) != rows:
        change = f"your pieces hold {sum(guess)} rows; they must hold all {rows}."
    elif len(guess) != len(truth):
        change = (
            f"the sizes add up to {rows}, but torch.chunk cuts {rows} rows over {slots} slots into "
            f"{len(truth)} pieces, not {len(guess)}. Change the list."
        )
    else:
        change = (
            f"{len(truth)} pieces is right, but torch.chunk gives every piece but the last one size. "
            "Change the sizes."
        )
    return _not_yet(
        name,
        change,
        [
            "torch.chunk first picks one piece size for all, rounding rows / slots up.",
            f"Each piece holds ceil({rows} / {slots}) = {-(-rows // slots)} rows; the last takes what is left, "
            "and no piece is ever empty.",
        ],
        lambda: f"{truth}.",
    )


def idle_slots(idle: Sequence[int] | object, rows: int, most: int = 8) -> Verdict:
    """Exercise 1: ``idle``, the slot counts from 1 to ``most`` for which ``dpteach.scatter`` leaves at least
    one slot without rows of a batch of ``rows``. Findings (``Verdict.problem``): ``"extra"`` (a count
    whose slots all work), ``"missed"`` (an idle count left out), ``"extra and missed"``."""
    from ..scatter_gather import scatter

    name = f"ch00.idle_slots.{rows}"
    if _unset(idle) or not isinstance(idle, (set, frozenset, list, tuple)):
        return Verdict(
            False,
            "Set `idle` to a set of slot counts, e.g. {2, 3} (or set() for none), then run this cell again.",
        )
    if not all(_count(n) for n in idle):
        return Verdict(False, f"Give whole numbers of slots, from 1 to {most}, e.g. {{2, 3}}, not {idle!r}.")
    given = {int(n) for n in idle}
    outside = sorted(n for n in given if not 1 <= n <= most)
    if outside:
        return Verdict(
            False, f"The question asks about 1 to {most} slots: take out {', '.join(map(str, outside))}."
        )
    sizes = {n: [len(p) for p in scatter(torch.arange(rows), ["cpu"] * n)] for n in range(1, most + 1)}
    truth = {n for n, cut in sizes.items() if len(cut) < n}  # fewer pieces than slots: some slot gets none
    told = "; ".join(
        f"{n} slots get pieces of {', '.join(map(str, sizes[n]))} ({n - len(sizes[n])} idle)"
        for n in sorted(truth)
    )
    if given == truth:
        return _correct(
            name,
            f"{told}. torch.chunk cuts pieces of ceil({rows} / slots) rows, and the rows can run out before the "
            "slots do.",
        )
    extra, missed = sorted(given - truth), sorted(truth - given)
    change = []
    if extra:
        them = "it" if len(extra) == 1 else "them"
        change.append(f"with {' or '.join(map(str, extra))} slots every slot gets rows: take {them} out")
    if missed:
        more = " more" if given & truth else ""  # some idle counts found already
        change.append(
            f"{len(missed)}{more} slot count{'s' * (len(missed) > 1)} from 1 to {most} leave"
            f"{'s' * (len(missed) == 1)} a slot idle: find {'it' if len(missed) == 1 else 'them'}"
        )
    return _not_yet(
        name,
        "; ".join(change) + ".",
        [
            "torch.chunk does not aim for one piece per slot: it first picks one piece size for all, rounding "
            "rows / slots up.",
            f"On s slots every piece but the last holds ceil({rows} / s) rows. Count how many such pieces {rows} "
            "rows fill, and compare with s.",
        ],
        f"idle = {{{', '.join(map(str, sorted(truth)))}}}: {told}.",
        "extra and missed" if extra and missed else ("extra" if extra else "missed"),
    )


# ---------------------------------------------------------------- chapter 01 · the bug


def _offered(
    exercise: str, change: str, hints: Sequence[str], problem: str = "", rung: int | None = None
) -> Verdict:
    """A failed try of a chapter-01 check: what to change and the next hint (the last one repeats).

    ``rung`` picks the hint (1 for the first) when the check keeps its own count, one ladder per
    mistake it can name; by default the hints climb with the exercise's failed tries. As chapter 06's
    count check and the Tasks do, the answer is never printed unasked: from the third failed try of
    the exercise on the message says where to read it, the Answer block or ``show_answer=True``."""
    _failures[exercise] += 1
    tries = _failures[exercise]
    step = min(tries if rung is None else rung, len(hints))
    lines = [f"Not yet: {change}", f"Hint {step} of {len(hints)}: {hints[step - 1]}"]
    if tries >= TRIES_BEFORE_ANSWER:
        lines.append(
            f"{tries} tries so far: the answer is in the Answer block under the exercise; or run the check "
            "again with show_answer=True to see it here."
        )
    else:
        lines.append("(Change your answer and run this check again: each wrong try brings the next hint.)")
    return Verdict(False, "\n".join(lines), problem)


def _shown(answer: str) -> Verdict:
    """The answer, asked for with ``show_answer=True``: it costs no try."""
    return Verdict(False, f"The answer: {answer}", "answer shown")


def _reached(strategy: str, devices: Sequence) -> tuple[int, int, int]:
    """One forward of the course model under ``strategy``: how many AccumulateGrad nodes the walk back
    from the loss reaches, how many of them are the model's, and how many parameters the model has."""
    from ..data_parallel import DataParallel
    from . import story

    x, y = story.make_data()
    slots = list(devices)
    model = story.make_model().to(slots[0])
    loss = torch.nn.functional.mse_loss(
        DataParallel(model, slots, strategy=strategy)(x.to(slots[0])), y.to(slots[0])
    )
    found = _accumulators(loss.grad_fn)
    own = {id(p) for p in model.parameters()}
    return len(found), sum(id(node.variable) in own for node in found), len(own)


def accumulators_reached(prediction: int | object, devices: Sequence, show_answer: bool = False) -> Verdict:
    """The exercise: ``prediction``, how many ``AccumulateGrad`` nodes backward reaches from the loss of
    one step under ``"clone"`` on ``devices``. Walks the loss's edges and counts. Findings
    (``Verdict.problem``): ``"one model"`` (one model's parameters), ``"model too"`` (the model's
    counted beside the replicas'), ``"one per replica"`` (a node per replica, not per parameter),
    ``"none"`` (0), ``"too many"``, ``"too few"``."""
    name = "ch01.accumulators_reached"
    total, own, params = _reached("clone", devices)
    if own:  # one slot: DataParallel runs the model itself, so no replica is made and no gradient is lost
        return Verdict(
            False,
            f"With one slot nothing is replicated: DataParallel runs the model itself (as torch.nn.DataParallel "
            f"and C++ data_parallel do with one device), so the walk reaches the model's own {own} AccumulateGrad "
            "nodes and the model learns; there is no bug to count. Run this check with two or more slots, such as "
            "`devices = dpteach.default_devices()`.",
            "one slot",
        )
    replicas = total // params
    answer = (
        f"prediction = {total}: each of the {replicas} replicas has {params} parameters, each a fresh leaf with "
        "its own AccumulateGrad node; none of them is the model's."
    )
    if show_answer:
        return _shown(answer)
    if _unset(prediction):
        return Verdict(False, "Set `prediction` to a whole number, then run this cell again.")
    if not _count(prediction):
        return Verdict(False, f"Not yet: `prediction` is a whole number, such as 3 (got {prediction!r}).")
    guess = int(prediction)
    if guess < 0:  # a slip of sign, not of counting: say so and cost no hint
        return Verdict(
            False,
            f"Not yet: {guess} is below zero, and a count of nodes is 0 or more. Set `prediction` to how many "
            "AccumulateGrad nodes backward reaches, then run this cell again.",
            "negative",
        )
    if guess == total:
        fixed, fixed_own, _ = _reached("rewire", devices)
        return _correct(
            name,
            f"The walk back from the loss reaches {total} AccumulateGrad nodes, {own} of them the model's: each "
            f'stored its gradient in a replica\'s .grad. Under "rewire" the same walk reaches {fixed}, '
            f"{fixed_own} of them the model's: the copies are no longer leaves, their edges lead to the original.",
        )
    findings = {  # a later key wins where two coincide (4 slots: one model's count is also one per replica)
        replicas: (
            "one per replica",
            f"{replicas} is one node per replica, but each replica has {params} parameters",
        ),
        params: (
            "one model",
            f"{params} counts one model's parameters, but the loss was computed by {replicas} replicas",
        ),
        total + params: (
            "model too",
            f"{guess} counts the model's own {params} parameters too, but no edge leads to them",
        ),
        0: ("none", "0 would mean no .grad was filled, but every replica's 0.weight got one above"),
    }
    problem, why = findings.get(
        guess,
        ("too many", f"{guess} is too many: make `prediction` smaller")
        if guess > total
        else (
            "too few",
            f"{guess} is too few: backward reached more AccumulateGrad nodes, make `prediction` larger",
        ),
    )
    return _offered(
        name,
        f"{why}." if problem in ("too many", "too few") else f"{why}. Change `prediction`.",
        [
            "Backward stores a gradient only through an AccumulateGrad node, one per leaf that requires grad. "
            'Which tensors got a .grad in the step under "clone"?',
            "Printing `model` in 'The task, the model, the loop' listed two Linear layers, each with a weight "
            'and a bias; the step under "clone" showed that every replica\'s copy of 0.weight got a .grad, and '
            "so did every other parameter's copy. Count those leaves, in every replica.",
            f"Each of the {replicas} replicas holds {params} parameters, every one a fresh leaf that the forward "
            f"used; the model's own {params} are not reached.",
        ],
        problem,
    )


# the cuts a suspect may make: one or two of the course model's parameters, leaving a loss that falls by
# at least a quarter in 60 steps (cutting both weights leaves one that barely moves, so it is not offered)
_PARAMETER_NAMES = ("0.weight", "0.bias", "2.weight", "2.bias")
_CUTS = [
    frozenset(c)
    for c in [(n,) for n in _PARAMETER_NAMES]
    + [(a, b) for i, a in enumerate(_PARAMETER_NAMES) for b in _PARAMETER_NAMES[i + 1 :]]
    if set(c) != {"0.weight", "2.weight"}
]


def _make_suspect(cut: frozenset) -> Callable:
    """A replicate strategy that looks right: ``"rewire"``'s replicas, except that every parameter named
    in ``cut`` is swapped, on every slot, for a fresh leaf holding the same values (as ``"clone"`` makes
    it), so the model's own parameter of that name never gets a gradient.

    Built on ``"rewire"``, not ``"broadcast"``: rewire has one ReduceAdd node per parameter, which backward
    never reaches once its copies are swapped out. One Broadcast node makes every copy, and backward
    hands the unused outputs' gradients on as zeros, so the model's .grad would be zeros, not None."""
    from ..replicate import rewire
    from ..replicate._modules import set_parameter
    from ..replicate.clone import clone_tensor

    def suspect(network, devices, detach=False):
        replicas = rewire.replicate(network, devices, detach)
        for replica, device in zip(replicas, devices):
            for name in cut:
                if name not in dict(network.named_parameters()):
                    continue  # another model: only the names it has can be cut
                path, key = name.rpartition(".")[::2]
                original = network.get_parameter(name)
                # BROKEN (#19540), for these names only: a fresh leaf with no edge to `original`
                set_parameter(
                    replica.get_submodule(path), key, clone_tensor(original, device).requires_grad_()
                )
        return replicas

    return suspect


def suspect_replicate() -> Callable:
    """Exercise 2's suspect: a strategy, ``suspect(network, devices, detach=False)``, whose replicas look
    right (the model's values, outputs equal to the model's, a loss that falls) and which cuts the
    gradient edge of one or two of the course model's parameters, picked at random per call."""
    import random

    return _make_suspect(random.choice(_CUTS))


def _cut_by_step(strategy, devices: Sequence) -> set[str]:
    """The truth, from what backward does: the course model's parameters with no .grad after one step."""
    from ..data_parallel import DataParallel
    from . import story

    x, y = story.make_data()
    slots = list(devices)
    model = story.make_model().to(slots[0])
    out = DataParallel(model, slots, strategy=strategy)(x.to(slots[0]))
    torch.nn.functional.mse_loss(out, y.to(slots[0])).backward()
    return {n for n, p in model.named_parameters() if p.grad is None}


def cut_edges(find_cut: Callable, devices: Sequence, show_answer: bool = False) -> Verdict:
    """Exercise 2: ``find_cut(strategy)`` names the course model's parameters whose gradient stops in the
    replicas under ``strategy``. Run on a fresh suspect, on other suspects (other cuts), on ``"clone"``
    (all four) and on ``"broadcast"`` (none); the truth of each comes from a step's ``.grad``, not from
    the suspect's own list. Findings (``Verdict.problem``): ``"one slot"``, ``"not a set"``, ``"error"``,
    ``"wrong"``."""
    name = "ch01.cut_edges"
    names = _PARAMETER_NAMES
    answer = (
        "inside find_cut, after `model = story.make_model().to(devices[0])`:\n"
        "    loss = nn.functional.mse_loss(dpteach.DataParallel(model, devices, strategy=strategy)(xb), yb)\n"
        "    loss.backward()\n"
        "    return {name for name, p in model.named_parameters() if p.grad is None}"
    )
    if show_answer:
        return _shown(answer)
    if len(list(devices)) < 2:
        return Verdict(
            False,
            "With one slot nothing is replicated: DataParallel runs the model itself, so no strategy can cut an "
            "edge and every answer would be the empty set. Run this check with two or more slots, such as "
            "`devices = dpteach.default_devices()`.",
            "one slot",
        )
    import random

    # three suspects with three different cuts, new on every run: only a computed answer fits them all
    cases = [("a fresh suspect", _make_suspect(c)) for c in random.sample(_CUTS, 3)]
    cases += [('"clone"', "clone"), ('"broadcast"', "broadcast")]
    for label, strategy in cases:
        try:
            got = find_cut(strategy)
        except Exception as err:  # the learner's code failed: what it raised, at no cost of a hint
            missing = _missing_name(err, "run this check again")
            if missing is not None:
                return missing
            return Verdict(
                False,
                f"Not yet: find_cut({label}) raised {type(err).__name__}: {err}. Fix the line it names, then "
                "run this check again.",
                "error",
            )
        if got is ... or got is None:
            return Verdict(
                False,
                f"Not yet: find_cut returned {got!r}: make it return a set of parameter names, such as "
                '{"0.bias"}, computed from the step.',
                "not a set",
            )
        if not isinstance(got, (set, frozenset, list, tuple)) or not all(isinstance(n, str) for n in got):
            return Verdict(
                False,
                f"Not yet: find_cut returned {got!r}; return a set of names (strings) from "
                '`model.named_parameters()`, such as {"0.bias"}.',
                "not a set",
            )
        unknown = sorted(set(got) - set(names))
        if unknown:
            return Verdict(
                False,
                f"Not yet: {', '.join(map(repr, unknown))} {'is' if len(unknown) == 1 else 'are'} not a name of "
                f"the course model's parameters ({', '.join(names)}): take the names from "
                "`model.named_parameters()`.",
                "not a set",
            )
        truth = _cut_by_step(strategy, devices)
        if set(got) != truth:
            extra, missed = len(set(got) - truth), len(truth - set(got))
            said = []
            if extra:
                said.append(f"{extra} of the names you returned still get their gradient (remove them)")
            if missed:
                said.append(
                    f"{missed} of the parameters that get no gradient {'are' if missed > 1 else 'is'} missing (add them)"
                )
            return _offered(
                name,
                f"under {label}, find_cut returned {sorted(got)}: "
                + " and ".join(said)
                + ". Compute the names "
                "from one step through `strategy`, not from a guess; each call may get another strategy.",
                [
                    "A parameter whose gradient edge is cut keeps `.grad` None after backward: that is the "
                    "first-backward check of 'In your own code', asked of each parameter by name.",
                    "In find_cut, run one forward through `dpteach.DataParallel(model, devices, strategy=strategy)` "
                    "on `xb`, take the MSE loss against `yb`, call `backward()`, then look at each "
                    "`model.named_parameters()`.",
                    "Return the names whose `.grad` is None: `{name for name, p in model.named_parameters() if "
                    "p.grad is None}`.",
                ],
                "wrong",
            )
    return _correct(
        name,
        'find_cut named the cut parameters of every suspect, all four under "clone" and none under '
        '"broadcast". A suspect\'s loss falls, since its other parameters learn: a falling loss does not show '
        "that every parameter gets its gradient; one backward and a look at each .grad does.",
    )


# ---------------------------------------------------------------- chapter 02 · reading autograd graphs


def leaves(your_answer: Mapping[str, object], tensors: Mapping[str, torch.Tensor]) -> Verdict:
    """Exercise 1: which tensors are leaves. ``tensors`` maps each name to the tensor."""
    name = "ch02.leaves"
    if _unset(*your_answer.values()):
        return Verdict(False, "Fill in every ... with True or False, then run this cell again.")
    words = [k for k, v in your_answer.items() if not isinstance(v, bool)]
    if words:
        return Verdict(
            False, f"Use True or False (no quotes) for {', '.join(words)}, then run this cell again."
        )
    truth = {k: t.is_leaf for k, t in tensors.items()}
    wrong = [k for k in truth if your_answer.get(k) != truth[k]]
    if not wrong:
        grads = [k for k, t in tensors.items() if t.is_leaf and t.requires_grad]
        return _correct(
            name, f"Only {', '.join(grads)} will get a .grad: a leaf gets one only if it requires grad."
        )
    hints = [
        "A leaf is a tensor no *recorded* operation made; requiring grad does not decide it.",
        "Print each tensor's grad_fn: None means a leaf. detach() returns a tensor with no history.",
    ]
    # True or False each: naming the wrong ones would give the answer away, so until the ladder's last
    # rung (the answer) the message says only how many are wrong
    if _failures[name] + 1 > len(hints):
        change = f"change your answer for {', '.join(wrong)}."
    else:
        change = f"{len(wrong)} of your {len(truth)} answers {'is' if len(wrong) == 1 else 'are'} wrong."
    return _not_yet(name, change, hints, lambda: ", ".join(f"{k}: {v}" for k, v in truth.items()) + ".")


def _accumulators(root) -> set:
    seen, todo, found = set(), [root], set()
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        if hasattr(fn, "variable"):
            found.add(fn)
        todo += [f for f, _ in fn.next_functions]
    return found


def _accumulator_edges(root) -> int:
    """The AccumulateGrad lines a walk that follows every edge without a set of seen nodes prints."""
    return sum(
        _accumulator_edges(n) if not hasattr(n, "variable") else 1 for n, _ in root.next_functions if n
    )


def accumulators(count: int | object, loss: torch.Tensor, model: torch.nn.Module) -> Verdict:
    """Exercise 2: how many ``AccumulateGrad`` nodes are behind ``loss``, each counted once."""
    name = "ch02.accumulators"
    if _unset(count):
        return Verdict(False, "Set `accumulators` to your count, then run this cell again.")
    if not _count(count):
        return Verdict(False, f"{count!r} is not a number: write the count in digits, without quotes.")
    truth = len(_accumulators(loss.grad_fn))
    n_params = len(list(model.parameters()))
    frozen = n_params - sum(p.requires_grad for p in model.parameters())
    if count == truth:
        said = f"; the frozen one{'s' * (frozen > 1)} asked for no gradient" if frozen else ""
        return _correct(
            name, f"{truth} nodes for {n_params} parameters: one per leaf that requires grad{said}."
        )
    edges = _accumulator_edges(loss.grad_fn)
    if count > truth and count == edges:
        change = f"{count} is more than there are: you counted a node once per edge into it. Keep a set of the nodes seen."
    elif count > truth and count == n_params and frozen:
        change = f"{count} is one per parameter, but a frozen parameter (requires_grad=False) has no AccumulateGrad node."
    elif count > truth:
        change = f"{count} is more than there are."
    else:
        change = f"{count} is too few: follow every entry of next_functions, to the bottom."
    return _not_yet(
        name,
        change,
        [
            "Every leaf that requires grad has exactly one AccumulateGrad node, shared by all its uses.",
            "Walk next_functions from loss.grad_fn, keeping a set of the nodes that have a `.variable`.",
        ],
        lambda: f"{truth}, one per parameter that requires grad ({n_params} parameters, {frozen} frozen).",
    )


def _route(root, leaf) -> list[int] | None:
    """The entry numbers of the first path from ``root`` down to ``leaf``'s AccumulateGrad, or None."""
    if root is None:
        return None
    if getattr(root, "variable", None) is leaf:
        return []
    for i, (fn, _) in enumerate(root.next_functions):
        rest = _route(fn, leaf)
        if rest is not None:
            return [i, *rest]
    return None


def walk_path(path: object, loss: torch.Tensor, leaf: torch.Tensor, leaf_name: str = "a") -> Verdict:
    """Exercise 3: ``path``, the entry of ``next_functions`` taken at each step from ``loss.grad_fn`` down to
    ``leaf``'s ``AccumulateGrad``. The check takes the learner's steps itself and says where they lead."""
    name = "ch02.walk_path"
    if _unset(path):
        return Verdict(
            False, "Set `path` to the list of entry numbers you took, such as [1, 0], then run this again."
        )
    if not _whole_numbers(path) or any(int(i) < 0 for i in path):
        return Verdict(
            False, f"Not yet: `path` is a list of entry numbers, 0 or more, such as [1, 0] (got {path!r})."
        )
    truth = _route(loss.grad_fn, leaf)
    steps, node = [type(loss.grad_fn).__name__], loss.grad_fn
    change = ""
    for k, i in enumerate(int(i) for i in path):
        entries = node.next_functions
        if i >= len(entries):
            change = (
                f"step {k + 1}: {type(node).__name__} has {len(entries)} entr{'y' if len(entries) == 1 else 'ies'} "
                f"(numbered 0 to {len(entries) - 1}), so there is no entry {i}"
                if entries
                else f"step {k + 1}: your path reached an AccumulateGrad, which has no next_functions: stop there"
            )
            break
        node = entries[i][0]
        if node is None:
            change = (
                f"step {k + 1} takes entry {i} of {steps[-1]}, which is None: an input that needs no gradient. "
                "Take another entry there"
            )
            break
        steps.append(type(node).__name__)
    else:
        if getattr(node, "variable", None) is leaf:
            return _correct(
                name,
                " → ".join(steps)
                + f" ({leaf_name}). Each step was one `.next_functions[i][0]`, as `walk` takes it.",
            )
        if hasattr(node, "variable"):
            change = (
                f"your path ends at an AccumulateGrad, but of another leaf (its .variable is not {leaf_name}): "
                "go back to the last node that used both and take its other entry"
            )
        else:
            change = f"your path stops at {steps[-1]}, which is not an AccumulateGrad: take more steps"
    return _not_yet(
        name,
        change + ".",
        [
            "Each step takes one entry of the current node's next_functions: print `node.next_functions` and "
            f"pick the entry whose node leads towards {leaf_name}.",
            "The nodes come outside-in: the last operation of the forward first. For each operation its entries "
            "are in the order of its inputs, left to right as you wrote them.",
        ],
        f"path = {truth}: "
        + "; ".join(f"step {k + 1} takes entry {i}" for k, i in enumerate(truth or []))
        + ".",
    )


# ---------------------------------------------------------------- chapter 03 · rewiring gradient edges


def _walk_answer() -> str:
    return (
        "the walk, line by line (the Answer fold under this cell has it too):\n"
        "    originals = {id(p) for p in model.parameters()}\n"
        "    found, seen, todo = [], set(), [loss.grad_fn]\n"
        "    while todo:\n"
        "        fn = todo.pop()\n"
        "        if fn is None or fn in seen:\n"
        "            continue\n"
        "        seen.add(fn)\n"
        "        if hasattr(fn, 'variable') and id(fn.variable) not in originals:\n"
        "            found.append(fn.variable)\n"
        "        todo += [f for f, _ in fn.next_functions]\n"
        "    return found"
    )


def dead_ends_found(find: Callable | object, model: torch.nn.Module, devices: Sequence) -> Verdict:
    """Exercise 1: ``find(loss, model)`` returns the leaf tensors behind ``loss`` that are not ``model``'s
    parameters. Run on one step of ``model`` under ``"clone"``, ``"rewire"`` and ``"broadcast"`` (on
    ``devices``, then on three slots of its first device), it must name the replica parameters
    ``autograd_graph(...).dead_ends`` names (``dpteach/graph/walk.py``): every one, and nothing else."""
    from ..data_parallel import step
    from ..graph import autograd_graph
    from . import story

    name = "ch03.dead_ends_found"
    if _unset(find) or not callable(find):
        return Verdict(False, "Define find_dead_ends(loss, model) first, then run this cell again.")
    hints = [
        "A dead end is a leaf behind the loss that is not one of the model's parameters: a gradient that "
        "reaches it stops in that leaf's .grad, which nobody reads.",
        "Walk from loss.grad_fn through every entry of next_functions (skip None), keeping a set of the "
        "nodes seen; a node with a .variable is an AccumulateGrad, and .variable is its leaf.",
    ]
    x = story.make_data()[0]  # on the CPU: the step scatters it onto the slots
    originals = {id(p): f"the model's own {n}" for n, p in model.named_parameters()}
    cases = [(s, list(devices)) for s in ("clone", "rewire", "broadcast")] + [("clone", [devices[0]] * 3)]
    for strategy, slots in cases:
        done = step(model, x, slots, strategy=strategy, backward=False)
        where = f'under "{strategy}" on {len(slots)} slots'
        labels = dict(originals)
        labels.update(
            {
                id(p): f"replica {j} · {n}"
                for j, r in enumerate(done.replicas)
                for n, p in r.named_parameters()
            }
        )
        truth = {
            f"replica {p.slot} · {p.name}"
            for p in autograd_graph(done.loss, module=model, replicas=done.replicas).dead_ends
        }
        try:
            found = find(done.loss, model)
        except Exception as err:  # the learner's code: say what it raised, never raise
            return Verdict(False, f"Not yet: find_dead_ends raised {type(err).__name__}: {err} ({where}).")
        if found is None:
            return Verdict(
                False,
                "find_dead_ends returned None: write the walk in its body and end it with `return` and the list of "
                "tensors it found.",
            )
        if isinstance(found, torch.Tensor) or not all(isinstance(t, torch.Tensor) for t in found):
            return Verdict(False, "Return a list of the dead-end tensors themselves (the leaves), not names.")
        got = {
            labels.get(id(t), "a tensor that is neither a replica's nor the model's parameter") for t in found
        }
        extra, missing = sorted(got - truth), sorted(truth - got)
        if extra or missing:
            own = any(e.startswith("the model's own") for e in extra)
            change = "; ".join(
                part
                for part in (
                    f"{where} you returned {extra}, which are no dead ends"
                    + (
                        ": skip the model's own parameters, their .grad is what the optimizer reads"
                        if own
                        else ""
                    )
                    if extra
                    else "",
                    f"{where} you missed {missing}: follow every entry of next_functions, down to the leaves"
                    if missing
                    else "",
                )
                if part
            )
            return _not_yet(name, change + ".", hints, _walk_answer)
    return _correct(
        name,
        'Every replica parameter is a dead end under "clone", none under "rewire" or "broadcast": the same '
        "list autograd_graph(...).dead_ends gives.",
    )


def _one_replica_rewired(
    model: torch.nn.Module, devices: Sequence
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """One step of chapter 03's forward with step 3's loop given replica 1 alone: the gradients that reach
    each replica's copy of ``0.weight``, and the one that reaches ``model[0].weight``. Uses
    ``torch.autograd.grad``, so no ``.grad`` of ``model`` changes."""
    from ..data_parallel import step
    from ..replicate import replicate
    from ..replicate.rewire import rewire_grad_edges
    from . import story

    def one_rewired(module, slots, detach=False):  # the chapter's rewire(model, [replicas[1]])
        replicas = replicate(module, slots, strategy="clone")
        rewire_grad_edges(module, [replicas[1]])
        return replicas

    x, y = story.make_data()
    loss_fn = lambda out: torch.nn.functional.mse_loss(out, y.to(devices[0]))  # noqa: E731
    done = step(model, x.to(devices[0]), devices, strategy=one_rewired, loss_fn=loss_fn, backward=False)
    copies = [r[0].weight for r in done.replicas]
    *received, reached = torch.autograd.grad(done.loss, copies + [model[0].weight])
    return list(received), reached


def one_replica_rewired(
    answer: torch.Tensor | None | object, model: torch.nn.Module, devices: Sequence
) -> Verdict:
    """Exercise 2: the original ``0.weight``'s gradient when step 3's loop rewires replica 1 alone, as an
    expression of ``per_replica`` (what reached each replica's copy of ``0.weight``), or ``None``.

    The truth comes from the library: the same step run here (``_one_replica_rewired``), on ``model``'s
    weights. Only replica 1's copies lead to the original, so the answer is ``per_replica[1]``."""
    name = "ch03.one_replica_rewired"
    if _unset(answer):
        return Verdict(
            False,
            "Set `grad_0_weight` to your prediction, written with per_replica (such as per_replica[0]), or to "
            "None, then run this cell again.",
        )
    if answer is not None and not isinstance(answer, torch.Tensor):
        return Verdict(
            False,
            f"Not yet: `grad_0_weight` is a {type(answer).__name__}; give a tensor written with per_replica "
            "(such as per_replica[0]), or None.",
            "not an answer",
        )
    received, reached = _one_replica_rewired(model, devices)
    here = reached.device  # the original's device: ReduceAdd sums there

    def equals(t: torch.Tensor, want: torch.Tensor) -> bool:
        return t.shape == want.shape and torch.allclose(t.to(here), want.to(here), rtol=1e-4, atol=1e-6)

    if answer is not None and equals(answer, reached):
        return _correct(
            name,
            "The original gets replica 1's share alone, the gradient of the rows on slot 1: what reached "
            "replica 0's copies stays in their own .grad, so slot 0's rows drop out of training, and no error "
            "says so.",
        )
    whole = sum(g.to(here) for g in received)
    if answer is not None and answer.shape != reached.shape:  # the wrong kind of answer: it costs no hint
        return Verdict(
            False,
            f"Not yet: `grad_0_weight` has shape {tuple(answer.shape)}; a gradient of 0.weight has the "
            f"weight's shape, {tuple(reached.shape)}: write it with per_replica.",
            "not an answer",
        )
    if answer is None:
        change = (
            "the original's .grad does fill: replica 1's copies lead to it through ReduceAdd nodes. Write "
            "what arrives there."
        )
    elif equals(answer, whole):
        change = (
            "that sum is the one-device gradient, what the full rewire gives. Here replica 0's copies are still "
            "leaves: leave out what stops in them."
        )
    elif equals(answer, received[0]):
        change = (
            "per_replica[0] reached replica 0's copy, which is still a leaf: it stops in that copy's own .grad. "
            "Use the copy that has an edge to the original."
        )
    elif any(equals(answer, k * whole) for k in (0.5, 2.0, 1 / len(received))):
        change = (
            "that is the one-device gradient scaled, but ReduceAdd neither averages nor scales: it adds the "
            "gradients of the copies that lead to it. Which copies do?"
        )
    elif any(equals(answer, k * received[1]) for k in (0.5, 2.0, 1 / len(received), len(received))):
        change = (
            "nothing rescales a gradient on its way: ReduceAdd adds the gradients it gets, unscaled. Drop the "
            "factor."
        )
    else:
        change = "that is not the gradient that reaches the original. Write it with per_replica."
    return _not_yet(
        name,
        change,
        [
            "A gradient reaches the original only along an edge, and each copy's gradient is the share of its "
            "own rows: only the copies with an edge add theirs.",
            "Only replica 1's copies went through ReduceAdd.apply; replica 0's copy of 0.weight is still a "
            "leaf, so per_replica[0] stops there.",
        ],
        "grad_0_weight = per_replica[1]: the gradient of slot 1's rows alone; replica 0's share stops in its "
        "leaf.",
    )


def mean_per_piece(
    factor: float | object, per_replica: Sequence[torch.Tensor], grad: torch.Tensor, batch: torch.Tensor
) -> Verdict:
    """Exercise 3: by what factor the original's gradient would change if every replica took the mean
    loss of its own piece, and ReduceAdd still summed.

    ``per_replica``: the gradients of the whole batch's mean loss that reached each replica's copy;
    ``grad``: the original's gradient, their sum; ``batch``: the input that ``scatter`` split into the
    pieces, as ``Tensor.chunk`` does. A piece of b rows out of B weighs each row's loss by 1/b instead of
    1/B, so its gradient is B/b times larger."""
    name = "ch03.mean_per_piece"
    if _unset(factor):
        return Verdict(False, "Set `factor` to a number, then run this cell again.")
    try:
        if isinstance(factor, (str, bytes)):  # "2" is text, not the number the question asks for
            raise TypeError
        value = float(factor)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return Verdict(False, f"`factor` is {factor!r}: give it as a number, such as 3 or 0.25.")
    rows = [len(piece) for piece in batch.chunk(len(per_replica))]
    total = len(batch)
    per_piece = sum(g.to(grad.device) * (total / b) for g, b in zip(per_replica, rows))
    # the factor that best maps grad onto per_piece: exactly N for equal pieces; when the pieces differ
    # by a few rows (Tensor.chunk cuts 256 rows on 3 slots into 86, 86, 84) it lies between the pieces'
    # own factors total / b, and any value in that range is right
    fitted = float((per_piece * grad).sum() / (grad * grad).sum())
    low, high = min(fitted, total / max(rows)), max(fitted, total / min(rows))
    if low * 0.99 <= value <= high * 1.01:
        grows = (  # one factor, N, only where scatter cut the batch into equal pieces
            f"A piece's mean divides by its {rows[0]} rows, not the batch's {total}: every gradient grows "
            f"{total / rows[0]:g} times, like training with lr × {len(rows)}."
            if len(set(rows)) == 1
            else f"A piece's mean divides by its own rows ({rows}), not the batch's {total}: each piece's "
            f"gradient grows by {total} over its rows, near {len(rows)} but not one factor, as the pieces differ."
        )
        return _correct(
            name, grows + " DDP's ranks each take such a mean; chapter 09 shows who divides by N."
        )
    return _not_yet(
        name,
        f"{factor} times the original's gradient is not what the per-piece means would give. Change `factor`.",
        [
            "The batch's mean divides every row's loss by all the batch's rows. What does a piece's mean divide by?",
            f"A piece holds 1/{len(rows)} of the batch's rows, so its mean weighs each row more, not less.",
        ],
        f"{len(rows)}: the batch's {total} rows over pieces of {rows} rows; each piece's gradient grows by "
        f"{total} / its rows.",
    )


def rewire_to_broadcast(
    removed_nodes: int | object, added_node: str | object, edges_into_added: int | object, comparison
) -> Verdict:
    """Exercise 4: what the diff from ``"rewire"`` to ``"broadcast"`` removes and adds."""
    name = "ch03.rewire_to_broadcast"
    if _unset(removed_nodes, added_node, edges_into_added):
        return Verdict(False, "Set all three answers, then run this cell again.")
    rewired, broadcast = comparison["rewire"], comparison["broadcast"]
    gone = set(rewired.nodes) - set(broadcast.nodes)
    new = set(broadcast.nodes) - set(rewired.nodes)
    ops = {broadcast.nodes[n].op for n in new}
    into = sum(e.dst in new for e in comparison.diff("rewire", "broadcast").added)
    wrong = []
    if removed_nodes != len(gone):
        wrong.append("`removed_nodes`: count the rewire frame's summing nodes, which broadcast has not")

    def bare(op: object) -> object:  # the pictures draw BroadcastBackward as "Broadcast"; either is right
        return re.sub(r"Backward\d*$", "", op) if isinstance(op, str) else op

    if {bare(added_node)} != {bare(op) for op in ops}:
        wrong.append("`added_node`: name the broadcast frame's one summing node, as drawn")
    if edges_into_added != into:
        wrong.append("`edges_into_added`: count the arrows into the broadcast frame's summing node")
    if not wrong:
        return _correct(
            name,
            f"One {added_node} replaces {removed_nodes} ReduceAddBackward nodes; all {into} copies lead into it.",
        )
    return _not_yet(
        name,
        "change " + "; ".join(wrong) + ".",
        [
            "Rewire has one node per parameter; broadcast has one node for all parameters of all replicas.",
            "Every replica copy of every parameter has one edge into that one node: slots × parameters.",
        ],
        lambda: f"removed_nodes = {len(gone)}, added_node = {sorted(ops)[0]!r}, edges_into_added = {into}.",
    )


# ---------------------------------------------------------------- chapter 04 · the Python way


def _scale_prediction(predicted_grad: object) -> Verdict | None:
    """Exercise 3's prediction: with ``members`` left alone, the original's ``scale.grad`` stays ``None``.
    A Verdict for a wrong prediction, ``None`` for the right one."""
    if predicted_grad is None:
        return None
    fail = _ladder(
        "ch04.replicatable_scale.predicted",
        [
            "If load_replica_params leaves self.members alone, which tensor does each replica's forward read?",
            "It reads the clone's own leaf, as in the failed attempt: does any edge lead from it to the original?",
        ],
        "predicted_grad = None: the replicas' forward reads the clones' own leaves, which have no edge to the "
        "original, so no gradient reaches it and its .grad is never made (the failed attempt again).",
        restart=True,
    )
    if isinstance(predicted_grad, str) and predicted_grad.strip() == "None":
        return Verdict(False, "Give `predicted_grad` as the object None, without quotes.", "not an answer")
    zero = isinstance(predicted_grad, (int, float)) and predicted_grad == 0
    if isinstance(predicted_grad, torch.Tensor):
        zero = not bool(predicted_grad.detach().abs().sum())
    if zero:
        why = "zeros would mean that a gradient arrived and summed to 0; ask whether one arrives at all"
    else:
        why = (
            f"{predicted_grad!r} would mean that the gradient reached the original; ask whether anything the "
            "replicas' forward read leads back to it"
        )
    return fail(f"{why}. Change `predicted_grad`.", "predicted")


def replicatable_scale(cls: type | object, predicted_grad: object = ..., devices=("cpu", "cpu")) -> Verdict:
    """Exercise 3: ``predicted_grad``, the original's ``scale.grad`` if ``load_replica_params`` left
    ``members`` alone (``None``); ``cls()`` is a C++-style ``Scale`` (forward ``x * self.members.scale``) that
    implements ``demos.Replicatable``; under ``demos.option_two`` its gradient must match one device's.

    The prediction is graded first. Then, in this order: a parameter ``scale``; forward is ``x * scale``;
    forward reads the member handle, not the registry (a new tensor put in ``_parameters`` must not change
    the output); and Option Two delivers one device's gradient. Each finding has its ``Verdict.problem``."""
    import copy

    from torch import nn

    from ..data_parallel import DataParallel
    from . import demos

    name = "ch04.replicatable_scale"
    if _unset(cls) and _unset(predicted_grad):
        return Verdict(
            False,
            "Define class Scale (exercise 3), after setting `predicted_grad` to your prediction; then run this "
            "cell again.",
        )
    if _unset(predicted_grad):
        return Verdict(
            False,
            "Set `predicted_grad` first: the original's scale.grad if load_replica_params left members alone.",
        )
    if wrong := _scale_prediction(predicted_grad):
        return wrong
    _failures.pop(name + ".predicted", None)
    if _unset(cls):
        return Verdict(
            False,
            "Your prediction is right: with members left alone the replicas read the clones' own leaves, and "
            "the original's scale.grad stays None. Now define class Scale (exercise 3) and run this cell again.",
        )
    hints = [
        "Option Two: DataParallel hands each replica its tensors, and the module itself puts them where "
        "its forward reads them, in load_replica_params.",
        "Start from demos.ReplicatableLinear: which of its lines re-point the members?",
    ]

    fail = _ladder(
        name,
        hints,
        "class Scale(nn.Module, demos.Replicatable), and in load_replica_params(self, tensors): "
        "self._parameters['scale'] = tensors['scale'] and self.members = SimpleNamespace(scale="
        "tensors['scale']). The Answer block above has the whole class.",
        restart=True,
    )

    again = "run the cell that defines Scale and this check again"
    if isinstance(cls, nn.Module):  # Scale() where Scale belongs: an instance, not the class
        return Verdict(
            False, "Pass the class itself, `Scale`, not an instance `Scale()`: the check builds its own."
        )
    torch.manual_seed(0)
    try:
        module = cls()  # type: ignore[operator]
    except Exception as err:  # a learner's class: say what __init__ needs, whatever went wrong
        if missing := _missing_name(err, again):
            return missing
        return fail(
            f"Scale() raised {type(err).__name__}: {err}. __init__ takes no argument but self: call "
            "super().__init__(), register a parameter 'scale' of shape (3,), and keep it as self.members.scale.",
            "init",
        )
    scale = module._parameters.get("scale") if isinstance(module, nn.Module) else None
    if scale is None:
        return fail(
            "Scale() has no parameter named 'scale': make Scale an nn.Module and, in __init__, "
            "self.register_parameter('scale', scale) with scale = nn.Parameter(torch.ones(3) * 2); keep the "
            "same tensor as self.members.scale.",
            "no parameter",
        )
    x = torch.randn(8, *scale.shape)
    try:
        out = module(x)
    except Exception as err:
        if missing := _missing_name(err, again):
            return missing
        return fail(
            f"forward raised {type(err).__name__}: {err}. Make forward return x * self.members.scale.",
            "forward raised",
        )
    if not (isinstance(out, torch.Tensor) and out.shape == x.shape and torch.allclose(out, x * scale)):
        return fail(
            "forward(x) is not x * scale: make forward return x * self.members.scale, and nothing else.",
            "forward",
        )
    other = nn.Parameter(scale.detach() + 1)
    module._parameters["scale"] = other  # what the failed attempt does: a new tensor in the registry
    try:
        follows_registry = torch.allclose(module(x), x * other)
    finally:
        module._parameters["scale"] = scale
    if follows_registry:
        return fail(
            "forward reads the registry (self.scale), so a new tensor in _parameters changes its output: "
            "that module is Python-style, and replicate.py already handles it. Make forward read the "
            "member handle, x * self.members.scale, as CppStyleLinear.forward does.",
            "reads registry",
        )
    reference = copy.deepcopy(module)
    reference(x).pow(2).mean().backward()
    try:
        DataParallel(module, list(devices), strategy=demos.option_two)(x).pow(2).mean().backward()
    except TypeError as err:
        return fail(
            f"Option Two refused the module ({err}). Make Scale inherit from demos.Replicatable as well as "
            "nn.Module, and define load_replica_params(self, tensors).",
            "not replicatable",
        )
    except NotImplementedError:
        return fail(
            "load_replica_params still raises NotImplementedError: define it in Scale, putting "
            "tensors['scale'] into self._parameters['scale'] and into self.members.scale.",
            "no loader",
        )
    except Exception as err:  # the learner's load_replica_params or forward: report it, never raise
        return _missing_name(err, again) or fail(
            f"under Option Two, Scale raised {type(err).__name__}: {err}. In load_replica_params, put "
            "tensors['scale'] into self._parameters['scale'] and into self.members.scale, and nothing else.",
            "loader raised",
        )
    if module.scale.grad is None:
        return fail(
            "the original's scale.grad is None, as you predicted for members left alone: the replicas' forward "
            "still read the clone's own leaf, because load_replica_params left self.members on it. Re-point what "
            "forward reads, too.",
            "members left",
        )
    if not torch.allclose(module.scale.grad, reference.scale.grad, rtol=1e-4, atol=1e-6):
        diff = (module.scale.grad - reference.scale.grad).abs().max()
        return fail(
            f"scale.grad differs from one device's by up to {diff:.2e}: in load_replica_params, point both "
            "self._parameters['scale'] and self.members.scale at tensors['scale'], and nothing else.",
            "grad differs",
        )
    replica = demos.option_two(module, list(devices))[1]
    if replica._parameters.get("scale") is not replica.members.scale:
        return fail(
            "the gradient is right, but the replica's registry still holds the clone's own leaf: in "
            "load_replica_params, put tensors['scale'] into self._parameters['scale'] too, so that registry "
            "and member stay one tensor, as in the original (parameters() and state_dict() read the registry).",
            "registry",
        )
    return _correct(
        name,
        "predicted_grad = None, and Scale under Option Two gets one device's gradient: the module itself "
        "re-pointed its member, so the replicas' forward reads the broadcast copies.",
    )


def broadcast_layout(
    index: int | object, shared: object, devices=("cpu", "cpu", "cpu"), slot: int = 2, tensor: int = 1
) -> Verdict:
    """Exercise 1: for ``outputs = Broadcast.apply(devices, *model.parameters())`` on the course's model,
    ``index``: where ``param_copies[slot][tensor]`` (slot 2's copy of ``0.bias``, on three slots) sits in
    ``outputs``; ``shared``: the indices whose tensors share storage with the model. Both are read from a
    live ``dpteach.functions.Broadcast``.

    Findings (``Verdict.problem``): ``"tensor-major"``, ``"slot 0"``, ``"from 1"`` (the index counted
    from 1), ``"slots from 1"`` (the slot counted from 1), ``"other tensor"`` (the right slot, another
    tensor), ``"index"`` (another index), ``"no sharing"``, ``"all share"``, ``"shared"`` (another set).
    """
    from ..functions import Broadcast
    from . import story

    name = "ch04.broadcast_layout"
    if _unset(index, shared):
        return Verdict(False, "Set `index` and `shared`, then run this cell again.")
    if not _count(index):
        return Verdict(False, f"Give `index` as a whole number, not {index!r}.")
    if not isinstance(shared, (set, frozenset, list, tuple)) or not all(_count(i) for i in shared):
        return Verdict(False, f"Give `shared` as a set of whole numbers, e.g. {{0}}, not {shared!r}.")
    model = story.make_model().to(devices[0])
    names = [key for key, _ in model.named_parameters()]
    params, slots, n = list(model.parameters()), len(devices), len(names)
    outputs = Broadcast.apply(list(devices), *params)
    target = params[tensor].detach().cpu()
    # every copy of the target tensor, in slot order (shapes differ between the model's tensors)
    copies = [i for i, out in enumerate(outputs) if torch.equal(out.detach().cpu(), target)]
    truth = copies[slot]
    sharing = {i for i, out in enumerate(outputs) if any(out.data_ptr() == p.data_ptr() for p in params)}
    what = f"param_copies[{slot}][{tensor}], slot {slot}'s copy of {names[tensor]}"
    answer = (
        f"index = {truth}, shared = {sharing}. param_copies[{slot}] is the slice that starts at output "
        f"{slot} * {n} = {slot * n}, and {names[tensor]} is tensor {tensor} in it; only slot 0's copies are "
        "views of the model's own tensors."
    )
    fail = _ladder(
        name,
        [
            "Broadcast's outputs are device-major: every tensor's copy for slot 0, then every tensor's for "
            "slot 1, and so on; replicate.py cuts them into slices of len(tensors).",
            f"The model has {n} tensors, so param_copies[j] starts at output j * {n}.",
        ],
        answer,
        restart=True,
    )
    guess, said = int(index), {int(i) for i in shared}  # type: ignore[call-overload]
    earlier = " and ".join(f"slot {j}" for j in range(slot))  # the slots before the target's
    if guess != truth:
        # a list, not a dict keyed by index: two readings can land on one index (on three slots, slot 2's
        # 0.bias read tensor-major, 1 * 3 + 2, and slot 1's, 1 * 4 + 1, are both 5), and such an answer
        # deserves both explanations
        slips = [
            (
                tensor * slots + slot,
                "tensor-major",
                "that counts each tensor's copies together; Broadcast is device-major, all of slot 0's copies first",
            ),
            (
                tensor,
                "slot 0",
                f"that is slot 0's copy of {names[tensor]}; slot {slot}'s copies come after all of {earlier}'s",
            ),
            (
                (slot - 1) * n + tensor,
                "slots from 1",
                f"that is slot {slot - 1}'s copy: slots count from 0 too",
            ),
            (truth + 1, "from 1", "Python counts from 0: outputs[0] is slot 0's copy of " + names[0]),
        ]
        found = [(problem, why) for at, problem, why in slips if at == guess]
        if not found and slot * n <= guess < (slot + 1) * n:
            found = [
                (
                    "other tensor",
                    f"outputs[{guess}] is slot {slot}'s copy of {names[guess - slot * n]}: in each slice the "
                    "tensors come in model.parameters() order",
                )
            ]
        if not found:
            found = [("index", f"outputs[{guess}] is not {what}")]
        why = found[0][1] + "".join(f" (if you read it another way: {w})" for _, w in found[1:])
        return fail(f"{why}. Change `index`.", found[0][0])
    if said != sharing:
        if not said:
            problem, why = (
                "no sharing",
                "slot 0's copies sit on the model's device and are views of its tensors",
            )
        elif said >= set(range(len(outputs))):
            problem, why = (
                "all share",
                "every later slot gets new tensors of its own, even on the same device",
            )
        else:
            problem, why = "shared", "every copy of slot 0 shares the model's storage, and no later slot's"
        storage = _ladder(
            name + ".shared",
            [
                "A Function that returns one of its inputs unmodified hands back a view of it: which slot's "
                "copies are Broadcast's inputs themselves?",
                "Slot 0 is the model's own device, so its copies are views of the model's tensors (outputs[i]._base "
                "is the tensor); every later slot gets new tensors, even on the same device.",
            ],
            answer,
            restart=True,
        )
        return storage(f"the index is right, but {why}. Change `shared`.", problem)
    _failures.pop(name + ".shared", None)
    return _correct(name, f"index = {truth}, shared = {sharing}.")


# ---------------------------------------------------------------- chapter 05 · buffers and BatchNorm


def counter_survives(
    cls: type | object, predicted: int | object = ..., devices=("cpu", "cpu"), forwards: int = 3
) -> Verdict:
    """Exercise 1: ``cls()`` is a ``demos.CallCounter`` whose ``calls_rebound`` is updated in place
    (``+= 1``, or ``add_(1)``); after ``forwards`` DataParallel forwards under ``"broadcast"`` it must
    count ``forwards``, and ``predicted``, the learner's count written down first, must say so."""
    from ..data_parallel import DataParallel

    name = "ch05.counter_survives"
    if _unset(cls):
        return Verdict(
            False, "Define class MyCounter first (exercise 1), fill in `predicted`, then run this cell again."
        )
    if _unset(predicted):
        return Verdict(
            False,
            f'Fill in `predicted`: what you expect calls_rebound to count after {forwards} "broadcast" '
            "forwards with `+= 1`, then run this cell again.",
        )
    if malformed := _malformed(
        (not _count(predicted), f"`predicted` is a whole number, a count, not {predicted!r}")
    ):
        return malformed
    try:
        counter = cls()  # type: ignore[operator]
        net = DataParallel(counter, list(devices), strategy="broadcast")
        x = torch.randn(2 * len(devices), counter.linear.in_features)
        for _ in range(forwards):
            net(x)
    except Exception as err:  # the learner's class: report it, never raise
        return _missing_name(err, "run the cell that defines MyCounter and this check again") or Verdict(
            False,
            f"Not yet: MyCounter raised {type(err).__name__}: {err}. Subclass demos.CallCounter and change only "
            "the calls_rebound line of forward.",
        )
    counted = int(counter.calls_rebound.item())
    guess = int(predicted)  # type: ignore[arg-type]
    hints = [
        "Of the three counters, which one already survives DataParallel, and what does its line do "
        "differently?",
        "Under 'broadcast', slot 0's replica shares the model's buffers: only a write into that storage "
        "reaches the model, never a new tensor bound to the name.",
    ]
    if counted != forwards:
        change = (
            "calls_rebound is still 0 in the model: the replicas' increments were bound to new tensors. Update "
            "it in place instead of rebinding it, with `+= 1` as the exercise says."
            if counted == 0
            else f"calls_rebound counts {counted} after {forwards} forwards: increment it by 1 once per forward, "
            "in place, and leave the other counters as they were."
        )
        return _not_yet(
            name,
            change,
            hints,
            lambda: (
                "self.calls_rebound += 1, which is self.calls_rebound.add_(1), in place of "
                "self.calls_rebound = self.calls_rebound + 1."
            ),
            "class",
        )
    if guess != counted:
        every_call = forwards * len(devices)
        why = {
            0: "so `+= 1` did not bind a new tensor the way `= self.calls_rebound + 1` does",
            every_call: f"not one per replica call ({len(devices)} slots): only one slot's update reached the model",
        }.get(guess, f"that is neither 0 nor one per replica call ({every_call})")
        return _not_yet(
            name,
            f"your class counts {counted}, and you predicted {guess}: {why}. Set `predicted` to the count, and "
            "answer the exercise's question: why that count?",
            [
                "What does Python call for `a += b` when `a` has an `__iadd__`, and what does a tensor's return?",
                "Tensor.__iadd__ adds in place and returns the same tensor; which replica's tensor is the "
                "model's own?",
            ],
            f"predicted = {forwards}: `+=` on a tensor adds in place, and slot 0's replica shares the model's "
            "buffer, so the model counts once per step; slot 1's increments go to its own copy.",
            "prediction",
        )
    return _correct(
        name,
        f"you predicted {guess}, and calls_rebound counts {counted} after {forwards} forwards: its update now "
        "writes into the tensor in place (a tensor's += is add_, and the name is bound again to that same "
        "tensor), so slot 0's update lands in the model's own buffer; slot 1's goes to its own copy.",
        "right",
    )


def _reading(value: object) -> float | None:
    """A number read off a run: an int or float, or a tensor or list of them (their mean); else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        t = torch.as_tensor(value, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        return None
    return t.mean().item() if t.numel() else None


# Exercise 2's sorted batch: 16 rows, the first 8 of mean 6, the last 8 of mean 0, each of std 1, so
# slot 0's batch mean on n slots, a mean of 16 / n rows, has std 1 / sqrt(16 / n).
SORTED_ROWS, SORTED_HALVES = 16, (6.0, 0.0)
# A std measured over 200 batches scatters by about 5% (1 / sqrt(2 * 199)); on 20 generator seeds each
# feature's value fell within -17% and +10% of 1 / sqrt(16 / n), their mean within 5%. 25% either way
# is five of those 5%, so a right measurement passes on any run.
SPREAD_TOLERANCE = 0.25


def slot0_noise(follows: float | object, spread: Mapping[int, object] | object) -> Verdict:
    """Exercise 2: on four slots, the mean the right panel's ``"broadcast"`` line heads for (``follows``),
    and the standard deviation of slot 0's batch mean of ``sorted_batch()``, measured on two slots and
    on four (``spread = {2: ..., 4: ...}``; a float, or the tensor of the four features' values)."""
    name = "ch05.slot0_noise"
    if _unset(follows, spread) or (isinstance(spread, Mapping) and _unset(*spread.values())):
        return Verdict(False, "Fill in `follows` and both values of `spread`, then run this cell again.")
    heads, read = _reading(follows), {}
    if isinstance(spread, Mapping) and set(spread) == {2, 4}:
        read = {n: _reading(v) for n, v in spread.items()}
    if malformed := _malformed(
        (
            heads is None or not read or None in read.values(),
            "`follows` is a number (the mean the line heads for) and `spread` a dict {2: ..., 4: ...} of "
            f"two numbers, not {follows!r} and {spread!r}",
        )
    ):
        return malformed
    want = {n: (SORTED_ROWS / n) ** -0.5 for n in (2, 4)}
    fail = _ladder(
        name,
        [
            "scatter cuts each batch in order, so slot 0 gets its first rows; and a mean of k rows "
            "scatters 1/√k as much as one row does.",
            "With 4 slots slot 0 gets rows 0 to 3 of sorted_batch(). Measure the spread for n = 2 and 4 with "
            "torch.stack([sorted_batch().chunk(n)[0].mean(0) for _ in range(200)]).std(0).",
        ],
        f"follows = 6, spread = {{2: {want[2]:.2f}, 4: {want[4]:.2f}}} (within {SPREAD_TOLERANCE:.0%}): "
        "1/√8 and 1/√4, √2 more noise with half the rows.",
    )
    first, second = SORTED_HALVES
    if abs(heads - first) > 0.5:
        if abs(heads - (first + second) / 2) <= 0.5:
            change, problem = "that is the whole data's mean, where one device heads.", "whole data"
        elif abs(heads - second) <= 0.5:
            change, problem = "that is the second half's mean, and slot 0 gets the first rows.", "second half"
        else:
            change, problem = f"no rows of sorted_batch() have mean {heads:g}.", "wrong mean"
        return fail(
            f"follows = {heads:g}: {change} Read where the cell's line on four slots heads.",
            problem,
        )

    def near(value: float, target: float, tolerance: float = SPREAD_TOLERANCE) -> bool:
        return abs(value - target) <= tolerance * target

    s2, s4 = read[2], read[4]
    if near(s2, want[4]) and near(s4, want[2]) and s2 > s4:
        return fail(
            f"spread[2] = {s2:.3f} is larger than spread[4] = {s4:.3f}: you swapped them; fewer rows per "
            "slot give the wider spread.",
            "swapped",
        )
    if all(near(read[n], want[n]) for n in (2, 4)):
        return _correct(
            name,
            f"slot 0's 4 rows all come from the first half, so the line still heads for 6; its batch mean "
            f"scatters {s4 / s2:.2f} times as much on 4 slots as on 2 (√2 = 1.41): half the rows.",
            "right",
        )
    slips = (  # what a slip in the measurement gives instead, on 2 and on 4 slots
        ("variance", {n: w**2 for n, w in want.items()}, "those are variances (.var()): take .std(0)."),
        (
            "alike rows",
            {n: 2 * w for n, w in want.items()},
            "that is alike_batch()'s (rows of std 2): use sorted_batch().",
        ),
        (
            "whole batch",
            dict.fromkeys(want, SORTED_ROWS**-0.5),
            "that is the whole batch's mean: take .chunk(n)[0] first.",
        ),
        (
            "rows",
            dict.fromkeys(want, 1.0),
            "that is single rows' spread: average slot 0's rows, .mean(0), first.",
        ),
    )
    for kind, target, change in slips:
        if all(near(read[n], target[n], 0.15) for n in (2, 4)):
            return fail(f"spread = {{2: {s2:.3f}, 4: {s4:.3f}}}: {change}", kind)
    off = next(n for n in (2, 4) if not near(read[n], want[n]))
    lo, hi = ((1 - SPREAD_TOLERANCE) * want[off], (1 + SPREAD_TOLERANCE) * want[off])
    return fail(
        f"spread[{off}] = {read[off]:.3f}, outside {lo:.2f} to {hi:.2f}, where 200 batches' measurement "
        f"lands: take the std over 200 batches (or more) of sorted_batch().chunk({off})[0].mean(0).",
        "off",
    )


def plain_average(
    tracked: int | object, converges_to: float | object, model: torch.nn.Module, devices: Sequence
) -> Verdict:
    """Exercise 3: after ``model[0].momentum = None`` and 200 ``"broadcast"`` forwards of ``alike_batch()``,
    what the model's ``num_batches_tracked`` counts (``tracked``: one per step, as only slot 0's ``add_(1)``
    writes into the model's tensor, not one per replica call) and where ``running_mean`` heads
    (``converges_to``: the plain average of slot 0's batch means, which momentum None keeps).

    Findings: ``"every slot"`` (one count per replica call), ``"no slot"`` (0), ``"count"`` (another number),
    ``"variance"``, ``"zero"``, ``"wrong mean"`` (``converges_to``), ``"momentum"`` / ``"not run"`` (the run is
    not the exercise's: no hint spent), ``"not the model"``, ``"not an answer"``."""
    name = "ch05.plain_average"
    if _unset(tracked, converges_to):
        return Verdict(False, "Fill in `tracked` and `converges_to`, then run this cell again.")
    if isinstance(tracked, torch.Tensor) and tracked.numel() == 1:  # read off, model[0].num_batches_tracked
        tracked = tracked.item()
    heads = _reading(converges_to)
    if malformed := _malformed(
        (
            not _count(tracked) or heads is None,
            "`tracked` is a whole number, a count, and `converges_to` a number, not "
            f"{tracked!r} and {converges_to!r}",
        )
    ):
        return malformed
    bn = model[0] if isinstance(model, torch.nn.Sequential) and len(model) else None
    if not isinstance(bn, torch.nn.modules.batchnorm._BatchNorm):
        return Verdict(False, "Pass the model you ran, model = make_model(), as `model`.", "not the model")
    counted = int(bn.num_batches_tracked.item())
    calls = counted * len(devices)  # what one count per replica call would give
    fail = _ladder(
        name,
        [
            "num_batches_tracked is updated in place on every replica's forward, but only an update into "
            "storage the model shares reaches it. With momentum None each update weighs a batch by "
            "1 / num_batches_tracked: a plain average of the batches counted.",
            "Print model[0].num_batches_tracked and model[0].running_mean; then compare each replica's "
            "num_batches_tracked.data_ptr() with the model's, for the replicas dpteach.replicate(model, devices) "
            "makes.",
        ],
        f"tracked = {counted}, converges_to = 3: only slot 0's replica shares the model's num_batches_tracked, "
        f"so it counts one per step, not {calls} replica calls, and running_mean is the plain average of slot "
        "0's batch means (alike_batch() has mean 3).",
    )
    if bn.momentum is not None:  # the run, not the answer, is off: it costs no hint
        return Verdict(
            False,
            f"Not yet: model[0].momentum is {bn.momentum}: on a fresh model = make_model(), set "
            "model[0].momentum = None, then run the 200 forwards and this cell again.",
            "momentum",
        )
    if counted == 0:
        return Verdict(
            False,
            "Not yet: model[0].num_batches_tracked is 0: run 200 forwards of alike_batch() through "
            'net = dpteach.DataParallel(model, devices) (strategy "broadcast", the default), then this cell again.',
            "not run",
        )
    guess = int(tracked)  # type: ignore[arg-type]
    if guess != counted:
        if guess == calls:
            change, problem = (
                f"that is one count per replica call ({len(devices)} slots), but only slot 0's replica shares "
                "the model's tensor: the other slots add 1 to their own copies.",
                "every slot",
            )
        elif guess == 0:
            change, problem = (
                'only "rewire" and "clone" leave it at 0; under "broadcast" slot 0\'s replica shares the '
                "model's buffers, so its add_(1) lands.",
                "no slot",
            )
        else:
            change, problem = (
                "count the slots whose add_(1) writes into the model's own tensor, times the forwards.",
                "count",
            )
        return fail(f"tracked = {guess}: {change}", problem)
    mean, var = bn.running_mean.mean().item(), bn.running_var.mean().item()
    if abs(heads - mean) > 0.3:
        if abs(heads - var) <= 0.5:
            change, problem = "that is running_var's value: read running_mean.", "variance"
        elif abs(heads) <= 0.1:
            change, problem = 'only "rewire" and "clone" leave it at 0; under "broadcast" it moves.', "zero"
        else:
            change, problem = "the model's running_mean says otherwise.", "wrong mean"
        return fail(
            f"converges_to = {heads:g}, the model's running_mean is about {mean:.2f}: {change}", problem
        )
    return _correct(
        name,
        f"num_batches_tracked is {counted}, one per step: only slot 0's `add_(1)` is in place into the model's "
        f"own tensor, not {calls} replica calls' worth. So running_mean is the plain average of the {counted} "
        f"batch means slot 0 saw, about {mean:.2f}: the weights 1 / num_batches_tracked count steps.",
        "right",
    )


def _power_iterations(strategy: str, devices: Sequence, forwards: int) -> int:
    """How many one-device power iterations the model's ``weight_u`` has had after ``forwards`` training-mode
    ``DataParallel`` forwards under ``strategy``: matched against a copy run on one device, forward by forward."""
    import copy

    from ..data_parallel import DataParallel

    layer = torch.nn.utils.spectral_norm(torch.nn.Linear(4, 3)).to(devices[0])
    reference = copy.deepcopy(layer)  # the same weight_u, stepped on one device, one iteration per forward
    x = torch.randn(8, 4).to(devices[0])
    for _ in range(forwards):
        DataParallel(layer, list(devices), strategy=strategy)(x)
    for done in range(forwards * len(devices) + 1):
        if torch.allclose(layer.weight_u, reference.weight_u):
            return done
        reference(x)
    return -1


def spectral_norm_iterations(
    iterations: Mapping[str, object] | object, devices=("cpu", "cpu"), forwards: int = 3
) -> Verdict:
    """Exercise 4: how many power iterations the model's ``weight_u`` has had after ``forwards``
    training-mode ``DataParallel`` forwards of a ``spectral_norm``-wrapped ``nn.Linear`` on ``devices``;
    ``iterations = {"broadcast": ..., "clone": ...}``. The check runs both and counts."""
    name = "ch05.spectral_norm_iterations"
    strategies = ("broadcast", "clone")
    if _unset(iterations) or (isinstance(iterations, Mapping) and _unset(*iterations.values())):
        return Verdict(False, "Fill in both counts of `iterations`, then run this cell again.")
    if malformed := _malformed(
        (
            not (isinstance(iterations, Mapping) and all(_count(iterations.get(s)) for s in strategies)),
            f'`iterations` is {{"broadcast": a count, "clone": a count}}, not {iterations!r}',
        )
    ):
        return malformed
    with torch.random.fork_rng(devices=[]):  # the learner's random state stays as it was
        torch.manual_seed(0)
        truth = {s: _power_iterations(s, devices, forwards) for s in strategies}
    said = {s: int(iterations[s]) for s in strategies}  # type: ignore[index]
    slots = len(devices)
    if said == truth:
        return _correct(
            name,
            f'{truth["broadcast"]} under "broadcast": spectral_norm\'s power iteration writes weight_u in '
            "place (F.normalize(..., out=u)), and slot 0's replica shares the model's buffer, so the model "
            f'gets one iteration per step; the other slots iterate their own copies. 0 under "clone": every '
            "slot, slot 0 included, iterates a copy.",
            "right",
        )
    first = next(s for s in strategies if said[s] != truth[s])
    count = said[first]
    if first == "clone":  # any count but 0: a write that reached the model
        change, problem = (
            f'{count}: under "clone" slot 0\'s replica gets a copy of weight_u too; which of its writes reach '
            "the model?",
            "clone shares",
        )
    elif count == forwards * slots:
        change, problem = (
            f"{count} is one iteration per replica call: the slots after slot 0 iterate their own copies, "
            "which are dropped after the step.",
            "every slot",
        )
    elif count == 0:
        change, problem = (
            '0: then no slot would write into the model\'s weight_u, as under "clone".',
            "no slot",
        )
    else:
        change, problem = (
            f"{count}: count how many of the {forwards} steps write into the model's weight_u, and how many "
            "times each does.",
            "off",
        )
    return _ladder(
        name,
        [
            "A buffer update survives DataParallel only when it is written in place into storage the "
            "model shares: which slots share weight_u, under each strategy, and how often do they write it?",
            "Compare each replica's weight_u.data_ptr() with the model's, for the replicas "
            "dpteach.replicate(layer, devices, strategy=...) makes.",
        ],
        f'iterations = {{"broadcast": {truth["broadcast"]}, "clone": {truth["clone"]}}}: one per step from '
        "slot 0 under broadcast, none under clone.",
    )(f'iterations["{first}"] = {change}', problem)


# ---------------------------------------------------------------- chapter 06 · the cost of copies


@dataclass(frozen=True, repr=False)
class CountVerdict(Verdict):
    """A ``Verdict`` on a count that also says what it found and what it gave away, for tests.

    ``slips``: the slips a wrong count was matched to, ``"bytes"`` (bytes given for copies),
    ``"buffers"`` (the buffers left out), ``"slot 0"`` (slot 0 counted the wrong way), ``"gather"``
    (the gathered pieces left out), ``"gather slot 0"`` (slot 0's piece left out), ``"gather once"``
    (the gather taken for one copy, not one per slot), ``"per model"`` (one copy per model copy, not one
    per tensor), ``"batchnorm"`` (the BatchNorm's tensors left out, or the layers counted); empty when the
    count is right or no slip explains it. ``hints``: the hints the message gave, one per slip.
    ``offers_answer``: the message says how to see the worked count (from the third failed try on);
    ``shows_answer``: it gives that count (only when asked, ``show_answer=True``). ``model_copy_bytes``
    names its own slips (see there) and shows the answer from the third failed try on."""

    slips: tuple[str, ...] = ()
    hints: tuple[str, ...] = ()
    offers_answer: bool = False
    shows_answer: bool = False


def _count_slips(
    strategy: str,
    n: int,
    params: int,
    tensors: int,
    gathered: int,
    per_copy: Sequence[tuple[int, tuple[str, ...]]] = (),
) -> dict[int, tuple[str, ...]]:
    """Every count one or two of the usual slips give, with the slips: the fewest slips win a tie, then the
    slips tried first (the gather taken for one copy is tried last). ``per_copy``: more wrong counts of
    copies per model copy, each with its slip (one per model copy, ``("per model",)``, say)."""
    right_copies = n - 1 if strategy == "broadcast" else n  # broadcast: slot 0 shares the model
    wrong_copies = n if strategy == "broadcast" else n - 1
    usual = ((gathered, ()), (0, ("gather",)), (gathered - 1, ("gather slot 0",)))
    # on 3 slots or more: the gather taken for one copy, not one per slot (on 2, that is slot 0's left out)
    once = ((1, ("gather once",)),) if 1 not in (gathered, gathered - 1) else ()
    found: dict[int, tuple[str, ...]] = {}
    for gathers in (usual, once):
        for copies, slot in ((right_copies, ()), (wrong_copies, ("slot 0",))):
            for each, buffers in ((tensors, ()), (params, ("buffers",)), *per_copy):
                for pieces, gather in gathers:
                    slips = slot + buffers + gather
                    count = copies * each + pieces
                    if slips and len(slips) <= 2 and (count not in found or len(slips) < len(found[count])):
                        found[count] = slips
    return found


def _in(name: str, model: torch.nn.Module, modules: Sequence[torch.nn.Module]) -> bool:
    """Whether the parameter or buffer ``name`` of ``model`` belongs to one of ``modules``."""
    owner = name.rpartition(".")[0]
    return any(model.get_submodule(owner) is m for m in modules)


def _sentence(clause: str, i: int) -> str:
    """The ``i``-th clause of a message, as a sentence: the first follows "Not yet: ", the rest begin anew."""
    return clause[0].upper() + clause[1:] if i else clause


TRIES_BEFORE_ANSWER = 3  # failed tries of one count before the check says how to see the worked answer


def step_copies(
    prediction: int | object,
    model: torch.nn.Module,
    x: torch.Tensor,
    devices: Sequence,
    strategy: str = "broadcast",
    show_answer: bool = False,
) -> Verdict:
    """Predict-then-check: how many copies does one DataParallel step of ``model`` on ``x`` over
    ``devices`` make under ``strategy``? Counts them with ``costs.step_traffic`` (on a copy of the
    model, so the model's gradients and BatchNorm statistics stay as they were) and compares.

    With every slot on one device a wrong count is matched against the usual slips, one or two at a
    time (bytes for copies, the buffers or the gather left out, the gather counted as one copy instead
    of one per slot, slot 0 counted wrong, a model copy counted as one copy or without its BatchNorm):
    the message
    names each slip made and gives the hint for that slip, whatever came before. A count no slip
    explains gets the next rung of a two-hint ladder. Unlike the other checks, this one never
    prints the worked count unasked: from the third failed try on it says where to find it, the
    chapter's Answer block or ``show_answer=True``, which prints it (and costs no try).
    """
    import copy
    from collections import Counter

    from ..measure import costs

    name = f"ch06.step_copies.{strategy}.{len(devices)}"
    if _unset(prediction) and not show_answer:
        return Verdict(False, "Write your prediction as a whole number of copies, e.g. 30, then run again.")
    if not _unset(prediction) and not _count(prediction):
        return Verdict(False, f"Give a whole number of copies, e.g. 30, not {prediction!r}.")
    slots = list(devices)
    t = costs.step_traffic(copy.deepcopy(model), x, slots, strategy)
    truth, n, ops = len(t.copies), len(slots), Counter(c.op for c in t.copies)
    params, buffers = sum(1 for _ in model.parameters()), [b for b, _ in model.named_buffers()]
    tensors, gathered = params + len(buffers), ops["gather"]
    model_copies = n - 1 if strategy == "broadcast" else n  # broadcast: slot 0 shares the model
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    named = (*model.named_parameters(), *model.named_buffers())
    in_norms = [k for k, _ in named if _in(k, model, norms)]
    layers = len(list(model.children()))
    # two more ways to miscount one model copy: one copy per model, or the BatchNorm's tensors left out
    per_copy = [(1, ("per model",))] + ([(tensors - len(in_norms), ("batchnorm",))] if in_norms else [])
    one_device = len({str(torch.device(d)) for d in slots}) == 1
    formula = f"{model_copies} model copies × {tensors} tensors + {gathered} gathered pieces"
    if not one_device:
        formula = ", ".join(f"{k} {op}" for op, k in ops.items())  # buckets, .to, scatter: by operation
    if show_answer:
        return CountVerdict(False, f"The answer: {truth} copies: {formula}.", shows_answer=True)
    guess = int(prediction)  # type: ignore[call-overload]
    if guess == truth:
        _failures.pop(name + ".unexplained", None)
        return _correct(name, f"{truth} copies: {formula}.")
    said = {
        "bytes": "that is the number of bytes the step copied; count the copies, one per tensor moved",
        "buffers": f"a model copy copies its {len(buffers)} buffers too, not only its {params} parameters: "
        f"count {tensors} copies per model copy",
        "slot 0": (
            f"under 'broadcast' slot 0's replica shares the model's storage: {n - 1} model copies, not {n}"
            if strategy == "broadcast"
            else f"under {strategy!r} slot 0's replica is a copy too, as Cloneable::clone made it: "
            f"{n} model copies, not {n - 1}"
        ),
        "gather": "add the gather's copies: besides the model, the step copies the output back onto devices[0]",
        "per model": f"you counted one copy per model copy, but a model copy is one copy per tensor, {tensors} "
        "here: count each model copy as that many copies",
        "batchnorm": f"you counted {tensors - len(in_norms)} copies per model copy, which leaves out the "
        f"BatchNorm's {len(in_norms)} tensors (its weight, bias and buffers): count {tensors}, one per tensor"
        + (
            f". If you counted the {layers} layers: a model copy makes one copy per tensor, not per layer"
            if layers == tensors - len(in_norms)
            else ""
        ),
        "gather slot 0": "gather copies one piece of the output per slot, slot 0's piece included",
        "gather once": f"gather makes one copy per slot, not one for the whole output: {gathered} copies, "
        "one per slot's piece",
    }
    hint_for = {  # one per slip: where in the chapter to see what the slip missed
        "bytes": "The copies are len(t.copies), and t.bytes adds up their sizes; the chapter's first "
        "counting cell prints both.",
        "buffers": f"model.named_buffers() lists them: {', '.join(buffers)}. A model copy copies each, "
        "one copy per tensor, as it copies the parameters.",
        "slot 0": (
            "The counting cell's 'broadcast' row gives the formula, (N - 1)·T copies: slot 0's replica uses "
            "the model's own tensors, so it copies nothing."
            if strategy == "broadcast"
            else f"The counting cell's {strategy!r} row gives the formula, N·T copies: Cloneable::clone "
            "copied every tensor, even for a slot on the model's own device."
        ),
        "gather": "Look at the 'gather' rows of the counting cell: how many copies per slot?",
        "per model": f"The counting cell prints T, the tensors of one model copy; its {strategy!r} row gives "
        f"{'(N - 1)·T' if strategy == 'broadcast' else 'N·T'} copies: T copies per model copy.",
        "batchnorm": "model.named_parameters() and model.named_buffers() list every tensor a model copy "
        f"copies; the BatchNorm's are {', '.join(in_norms)}.",
        "gather slot 0": "Slot 0's piece is on devices[0] already, yet gather copies it too: torch.cat "
        "writes every piece into one new tensor.",
        "gather once": "Each replica computes its own rows of the output, so the output comes back in N "
        "pieces, and gather copies each one onto devices[0].",
    }
    slips: tuple[str, ...] = ()
    if one_device:
        slips = (
            ("bytes",)
            if guess == t.bytes
            else _count_slips(strategy, n, params, tensors, gathered, per_copy).get(guess, ())
        )
    _failures[name] += 1
    tries = _failures[name]
    if slips:
        change = ". ".join(_sentence(said[s], i) for i, s in enumerate(slips)) + "."
        hints = tuple(hint_for[s] for s in slips)
    else:
        too = "many" if guess > truth else "few"
        change = (
            f"{guess} is too {too}, and no usual slip gives it. Count in three parts: the tensors of one "
            "model copy, the model copies, then what else the step copies."
        )
        shared = (
            "slot 0 shares the model: N - 1 model copies"
            if strategy == "broadcast"
            else "every slot gets a clone, slot 0 included: N model copies"
        )
        ladder = (
            "One copy of the model is one copy per tensor: its parameters and its buffers.",
            f"Under {strategy!r} {shared}; then gather copies one output piece per slot onto devices[0].",
        )
        _failures[name + ".unexplained"] += 1  # the ladder climbs with the counts no slip explains
        hints = (ladder[min(_failures[name + ".unexplained"], len(ladder)) - 1],)
    label = "Hint for this slip" if slips else f"Hint {min(_failures[name + '.unexplained'], 2)} of 2"
    lines = [f"Not yet: {change}", *(f"{label}: {h}" for h in hints)]
    offers = tries >= TRIES_BEFORE_ANSWER
    if offers:
        lines.append(
            f"{tries} tries so far: the worked answer is in the Answer block under the exercise; or run "
            "the check again with show_answer=True to see it here."
        )
    return CountVerdict(False, "\n".join(lines), slips=slips, hints=hints, offers_answer=offers)


MODEL_COPY_OPS = ("broadcast", "clone", "to")  # the operations that copy the model; gather copies the output


def _byte_slips(
    strategy: str, copies: int, size: int, params: int, counters: int, elements: int, gathered: int
) -> dict[int, tuple[str, ...]]:
    """Every byte count one or two of the usual slips give for ``copies`` model copies of ``size`` bytes
    (``params`` of them parameters, ``counters`` integer buffers), with the slips: the fewest win a tie."""
    per_copy = [(size, ()), (params, ("buffers",)), (elements, ("elements",))]
    if counters:  # BatchNorm's num_batches_tracked: int64, 8 bytes each
        per_copy += [(size - counters, ("counter",)), (size - counters // 2, ("counter as 4 bytes",))]
    wrong = copies + 1 if strategy == "broadcast" else copies - 1  # slot 0 counted the other way
    found: dict[int, tuple[str, ...]] = {}
    for k, slot in ((copies, ()), (wrong, ("slot 0",))):
        for nbytes, part in per_copy:
            for extra, gather in ((0, ()), (gathered, ("gather",))):
                slips, count = slot + part + gather, k * nbytes + extra
                if slips and len(slips) <= 2 and (count not in found or len(slips) < len(found[count])):
                    found[count] = slips
    return found


def _not_a_byte_count(predicted) -> Verdict | None:
    """The verdict for a byte prediction left unset or not a whole number; None when it is one."""
    if _unset(predicted):
        return Verdict(
            False, "Set predicted to your number of bytes, e.g. 1000000, then run this cell again."
        )
    if not _count(predicted):
        return Verdict(False, f"Give a whole number of bytes, e.g. 1000000, not {predicted!r}.")
    return None


def width_ratio(ratio: float | object, wide: torch.nn.Module, model: torch.nn.Module) -> Verdict:
    """Exercise 2's first question: about how many times ``model``'s bytes, ``P + B``, ``wide`` holds (its
    hidden layers twice as wide). Any answer within 0.15 of the true ratio passes (3.52 for the
    chapter's two models, so 3.5 does); 2 and 4 each get what they miss."""
    from ..measure import costs

    name = "ch06.width_ratio"
    if _unset(ratio):
        return Verdict(False, "Set ratio to a number, e.g. 3, then run this cell again.")
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)):
        return Verdict(False, f"Give ratio as a number, e.g. 3, not {ratio!r}.")
    truth = sum(costs.state_nbytes(wide).values()) / sum(costs.state_nbytes(model).values())
    said = f"{truth:.2f} times: the first model's P + B grew to wide's."
    if abs(ratio - truth) <= 0.15:
        return _correct(name, said)
    if ratio < truth:
        change = (
            f"{ratio:g} is too few. Doubling the width doubles a layer with one side fixed (64 inputs, "
            "10 outputs, the BatchNorm), but a layer whose both sides double grows with the square."
        )
    else:
        change = (
            f"{ratio:g} is too many. The square layer quadruples, but the first and last Linears and the "
            "BatchNorm have one side fixed (64 inputs, 10 outputs), so they only double."
        )
    hints = [
        "Find which layer holds most of the bytes, and how it grows when both its sides double.",
        "Divide sum(costs.state_nbytes(wide).values()) by the same for model.",
    ]
    return _not_yet(name, change, hints, said)


def model_copy_bytes(
    predicted: int | object,
    model: torch.nn.Module,
    x: torch.Tensor,
    devices: Sequence,
    strategy: str = "broadcast",
) -> Verdict:
    """Exercise 2: the bytes of the model copies alone in one DataParallel step of ``model`` on ``x`` over
    ``devices`` under ``strategy``, ``(N - 1)·(P + B)`` for ``"broadcast"``; the gathered output is not a
    model copy. Counts them with ``costs.step_traffic`` on a copy of the model (its gradients and
    BatchNorm statistics stay as they were), as the rows ``MODEL_COPY_OPS`` of ``by_op()``.

    A wrong count is matched against the usual slips, one or two at a time (``CountVerdict.slips``):
    ``"gather"`` (the gathered output counted in), ``"counter"`` (num_batches_tracked left out),
    ``"counter as 4 bytes"``, ``"buffers"`` (all buffers left out), ``"slot 0"`` (slot 0 counted the
    other way: N instead of N - 1 under ``"broadcast"``), ``"elements"`` (elements, not bytes). The
    message says what to change for each slip found; the hints climb the ladder, the answer from the
    third failed try on.
    """
    import copy

    from ..measure import costs

    name = f"ch06.model_copy_bytes.{strategy}.{len(devices)}"
    if (unanswered := _not_a_byte_count(predicted)) is not None:
        return unanswered
    ops = costs.step_traffic(copy.deepcopy(model), x, list(devices), strategy).by_op()
    truth, gathered = sum(ops.get(op, 0) for op in MODEL_COPY_OPS), ops.get("gather", 0)
    size = costs.state_nbytes(model)
    P, B = size["parameters"], size["buffers"]
    counters = [(n, b) for n, b in model.named_buffers() if not b.is_floating_point()]
    counter_bytes = sum(b.nbytes for _, b in counters)
    elements = sum(t.numel() for t in (*model.parameters(), *model.buffers()))
    copies = truth // (P + B)  # model copies: N - 1 under "broadcast"; N, and a .to per other device, else
    formula = f"{copies} model {'copy' if copies == 1 else 'copies'} × (P + B) = {copies}·({P:,} + {B:,})"
    on_top = f"The gathered output, {gathered:,} bytes, comes on top: it is a copy of the result, not of the model."
    guess = int(predicted)  # type: ignore[call-overload]
    if guess == truth:
        return _correct(name, f"{truth:,} bytes: {formula}. {on_top}")
    counter = counters[0][0].rsplit(".", 1)[-1] if counters else "num_batches_tracked"  # BatchNorm's
    said = {
        "gather": f"you counted the gathered output in ({gathered:,} bytes): it copies the result, not the "
        "model, so leave it out",
        "counter": f"{counter} is a buffer too, and every model copy copies it: add its {counter_bytes:,} bytes",
        "counter as 4 bytes": f"{counter} is an int64 counter: count 8 bytes for it, not 4",
        "buffers": "a model copy copies the buffers too (BatchNorm's running_mean, running_var and "
        f"{counter}), not only the parameters: add B",
        "slot 0": (
            "under 'broadcast' slot 0's replica shares the model's storage, so it copies nothing: N - 1 "
            "model copies, not N"
            if strategy == "broadcast"
            else f"under {strategy!r} slot 0's replica is a clone too: count it"
        ),
        "elements": "you counted elements; count bytes: 4 per float32, 8 per int64",
    }
    slips = _byte_slips(strategy, copies, P + B, P, counter_bytes, elements, gathered).get(guess, ())
    if slips:
        change = ". ".join(_sentence(said[s], i) for i, s in enumerate(slips)) + "."
    else:
        change = (
            f"{guess:,} is too {'many' if guess > truth else 'few'}, and no usual slip gives it. Work it out "
            "in three parts: P, then B, then how many slots get a model copy."
        )
    hints = [
        "A model copy copies every tensor a replica needs, parameters and buffers, each at its dtype's size; "
        "gather's copy of the output is not one.",
        "P: each Linear's weight and bias and the BatchNorm's weight and bias, 4 bytes an element; B: the "
        f"BatchNorm's buffers (model.named_buffers()), {counter} int64. "
        + (
            "Under 'broadcast' every slot but slot 0 gets a copy."
            if strategy == "broadcast"
            else f"Under {strategy!r} every slot gets a clone."
        ),
    ]
    fail = _ladder(name, hints, f"{truth:,} bytes: {formula}. {on_top}")
    found = fail(change, " + ".join(slips))
    offers = _failures[name] >= TRIES_BEFORE_ANSWER
    return CountVerdict(False, found.message, found.problem, slips=slips, shows_answer=offers)


def slot0_memory(
    shared: Mapping[str, object] | object, lands_in: str | object, model: torch.nn.Module, device
) -> Verdict:
    """Exercise 3: ``shared`` maps each strategy to whether slot 0's replica uses the model's own memory
    (``data_ptr``, where a tensor's data starts); ``lands_in`` says where slot 0's BatchNorm update of
    ``running_mean`` goes under ``"broadcast"``: ``"model"`` or ``"replica"``. Replicates ``model`` onto
    ``[device] * 2`` under each strategy named and compares.

    Findings (``Verdict.problem``): ``"values"`` (a tensor given: ``==`` compared the values, not where
    they are), ``"swapped"``, ``"broadcast"`` / ``"clone"`` (that strategy's answer wrong; any other
    strategy by its name), ``"lands in"`` (the BatchNorm question). The hints climb the ladder, the
    answer from the third failed try on.
    """
    from ..replicate import replicate

    name = "ch06.slot0_memory"
    if _unset(shared, lands_in) or not isinstance(shared, Mapping) or _unset(*shared.values()):
        return Verdict(
            False, "Set shared[strategy] in the loop and lands_in below it, then run this cell again."
        )
    truth = {}
    for strategy in shared:
        replica = replicate(model, [device] * 2, strategy=str(strategy))[0]
        pairs = zip(model.modules(), replica.modules())  # a replica's tensors may be plain attributes
        truth[strategy] = all(
            getattr(mine, n).data_ptr() == t.data_ptr()
            for ours, mine in pairs
            for n, t in (*ours.named_parameters(recurse=False), *ours.named_buffers(recurse=False))
        )
    lands = "model" if truth.get("broadcast", True) else "replica"
    ours_or_not = {True: "the model's own tensors", False: "memory of its own"}
    owns = ", ".join(f"{k!r} {ours_or_not[v]}" for k, v in truth.items())
    why = (
        f"slot 0's replica uses: {owns}. lands_in = {lands!r}: BatchNorm "
        "updates running_mean in place, so under 'broadcast' slot 0's forward writes the model's statistics, "
        "from slot 0's rows only (chapter 05); a clone's updates are thrown away with the replica."
    )
    answer = f"shared = {truth}: {why}"
    fail = _ladder(
        name,
        [
            "Two tensors share memory when their data starts at the same address; equal values say nothing "
            "about it, since a clone holds the same values in memory of its own.",
            "Compare replica[0].weight.data_ptr() with model[0].weight.data_ptr() for each strategy; then "
            "ask where running_mean's in-place update writes when the replica's buffer is the model's.",
        ],
        answer,
    )
    if any(isinstance(v, torch.Tensor) for v in shared.values()):
        return fail(
            "a value of shared is a tensor: == on two tensors compares their values, element by element. "
            "Compare where their data starts: .data_ptr() == .data_ptr() gives True or False.",
            "values",
        )
    if not all(isinstance(v, bool) for v in shared.values()):  # "no" would read as True
        odd = next(v for v in shared.values() if not isinstance(v, bool))
        return Verdict(False, f"Give True or False for each strategy, not {odd!r}, then run this cell again.")
    given = dict(shared)
    wrong = [k for k in given if given[k] != truth[k]]
    if len(wrong) > 1 and all(given[k] == (not truth[k]) for k in given):
        return fail(
            "every answer of shared is the other way round: a fresh copy has memory of its own, so compare "
            "the data_ptr of each strategy's replica again and write what it gives.",
            "swapped",
        )
    if wrong:
        k = wrong[0]
        said = (
            "under 'broadcast' slot 0's replica is the model itself, on its own device: the same data_ptr"
            if truth[k]
            else f"under {k!r} slot 0's replica is a copy, in memory of its own: another data_ptr"
        )
        return fail(f"shared[{k!r}] is {given[k]}, but {said}.", k)
    if lands_in not in ("model", "replica"):
        return Verdict(False, f'Set lands_in to "model" or "replica", not {lands_in!r}.')
    if lands_in != lands:
        return fail(
            "the memory answers are right. Under 'broadcast' slot 0's running_mean is the model's own tensor, "
            "so an in-place update of it changes that tensor: set lands_in to where the tensor lives.",
            "lands in",
        )
    return _correct(name, why[0].upper() + why[1:])


def bytes_onto_slot_1(
    onto_slot_1: int | object,
    model: torch.nn.Module,
    device,
    strategy: str = "broadcast",
    stays_on_slot_0: int | object = ...,
) -> Verdict:
    """Exercise 4: the bytes that ``replicate(model, [device, "meta"], strategy)`` copies onto slot 1, the
    ``"meta"`` device: under ``"broadcast"`` and ``"clone"`` alike ``P + B``, ``(N - 1)·(P + B)`` with
    ``N = 2``; then ``stays_on_slot_0``, the bytes of the copies that stay on ``device`` (asked for
    until it is set):
    under ``"clone"`` both clones, ``2·(P + B)`` (slot 1's clone is made on ``device`` before its ``.to``),
    under ``"broadcast"`` the packs. Records the copies with ``dpteach.comm.traffic()`` and compares.

    Findings (``Verdict.problem``): ``"string"`` (0: ``c.dst == "meta"`` compares a device with a string),
    ``"every copy"`` (all of ``t.bytes``), ``"slot 0"`` (the copies that stay on ``device``),
    ``"copies"`` (a number of copies, not bytes), ``"buffers"`` (the parameters' bytes only); for
    ``stays_on_slot_0``: ``"one clone"`` (slot 0's clone only: a copy straight from the model to slot 1),
    ``"nothing stays"`` (0), ``"counter packed"`` (the counter counted among the packs).
    """
    from .. import comm
    from ..measure import costs
    from ..replicate import replicate

    name = f"ch06.bytes_onto_slot_1.{strategy}"
    if _unset(onto_slot_1):
        return Verdict(False, "Set onto_slot_1 as its comment says, then run this cell again.")
    if not _count(onto_slot_1):
        return Verdict(False, f"Give a whole number of bytes, e.g. 1000, not {onto_slot_1!r}.")
    meta = torch.device("meta")
    with comm.traffic() as t:
        replicate(model, [torch.device(device), meta], strategy=strategy)
    onto = [c for c in t.copies if c.dst == meta]
    truth = sum(c.nbytes for c in onto)
    stays = sum(c.nbytes for c in t.copies if c.dst != meta)
    P, B = costs.state_nbytes(model).values()
    guess = int(onto_slot_1)  # type: ignore[call-overload]
    formula = f"{truth:,} bytes, P + B = {P:,} + {B:,}: (N - 1)·(P + B) with N = 2"
    if guess == truth:
        return _bytes_left_on_slot_0(stays_on_slot_0, stays, formula, t.by_op(), P + B, strategy)
    slips = {
        0: (
            "string",
            'c.dst == "meta" is never true: a device is not a string. Compare with meta, the '
            "torch.device the cell makes",
        ),
        t.bytes: ("every copy", "you added every copy; keep only those whose c.dst is meta, slot 1"),
        stays: ("slot 0", "you added the copies that stay on devices[0]; keep those whose c.dst is meta"),
        len(onto): ("copies", "that is how many copies land on slot 1; add up their bytes, c.nbytes"),
        P: ("buffers", f"that is P alone; the buffers travel to slot 1 too: add B = {B:,}"),
    }
    problem, change = slips.get(guess, ("", ""))
    if not problem:
        change = (
            f"{guess:,} is too {'many' if guess > truth else 'few'}: add c.nbytes over the copies whose "
            "c.dst is meta, and nothing else"
        )
    # name the number that is wrong; stays_on_slot_0 waits until this one is right
    later = "" if _unset(stays_on_slot_0) else " (stays_on_slot_0 is checked once onto_slot_1 is right)"
    change = f"onto_slot_1 is wrong{later}: {change}"
    fail = _ladder(
        name,
        [
            "Each record in t.copies says where its bytes went, c.dst; slot 1 is the meta device.",
            "sum(c.nbytes for c in t.copies if c.dst == meta), with meta = torch.device('meta'); compare it "
            "with P + B, which the counting cell under the first figure prints on its first line.",
        ],
        f"onto_slot_1 = sum(c.nbytes for c in t.copies if c.dst == meta) = {formula}.",
    )
    return fail(change + ".", problem)


def _bytes_left_on_slot_0(
    given: int | object, truth: int, onto: str, by_op: dict[str, int], model_bytes: int, strategy: str
) -> Verdict:
    """Exercise 4's second question: the bytes of the copies that stay on slot 0's device, which tell
    how the strategy reaches slot 1 (clone there, then ``.to``; or pack, then broadcast)."""
    name = f"ch06.bytes_onto_slot_1.{strategy}.stays"
    if _unset(given):
        return Verdict(
            False, f"onto_slot_1 is right ({onto}). Now set stays_on_slot_0, then run this cell again."
        )
    if not _count(given):
        return Verdict(False, f"Give stays_on_slot_0 as a whole number of bytes, not {given!r}.")
    guess = int(given)  # type: ignore[call-overload]
    if guess == truth:
        why = (
            "two clones of P + B each: slot 0's, and slot 1's, made on devices[0] before the 'to' carries it "
            "(clone, then .to)"
            if strategy != "broadcast"
            else "the packs into buckets; the int64 counter, one tensor, travels unpacked"
        )
        return _correct(name, f"onto slot 1 {onto}; {truth:,} bytes stay on devices[0]: {why}.")
    slips: dict[int, tuple[str, str]] = {
        0: ("nothing stays", "some copies have c.dst on devices[0]: add their c.nbytes"),
    }
    if strategy != "broadcast":
        slips[model_bytes] = (
            "one clone",
            "that is slot 0's clone alone, as if slot 1's copy came straight from the model; "
            "look at which copies are 'clone' and where each one's dst is",
        )
    else:
        slips[model_bytes] = (
            "counter packed",
            "that counts every byte as packed; one bucket holds a single tensor and needs no pack",
        )
    problem, change = slips.get(guess, ("", ""))
    if not problem:
        change = f"{guess:,} is too {'many' if guess > truth else 'few'}: add c.nbytes over the copies whose dst is not meta"
    change = f"onto_slot_1 is right; stays_on_slot_0, {guess:,}, is wrong: {change}"
    fail = _ladder(
        name,
        [
            f"Under {strategy!r}, what does the strategy make on devices[0] before anything travels? "
            f"t.by_op() printed {by_op}.",
            "sum(c.nbytes for c in t.copies if c.dst != meta): compare it with P + B, one model copy.",
        ],
        f"stays_on_slot_0 = sum(c.nbytes for c in t.copies if c.dst != meta) = {truth:,}.",
    )
    return fail(change + ".", problem)


def bucket_copies(
    predicted: Sequence[int] | object, tensors: Sequence[torch.Tensor], device, buffer_size: int
) -> Verdict:
    """Exercise 5: predict ``(sent, copies, bytes)`` for ``costs.copy_coalesced(tensors, device,
    buffer_size)``: ``len(t.transfers)``, ``len(t.copies)`` and ``t.bytes`` of ``dpteach.comm.traffic()``.
    Copies them and compares, part by part.

    Findings (``Verdict.problem``, joined by ``" + "``): ``"per tensor"`` (a copy sent per tensor),
    ``"split"`` (a tensor split across buckets: a bucket always holds whole tensors), ``"no pack"``
    (the packs left out of the copies or of the bytes), ``"one-tensor pack"`` (a bucket of one tensor
    packed too), ``"sent"``, ``"copies"``, ``"bytes"`` (that part wrong, no usual slip).
    """
    import math

    from .. import comm
    from ..measure import costs

    name = f"ch06.bucket_copies.{buffer_size}"
    if _unset(predicted) or (isinstance(predicted, (list, tuple)) and _unset(*predicted)):
        return Verdict(
            False, "Write your prediction as (sent, copies, bytes), e.g. (10, 20, 30000), then run again."
        )
    if not (_whole_numbers(predicted) and len(predicted) == 3):  # type: ignore[arg-type]
        return Verdict(False, f"Give three whole numbers, (sent, copies, bytes), not {predicted!r}.")
    with comm.traffic() as t:
        costs.copy_coalesced(list(tensors), device, buffer_size=buffer_size)
    truth = (len(t.transfers), len(t.copies), t.bytes)
    sent_bytes, packed = sum(c.nbytes for c in t.transfers), t.by_op().get("pack", 0)
    result = f"{truth[0]} sent, {truth[1]} copies, {truth[2]:,} bytes"
    guess = tuple(int(v) for v in predicted)  # type: ignore[union-attr]
    if guess == truth:
        return _correct(name, result)
    # each part that differs gets one clause that says what to change; the parts already right are named
    said, found = [], []
    if guess[0] != truth[0]:
        if guess[0] == len(tensors):
            found.append("per tensor")
            said.append(
                "count one send per bucket, not one per tensor: coalescing sends a bucket in one copy"
            )
        elif guess[0] == math.ceil(sent_bytes / buffer_size):
            found.append("split")
            said.append(
                "count whole tensors per bucket: a bucket never holds part of a tensor (one larger than the "
                f"bucket gets a bucket of its own), so ask how many whole tensors fit in {buffer_size:,} bytes"
            )
        else:
            found.append("sent")
            said.append(
                f"{guess[0]} copies sent is too {'many' if guess[0] > truth[0] else 'few'}: count one send per bucket"
            )
    if guess[1] != truth[1] and guess[1] - guess[0] != truth[1] - truth[0]:  # not the sends alone: the packs
        if packed and guess[1] == guess[0]:
            found.append("no pack")
            said.append(
                "add a 'pack' copy for each bucket of two tensors or more: it is packed on the source before "
                "it is sent"
            )
        elif guess[1] == 2 * guess[0] and truth[1] < 2 * truth[0]:
            found.append("one-tensor pack")
            said.append("leave out the pack of a bucket that holds one tensor: it is sent as it is, unpacked")
        else:
            found.append("copies")
            said.append(
                f"{guess[1]} copies in all is too {'many' if guess[1] > truth[1] else 'few'}: count the sends, "
                "plus one pack per bucket of two tensors or more"
            )
    if guess[2] != truth[2]:
        if packed and guess[2] == sent_bytes:
            found += [] if "no pack" in found else ["no pack"]
            said.append(
                "add the packed bytes to the bytes sent: t.bytes counts every byte of a packed bucket twice, "
                "once packed and once sent"
            )
        elif guess[2] == 2 * sent_bytes and packed < sent_bytes:
            found += [] if "one-tensor pack" in found else ["one-tensor pack"]
            said.append(
                "count the bytes of a bucket that holds one tensor once, not twice: it is sent unpacked, so "
                "only the buckets of two tensors or more add their bytes a second time"
            )
        else:
            found.append("bytes")
            said.append(
                f"{guess[2]:,} bytes is too {'many' if guess[2] > truth[2] else 'few'}: add the bytes sent and "
                "the bytes packed"
            )
    right = [part for part, g, w in zip(("sent", "copies", "bytes"), guess, truth) if g == w]
    counts = f"{' and '.join(right)} {'count is' if len(right) == 1 else 'counts are'}"
    sentences = ([f"your {counts} right"] if right else []) + said
    change = ". ".join(_sentence(x, i) for i, x in enumerate(sentences)) + "."
    per = tensors[0].nbytes if tensors else 0
    fail = _ladder(
        name,
        [
            "A bucket is sent in one copy, and packed first when it holds more than one tensor.",
            f"Each tensor is {per:,} bytes: how many whole tensors fit in {buffer_size:,}? That gives the "
            "buckets; a pack per bucket of two tensors or more; t.bytes adds the packed bytes to the sent.",
        ],
        f"{result}: {truth[0]} buckets sent, {sent_bytes:,} bytes, and {packed:,} bytes packed.",
    )
    return fail(change, " + ".join(found))


def _meta_copy(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` itself when every tensor of it is on ``"meta"``, else a copy moved there (no memory)."""
    import copy

    tensors = (*model.parameters(), *model.buffers())
    return model if all(t.is_meta for t in tensors) else copy.deepcopy(model).to("meta")


def _gathered_outputs(param_bytes: int, n: int) -> list[float]:
    """The gathered output a learner may add to exercise 6's DataParallel bytes, for a model of GPT-2 small's
    parameters: the chapter's workload's output (16 sequences, or one), whole, or the share not on GPU 0,
    on ``n`` GPUs or on the chapter's 4. Nothing for another model: its output is not counted here."""
    from ..measure import costmodel

    work = costmodel.large_workload("gpt2-small")
    if work.param_bytes != param_bytes:
        return []
    outputs = [work.output_bytes, work.scaled(16).output_bytes]
    return [k * out for out in outputs for k in (1, (n - 1) / n, 3 / 4)]


def _near(given: float, truth: float, rel: float = 1e-9) -> bool:
    """Equal up to a float's rounding (or, with ``rel``, up to that share of ``truth``)."""
    return abs(given - truth) <= max(1.0, rel * abs(truth))


def dp_and_ddp_bytes(
    dp_bytes: float | object, ddp_per_rank: float | object, model: torch.nn.Module, n: int
) -> Verdict:
    """Exercise 6: by the chapter's rule (the bytes that cross a link in one step), what one DataParallel
    step of ``model`` on ``n`` GPUs moves, and what each of ``n`` DDP ranks sends.

    DataParallel: its forward's model copies, counted by ``dpteach.comm.traffic()`` around
    ``replicate`` onto ``n`` ``"meta"`` slots (``(n - 1)·(P + B)``), plus the gradients summed into
    GPU 0 in backward, ``(n - 1)·P``. DDP: the ring all-reduce of the gradients, ``2(n - 1)/n·P`` from
    each rank. ``P`` and ``B`` come from ``costs.state_nbytes``. A model not on ``"meta"`` is counted on
    a copy moved there.

    Findings (``Verdict.problem``, joined by ``" + "``): for DataParallel ``"dp half"`` (the forward or
    the backward alone), ``"dp slot 0"`` (slot 0 given a model copy too), ``"dp buffers"`` (the buffers
    left out), ``"dp gather"`` (GPT-2's gathered output added, which the rule leaves out); for DDP ``"ddp 2P"`` (the ``(n - 1)/n`` left out), ``"ddp one pass"`` (one of the ring's
    two passes), ``"ddp all ranks"`` (the sum over the ranks), ``"ddp buffers"`` (the buffers counted
    into the all-reduce), ``"ddp broadcast"`` (rank 0's buffer broadcast, ``(n - 1)·B``, added to it);
    ``"megabytes"`` (a figure in MB), ``"swapped"`` (the two answers the other way round); ``"dp"`` /
    ``"ddp"`` (wrong, no usual slip). The hints climb the ladder, the answer from the third failed try on.
    """
    from .. import comm
    from ..measure import costs
    from ..replicate import replicate

    name = f"ch06.dp_and_ddp_bytes.{n}"
    if _unset(dp_bytes, ddp_per_rank):
        return Verdict(False, "Set dp_bytes and ddp_per_rank to numbers of bytes, then run this cell again.")

    def not_a_number(value: object) -> bool:
        return not isinstance(value, (int, float)) or isinstance(value, bool)

    wrong_kind = _malformed(
        (not_a_number(dp_bytes), f"give dp_bytes as a number of bytes, not {dp_bytes!r}"),
        (not_a_number(ddp_per_rank), f"give ddp_per_rank as a number of bytes, not {ddp_per_rank!r}"),
    )
    if wrong_kind is not None:
        return wrong_kind
    meta = torch.device("meta")
    with comm.traffic() as t:
        replicate(_meta_copy(model), [meta] * n)  # "broadcast", torch's way: slot 0 shares the model
    size = costs.state_nbytes(model)
    P, B = size["parameters"], size["buffers"]
    forward, backward = t.bytes, (n - 1) * P
    dp, per_rank = forward + backward, 2 * (n - 1) / n * P
    said_dp, said_ddp = float(dp_bytes), float(ddp_per_rank)  # type: ignore[arg-type]
    result = (
        f"DataParallel on {n} GPUs: {forward:,} bytes of model copies, (N - 1)·(P + B), counted, + "
        f"{backward:,} of gradients into GPU 0, (N - 1)·P: {dp:,} bytes, every one into or out of GPU 0. "
        f"Each DDP rank sends 2(N - 1)/N·P = {per_rank:,.0f} bytes (modelled: ring all-reduce), "
        f"{n * per_rank:,.0f} over {n} ranks, spread over every link and beside backward"
        + (f"; and rank 0 broadcasts the buffers, (N - 1)·B = {(n - 1) * B:,} bytes." if B else ".")
    )
    dp_right, ddp_right = _near(said_dp, dp), _near(said_ddp, per_rank)
    if dp_right and ddp_right:
        return _correct(name, result)
    # each wrong answer: the first usual slip that gives it, else what to count
    dp_slips = [
        (
            forward,
            "dp half",
            "add the backward to dp_bytes: Broadcast's backward sums every other replica's gradients "
            "into GPU 0, (N - 1)·P bytes"
            if forward != backward
            else "your dp_bytes is half the step: count the model "
            "copies out of GPU 0 before forward and the gradients into it after backward, (N - 1)·P each here",
        ),
        (
            backward,
            "dp half",
            "add the forward to dp_bytes: replicate copies the model out of GPU 0 onto every other GPU, "
            "(N - 1)·(P + B) bytes",
        ),
        (
            n * (P + B) + backward,
            "dp slot 0",
            "your dp_bytes gives slot 0 a model copy, but its replica is the model itself, on GPU 0: "
            "count N - 1 model copies, not N",
        ),
        (
            n * (P + B) + n * P,
            "dp slot 0",
            "your dp_bytes counts slot 0 twice, but slot 0 is GPU 0 itself: count N - 1 model copies out of "
            "it and N - 1 replicas' gradients into it, not N",
        ),
        (
            (n - 1) * P + backward,
            "dp buffers",
            f"your dp_bytes leaves the buffers out, but the model copies carry them: add (N - 1)·B, B = {B:,}",
        ),
    ]
    dp_slips += [
        (
            dp + output,
            "dp gather",
            "your dp_bytes adds the gathered output, but the rule leaves the output out; the cell that prints "
            '"the output DataParallel gathers" counts it. Count the model copies and the gradients alone',
        )
        for output in _gathered_outputs(P, n)
    ]
    ddp_slips = [
        (
            2 * P,
            "ddp 2P",
            "your ddp_per_rank is 2P: count 2(N - 1)/N·P, since a ring cuts the gradients into N chunks "
            "and each rank sends 2(N - 1) of them",
        ),
        (
            (n - 1) / n * P,
            "ddp one pass",
            "your ddp_per_rank is one pass of the ring: count both, since a ring all-reduce makes a "
            "reduce-scatter and then an all-gather, each sending (N - 1)/N·P from every rank",
        ),
        (n * per_rank, "ddp all ranks", "your ddp_per_rank adds up all the ranks: give what one rank sends"),
        (
            2 * (n - 1) / n * (P + B),
            "ddp buffers",
            "leave B out of ddp_per_rank: the all-reduce carries the gradients only, one per parameter",
        ),
        (
            per_rank + (n - 1) * B,
            "ddp broadcast",
            "leave the buffer broadcast out of ddp_per_rank: the exercise asks for the all-reduce alone. "
            "Rank 0 broadcasts the buffers, (N - 1)·B, before each forward in a collective of its own",
        ),
    ]
    found, said = [], []
    if not (dp_right or ddp_right) and _near(said_dp, per_rank) and _near(said_ddp, dp):
        found.append("swapped")
        said.append(
            "your two answers are the other way round: dp_bytes is DataParallel's, ddp_per_rank one DDP rank's"
        )
    for given, truth, right, who, slips, what in (
        (
            said_dp,
            dp,
            dp_right,
            "dp_bytes",
            dp_slips,
            "the forward's model copies and the backward's gradients",
        ),
        (said_ddp, per_rank, ddp_right, "ddp_per_rank", ddp_slips, "one rank's share of the ring all-reduce"),
    ):
        if right or found == ["swapped"]:
            continue
        if any(_near(given * k, truth, rel=1e-3) for k in (1e6, 2**20)):
            found.append("megabytes")
            said.append(
                f"your {who} looks like megabytes: give it in bytes, as costs.state_nbytes counts them"
            )
            continue
        hit = next(((p, c) for k, p, c in slips if not _near(k, truth) and _near(given, k)), None)
        kind = who.split("_")[0]
        problem, change = hit or (
            kind,
            f"your {who}, {given:,.0f}, is too {'large' if given > truth else 'small'}: count {what}",
        )
        found.append(problem)
        said.append(change)
    right = [w for w, ok in (("dp_bytes", dp_right), ("ddp_per_rank", ddp_right)) if ok]
    sentences = ([f"your {right[0]} is right"] if right else []) + said
    change = ". ".join(_sentence(s, i) for i, s in enumerate(sentences)) + "."
    fail = _ladder(
        name,
        [
            "Count both by the chapter's rule, the bytes that cross a link in one step: DataParallel copies "
            "the model out of GPU 0 before forward and brings the gradients back in after backward; in DDP's "
            "ring all-reduce every rank sends a share of the gradients.",
            "DataParallel: (N - 1)·(P + B) of model copies (dpteach.comm.traffic() counts them around "
            "dpteach.replicate onto [torch.device('meta')] * N) plus (N - 1)·P of gradients. DDP: "
            "2(N - 1)/N·P from each rank. P and B: costs.state_nbytes(my_model).",
        ],
        result,
    )
    return fail(change, " + ".join(found))


# ---------------------------------------------------------------- chapter 07 · double backward


def _hvp(net, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, v) -> list[torch.Tensor]:
    """H v for the MSE loss of ``net`` on ``(x, y)``, H the Hessian in ``model``'s parameters: the chapter's
    ``hessian_vector_product``."""
    import torch.nn.functional as F

    params = list(model.parameters())
    grads = torch.autograd.grad(F.mse_loss(net(x), y), params, create_graph=True)
    return list(torch.autograd.grad(sum((g * u).sum() for g, u in zip(grads, v)), params))


def _same(given: object, want: Sequence[torch.Tensor]) -> bool:
    """``given`` is a list of tensors of ``want``'s shapes and equal to them, to float rounding."""
    if not isinstance(given, (list, tuple)) or len(given) != len(want):
        return False
    return all(
        isinstance(g, torch.Tensor) and g.shape == w.shape and torch.allclose(g, w, rtol=1e-4, atol=1e-6)
        for g, w in zip(given, want)
    )


def hvp_linear(
    hv1: object, hv2: object, hv_sum: object, v1, v2, net, x, y, moved: object, broadcast_bytes: object = ...
) -> Verdict:
    """Exercise 2: ``hv1``, ``hv2`` and ``hv_sum`` are H v1, H v2 and H(v1 + v2), taken through ``net``, a
    DataParallel model, inside the ``traffic()`` block ``moved``; the check takes them on one device, on a copy
    of ``net.module``, compares, and asks ``moved`` whether all three forwards and second backwards broadcast.
    ``broadcast_bytes`` is the learner's prediction of ``moved.by_op()["broadcast"]``: each product broadcasts
    the parameters in its forward and ``v`` in its second backward, each to every slot but slot 0.

    Findings (``Verdict.problem``): ``"joined lists"`` (``v1 + v2`` on two lists joins them, so zip stops at
    v1: the sum gives H v1), ``"joined results"`` (``hv1 + hv2``, the lists joined, given as ``hv_sum``),
    ``"swapped"``, ``"hv1"`` / ``"hv2"`` / ``"hv_sum"`` (that one wrong), ``"hand-summed"`` (``hv_sum`` is
    ``hv1 + hv2`` added tensor by tensor, which assumes the linearity to be checked), ``"one device"`` (the
    meter saw too few broadcasts: some product was taken on the model itself), ``"extra"`` (more than three
    products inside the meter), ``"no meter"``, ``"not an answer"``; for the prediction, ``"forward only"``
    (half the bytes: the second backward's broadcast, or the slots, left out), ``"slot 0"`` (a copy onto
    slot 0 counted), ``"one product"``, ``"bytes"`` (another number).
    """
    import copy

    from ..comm import Traffic

    name = "ch07.hvp_linear"
    if _unset(broadcast_bytes):
        return Verdict(
            False, "Predict first: set broadcast_bytes to a number of bytes, then take the products."
        )
    if malformed := _malformed(
        (not _count(broadcast_bytes), f"broadcast_bytes is a whole number of bytes (got {broadcast_bytes!r})")
    ):
        return malformed
    if _unset(hv1, hv2, hv_sum):
        return Verdict(False, "Set hv1, hv2 and hv_sum, then run this cell again.")
    if not isinstance(moved, Traffic):
        return Verdict(
            False,
            "Not yet: take hv1, hv2 and hv_sum inside `with dpteach.comm.traffic() as moved:` and pass moved, "
            "so the check can see DataParallel's copies.",
            "no meter",
        )
    model = net.module
    reference = copy.deepcopy(model)
    v_sum = [a + b for a, b in zip(v1, v2)]
    want = {
        k: [t.detach() for t in _hvp(reference, reference, x, y, v)]
        for k, v in (("hv1", v1), ("hv2", v2), ("hv_sum", v_sum))
    }
    given = {"hv1": hv1, "hv2": hv2, "hv_sum": hv_sum}
    n = len(want["hv1"])
    fail = _ladder(
        name,
        [
            "H v is a matrix times a vector, so it is linear in v: H(v1 + v2) is H v1 + H v2. Each of hv1, "
            "hv2 and hv_sum is one tensor per parameter.",
            "Inside the meter: hv1 = hessian_vector_product(net, model, x, y, v1), the same for v2, and for the sum "
            "[a + b for a, b in zip(v1, v2)]: one tensor per parameter, not the two lists joined.",
        ],
        "hv_sum = hessian_vector_product(net, model, x, y, [a + b for a, b in zip(v1, v2)]); then "
        "torch.testing.assert_close(hv_sum[k], hv1[k] + hv2[k]) holds for every parameter k.",
    )
    if malformed := _malformed(
        (
            not all(
                isinstance(g, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in g)
                for g in given.values()
            ),
            f"hv1, hv2 and hv_sum are each what hessian_vector_product returns, {n} tensors, one per parameter",
        )
    ):
        return malformed
    if isinstance(hv_sum, (list, tuple)) and len(hv_sum) == 2 * n:
        return fail(
            f"hv_sum holds {len(hv_sum)} tensors, two per parameter: `hv1 + hv2` on two lists joins them. "
            "Take H(v1 + v2) itself, with hessian_vector_product.",
            "joined results",
        )
    if _same(hv_sum, want["hv1"]) and not _same(hv_sum, want["hv_sum"]):
        return fail(
            "hv_sum is H v1: `v1 + v2` on two lists joins them into one list of "
            f"{2 * n}, and zip(grads, v) stops after the {n} parameters, at the end of v1. Add the vectors "
            "tensor by tensor: [a + b for a, b in zip(v1, v2)].",
            "joined lists",
        )
    if _same(hv1, want["hv2"]) and _same(hv2, want["hv1"]):
        return fail("hv1 is H v2 and hv2 is H v1: swap them.", "swapped")
    for k in ("hv1", "hv2", "hv_sum"):
        if not _same(given[k], want[k]):
            return fail(
                f"{k} is not what one device gives for the same model, x and y: take it with the chapter's "
                "hessian_vector_product on the DataParallel model, with the same vectors.",
                k,
            )

    # H(v1 + v2) taken by its own second backward rounds differently from hv1 + hv2 in some element of
    # every weight; equal to the last bit in every tensor, it was added by hand (unless the reference's is too).
    # Asked before the meter: a hand-added hv_sum is one product short, and that is the slip to name.
    def added(total, a, b) -> bool:
        return all(torch.equal(s, p + q) for s, p, q in zip(total, a, b))

    if added(hv_sum, hv1, hv2) and not added(want["hv_sum"], want["hv1"], want["hv2"]):
        return fail(
            "hv_sum is hv1 + hv2 added tensor by tensor: that assumes the linearity the exercise checks. "
            "Take H(v1 + v2) itself, as a third product: hessian_vector_product(net, model, x, y, ...) on the "
            "summed vectors, inside the meter.",
            "hand-summed",
        )

    # each product through net broadcasts the parameters twice: in its forward, and in ReduceAddCoalesced's
    # backward during the second backward (the chapter's traffic sentence)
    copies = (len(net.device_ids) - 1) * sum(p.numel() * p.element_size() for p in model.parameters())
    seen = moved.by_op().get("broadcast", 0)
    if seen < 3 * 2 * copies:
        return fail(
            f"the meter saw {seen:,} bytes broadcast, {seen // (2 * copies)} of the three products through "
            f"DataParallel (each broadcasts {2 * copies:,}): take every one inside the meter, with net, the "
            "DataParallel model, as hessian_vector_product's first argument, not model.",
            "one device",
        )
    if seen > 3 * 2 * copies:
        return fail(
            f"the meter saw {seen // (2 * copies)} products' broadcasts, not three: take only hv1, hv2 and "
            "hv_sum inside the `with` block, so that the count is theirs.",
            "extra",
        )
    gap = max((s - a - b).abs().max().item() for s, a, b in zip(want["hv_sum"], want["hv1"], want["hv2"]))
    others, size = len(net.device_ids) - 1, copies // (len(net.device_ids) - 1)
    guess = int(broadcast_bytes)
    if guess != seen:
        slips = {
            seen // 2: (
                "that is half the meter's count: count every broadcast one product makes",
                "forward only",
            ),
            seen // others * (others + 1): (
                "slot 0 holds the originals: a broadcast copies only to the other slots",
                "slot 0",
            ),
            seen // 3: ("that is one product's count: the meter counts all three", "one product"),
        }
        change, problem = slips.get(
            guess,
            (f"the meter saw {'more' if seen > guess else 'fewer'} bytes broadcast than that", "bytes"),
        )
        return _ladder(
            "ch07.hvp_bytes",
            [
                "Count the broadcasts of one product: its forward copies the parameters to the slots, and its second backward runs a node the first "
                "backward recorded. What is that node's backward?",
                "ReduceAddCoalesced's backward is a Broadcast: the second backward copies v, the parameters' "
                f"shapes ({size:,} bytes), to each of the {others} slots after slot 0, as the forward copies the "
                "parameters. Then three products.",
            ],
            f"broadcast_bytes = {seen:,}: 3 products × 2 broadcasts (the parameters in the forward, v in the "
            f"second backward) × {others} slots × {size:,} bytes.",
        )(f"broadcast_bytes = {guess:,}: {change}.", problem)
    _failures.pop("ch07.hvp_bytes", None)
    return _correct(
        name,
        f"H(v1 + v2) = H v1 + H v2, to float rounding (largest gap {gap:.1e}), through DataParallel as on one "
        f"device, and the meter saw {seen:,} bytes broadcast, as you predicted: each product broadcasts the "
        f"parameters in its forward and v in its second backward (ReduceAddCoalesced's backward is a "
        f"Broadcast), {size:,} bytes to each of {others} slots.",
        "right",
    )


def recorded_nodes(count: object, makes_grad: object, graph) -> Verdict:
    """Exercise 1: ``count``, the nodes in the penalty graph's yellow box (``graph.recorded``: what the first
    backward recorded), and ``makes_grad``, the name of the node whose output is ``grad weight``.

    Findings: ``"penalty counted"`` (Pow and Sum too), ``"slots only"`` (the per-slot nodes alone), ``"one slot"``,
    ``"count"`` (another number), ``"forward node"`` (Broadcast), ``"name"`` (another name), ``"not an answer"``.
    """
    name = "ch07.recorded_nodes"
    if _unset(count, makes_grad):
        return Verdict(False, "Set count and makes_grad, then run this cell again.")
    if malformed := _malformed(
        (not _count(count), f"count is a whole number (got {count!r})"),
        (
            not isinstance(makes_grad, str),
            f'makes_grad is a node\'s name, e.g. "Scatter" (got {makes_grad!r})',
        ),
    ):
        return malformed
    n = len(graph.recorded)
    per_slot = sum(node.startswith(("TBackward0", "MmBackward0")) for node in graph.recorded)
    slots = per_slot // 4
    joiner = next(node for node in graph.recorded if node.startswith("ReduceAddCoalesced")).split("Backward")[
        0
    ]
    fail = _ladder(
        name,
        [
            "The yellow box is the record of the first backward, run in grad mode: one node for every operation "
            "a backward function did, on every slot. The penalty's own nodes were made after it.",
            "Count each slot's nodes, then the ones the slots share: the loss's backward, the split of its "
            "gradient, and the node Broadcast's backward recorded. Pow and Sum sit above the box.",
        ],
        f'count = {n}, makes_grad = "{joiner}": MseLossBackwardBackward0, Scatter, 4 nodes on each of the '
        f"{slots} slots, and the {joiner} that Broadcast's backward recorded, whose output is grad weight.",
    )
    word = _word(makes_grad).removesuffix("backward")
    if int(count) == n and word == joiner.lower():
        return _correct(
            name,
            f"{n} nodes: the loss's backward, Scatter, 4 per slot and {joiner}, the node Broadcast's backward "
            "recorded; a second backward walks down through all of them to reach weight.",
            "right",
        )
    if int(count) != n:
        slips = {
            n + 2: ("you counted Pow and Sum too: they are the penalty, outside the box", "penalty counted"),
            per_slot: ("that is the slots' nodes alone: count the ones the slots share too", "slots only"),
            4: ("that is one slot's nodes: count every slot's, and the shared ones", "one slot"),
        }
        change, problem = slips.get(
            int(count), ("count every node inside the yellow box, and only those", "count")
        )
        return fail(f"count = {int(count)}: {change}.", problem)
    if word == "broadcast":
        return fail(
            "Broadcast is the forward's node, below the box: name the node its backward recorded.",
            "forward node",
        )
    return fail(
        f"the count is right; {makes_grad!r} does not make grad weight: name the node grad weight comes out of.",
        "name",
    )


# Exercise 3's four calls, on a loss made under "rewire" from an input x_in that requires grad.
_REWIRE_CALLS = {
    "a": ("torch.autograd.grad(loss, params)", lambda loss, params, x_in: torch.autograd.grad(loss, params)),
    "b": (
        "torch.autograd.grad(loss, params, create_graph=True)",
        lambda loss, params, x_in: torch.autograd.grad(loss, params, create_graph=True),
    ),
    "c": (
        "torch.autograd.grad(loss, x_in, create_graph=True)",
        lambda loss, params, x_in: torch.autograd.grad(loss, x_in, create_graph=True),
    ),
    "d": ("loss.backward(create_graph=True)", lambda loss, params, x_in: loss.backward(create_graph=True)),
}
_REWIRE_WHY = {  # why each call does or does not meet ReduceAdd's check
    "a": "a first-order backward hands ReduceAdd gradients that need no grad, and the check lets them through",
    "b": "with create_graph=True the backward records, and the MSE's gradients reaching ReduceAdd on the way "
    "to the parameters depend on the output, so they require grad and the check refuses them",
    "c": "autograd runs only the nodes on the paths to x_in, and ReduceAdd is on none of them: the penalty on "
    'the input worked under "rewire"',
    "d": "backward runs every node down to the parameters, ReduceAdd included, and create_graph=True makes "
    "their gradients require grad",
}


def rewire_refuses(raises: object, devices=("cpu", "cpu")) -> Verdict:
    """Exercise 3: which of the four calls of ``_REWIRE_CALLS`` raise at ``ReduceAdd``'s check under
    ``"rewire"`` (``raises``, a set of letters). The check runs each on a fresh loss of the course model.

    Findings: ``"a"`` ... ``"d"`` (the first letter answered wrong), ``"not an answer"``.
    """
    import torch.nn.functional as F

    from ..data_parallel import DataParallel
    from . import story

    name = "ch07.rewire_refuses"
    if _unset(raises):
        return Verdict(
            False, 'Set raises to the letters of the calls that raise, e.g. {"a"}, then run this cell again.'
        )
    letters = set(raises) if isinstance(raises, (set, frozenset, list, tuple, str)) else None
    if malformed := _malformed(
        (
            letters is None or not letters <= set(_REWIRE_CALLS),
            f'raises is a set of the letters "a" to "d", e.g. {{"a", "c"}}, not {raises!r}',
        )
    ):
        return malformed
    x, y = (t.to(devices[0]) for t in story.make_data())
    truth = set()
    for letter, (_, call) in _REWIRE_CALLS.items():
        model = story.make_model().to(devices[0])
        x_in = x.clone().requires_grad_()
        loss = F.mse_loss(DataParallel(model, list(devices), strategy="rewire")(x_in), y)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # backward(create_graph=True)'s warning on reference cycles
                call(loss, list(model.parameters()), x_in)
        except RuntimeError as err:
            if "ReduceAdd" in str(err):
                truth.add(letter)
    if letters == truth:
        return _correct(
            name,
            f"{', '.join(sorted(truth))} raise: ReduceAdd's check refuses gradients that require grad, and only a "
            "backward that records (create_graph=True) and passes ReduceAdd, on its way to the parameters, hands "
            "it those. c records too, but differentiates by the input, so it never runs ReduceAdd.",
            "right",
        )
    wrong = sorted(letters ^ truth)
    # The message says more with each try, as the hints do: naming a wrong letter gives it away.
    tries = _failures[name] + 1
    if tries == 1:
        missed, extra = len(truth - letters), len(letters - truth)
        parts = []
        if missed:
            parts.append(
                f"{missed} call{'s' if missed > 1 else ''} you left out raise{'' if missed > 1 else 's'} too"
            )
        if extra:
            parts.append(
                f"{extra} call{'s' if extra > 1 else ''} you listed run{'' if extra > 1 else 's'} without error"
            )
        change = (
            " and ".join(parts) + ": rethink, with the hint below, which calls record and pass ReduceAdd on "
            "their way."
        )
    elif tries == 2:
        they = "it" if len(wrong) == 1 else "they"
        change = f"change your answer for {', '.join(wrong)}: {they} went the other way."
    else:
        change = "; ".join(f"{k} {'raises' if k in truth else 'runs'}: {_REWIRE_WHY[k]}" for k in wrong) + "."
    return _ladder(
        name,
        [
            "ReduceAdd's check looks at the gradients coming in: it refuses them when they require grad, and only "
            "a backward that records makes such gradients.",
            "A backward runs only the nodes on the paths to what it differentiates by. Which calls record, and "
            "which of those go past ReduceAdd to the parameters? Try each on a fresh loss.",
        ],
        f"raises = {{{', '.join(repr(k) for k in sorted(truth))}}}: b and d record (create_graph=True) and pass ReduceAdd on the way to "
        "the parameters; a records nothing; c differentiates by x_in, and ReduceAdd is on no path to it.",
    )(change, wrong[0])


def penalty_inside(cls: type | object, rewire: object = ..., devices=("cpu", "cpu")) -> Verdict:
    """Exercise 4: ``cls(net)`` wraps ``net`` and its ``forward(x)`` returns ``(output, terms)``, the per-row
    input-gradient penalty terms; the loss is ``F.mse_loss(output, y) + terms.mean()``, one mean after the
    gather. Compares loss and gradients under ``"broadcast"`` with one device's ``penalised_loss``, on
    ``devices`` and on three slots (256 rows: pieces of 86, 86 and 84, so a mean per replica shows). ``rewire``
    is the learner's prediction, asked first: does ``cls`` match one device under ``"rewire"`` too? The check
    runs ``cls`` under ``"rewire"`` to see.

    Findings: ``"no grad"`` (the scattered piece used as it is), ``"no create_graph"`` (the input gradient
    taken without ``create_graph=True``), ``"one per replica"`` (``terms`` averaged inside forward),
    ``"penalty wrong"`` (one device's loss is not penalised_loss's), ``"differs"``, ``"raised"``,
    ``"rewire"`` (the prediction wrong), ``"not an answer"``.
    """
    import warnings

    import torch.nn.functional as F

    from ..data_parallel import DataParallel
    from . import story

    name = "ch07.penalty_inside"
    if _unset(rewire):
        return Verdict(
            False,
            'Predict first: set rewire to True or False (does it match one device under "rewire" too?), then '
            "write PenaltyInside.forward.",
        )
    if malformed := _malformed((not isinstance(rewire, bool), f"rewire is True or False (got {rewire!r})")):
        return malformed
    if _unset(cls):
        return Verdict(False, "Define class PenaltyInside first (exercise 4), then run this cell again.")
    fail = _ladder(
        name,
        [
            "Two things stand between forward and one device's numbers. The piece each replica gets does not "
            "require grad, so nothing can be differentiated by it; and one device averages the penalty once, "
            "over every row of the batch.",
            "Differentiate by a copy of the piece that requires grad, keep the graph of that first gradient, "
            "and return each row's term beside the output, not their mean: the mean comes after the gather.",
        ],
        "x = x.detach().requires_grad_(); out = self.net(x); (grad_x,) = torch.autograd.grad(out.sum(), x, "
        "create_graph=True); return out, (grad_x.norm(dim=1) - 1) ** 2.",
    )
    no_graph = (
        "the penalty terms have no history, so the loss's backward cannot reach the parameters through them "
        "(and torch.autograd.grad freed out's graph). Take grad_x with torch.autograd.grad(..., "
        "create_graph=True): the penalty's gradient is a second backward through that first one."
    )
    x, y = (t.to(devices[0]) for t in story.make_data())

    def run(module_of, slots, strategy):
        """The loss and the parameters' gradients of ``cls`` around a fresh model, on one device or under
        DataParallel; the error it raised instead, if any."""
        model = story.make_model().to(devices[0])
        try:
            module = module_of(model)
            net = module if slots is None else DataParallel(module, slots, strategy=strategy)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # gather's warning on 0-d outputs: the finding says it
                out, terms = net(x)
            if isinstance(terms, torch.Tensor) and not terms.requires_grad:
                return terms, None, RuntimeError("no history")
            loss = F.mse_loss(out, y) + terms.mean()
            loss.backward()
        except Exception as err:  # the learner's class: report it, never raise
            return None, None, err
        return terms, (loss.detach(), [p.grad for p in model.parameters()]), None

    runs = {}
    for label, slots in (("one device", None), ("these slots", list(devices)), ("3 slots", [devices[0]] * 3)):
        terms, result, err = run(cls, slots, "broadcast")
        if err is not None and str(err) == "no history":
            return fail(no_graph, "no create_graph")
        if err is not None:
            missing = _missing_name(err, "run the cell that defines PenaltyInside and this check again")
            if missing:
                return missing
            if isinstance(err, NotImplementedError):  # the stub as given: no try yet, no hint spent
                return Verdict(
                    False, "Write PenaltyInside.forward (replace its raise), then run this cell again."
                )
            if "backward through the graph a second time" in str(err):  # grad freed out's graph
                return fail(no_graph, "no create_graph")
            if "does not require grad" in str(err):
                return fail(
                    "RuntimeError: the piece of x that forward gets does not require grad, so there is no "
                    "input gradient to take. Take it as x = x.detach().requires_grad_().",
                    "no grad",
                )
            return Verdict(
                False,
                f"Not yet: on {label}, PenaltyInside raised {type(err).__name__}: {err}. Its forward returns "
                "(output, per-row penalty terms).",
                "raised",
            )
        if terms.numel() != x.shape[0]:
            held = f"{terms.numel()} number" + ("" if terms.numel() == 1 else "s")
            return fail(
                f"on {label} terms holds {held}, not one per row ({x.shape[0]}): forward "
                "averaged them. Return the per-row terms; the one mean comes after the gather.",
                "one per replica",
            )
        runs[label] = result
    expected, grads = runs.pop("one device")
    reference = story.make_model().to(devices[0])  # the chapter's penalised_loss, on one device
    rows = x.clone().requires_grad_(True)
    (grad_x,) = torch.autograd.grad(reference(rows).sum(), rows, create_graph=True)
    wanted = F.mse_loss(reference(rows), y) + ((grad_x.norm(dim=1) - 1) ** 2).mean()
    wanted.backward()

    def same(result) -> bool:
        loss, found = result
        return torch.allclose(loss, expected, rtol=1e-4, atol=1e-6) and _same(found, grads)

    if not same((wanted.detach(), [p.grad for p in reference.parameters()])):
        return fail(
            f"on one device your loss is {expected.item():.5f}, penalised_loss's {wanted.item():.5f}: the "
            "terms are not the chapter's penalty. Each row's term is (grad_x.norm(dim=1) - 1) ** 2.",
            "penalty wrong",
        )
    for label, result in runs.items():
        if not same(result):
            return fail(
                f"on {label} the loss or the gradients differ from one device's: is the penalty averaged once, "
                "over the whole batch's rows, after the gather?",
                "differs",
            )
    _, result, err = run(cls, list(devices), "rewire")  # the prediction's truth, with the learner's class
    matches = err is None and same(result)
    if rewire != matches:
        how = "matches one device" if matches else "does not match one device"
        return _ladder(
            "ch07.penalty_rewire",
            [
                "ReduceAdd refuses only gradients that require grad, and only a recording backward that passes "
                "it on the way to the parameters hands it those. Which backward here records, and by what does "
                "it differentiate?",
                "The backward inside forward records (create_graph=True) but differentiates by the replica's "
                "piece of x: does ReduceAdd lie on a path to it? The loss's final backward records nothing.",
            ],
            f"rewire = {matches}: "
            + (
                "the first gradient goes to each replica's input piece, on no path through ReduceAdd, and the "
                'final backward is first-order, so "rewire" gives one device\'s loss and gradients, as it did '
                "for penalised_loss."
                if matches
                else f'under "rewire" your PenaltyInside {how}.'
            ),
        )(f'your PenaltyInside is right; rewire = {rewire} is not what "rewire" does.', "rewire")
    _failures.pop("ch07.penalty_rewire", None)
    return _correct(
        name,
        f"the loss ({expected.item():.5f}) and every gradient match one device's on {len(devices)} slots and "
        "on 3: each replica takes its own rows' input gradients, and one mean after the gather is the whole "
        "batch's. Averaging inside forward would weigh pieces of unequal rows alike (86, 86, 84 on 3 slots). "
        + (
            'Under "rewire" it matches too, as you predicted: the first gradient goes to each replica\'s input '
            "piece, never through ReduceAdd."
            if matches
            else 'Under "rewire" it does not, as you predicted.'
        ),
        "right",
    )


# Exercise 5's steps: each takes a second backward through DataParallel with the exercise cell's
# DetachedBroadcast in Broadcast's place; the losses are the chapter's gradient_norm_loss and
# hessian_vector_product.
_SECOND_STEPS = {
    "a": "gradient_norm_loss(net_of(model, DetachedBroadcast), model, x, y).backward()",
    "b": "hessian_vector_product(net_of(model, DetachedBroadcast), model, x, y, v)",
}
_SECOND_OUTCOMES = ("right", "wrong", "raises")
_SECOND_WHY = {  # why each step does what it does
    "a": "ReduceAddCoalesced.apply records a node only when an input requires grad; given detached gradients "
    "it records nothing, so the first gradient has no history and the penalty counts as a constant",
    "b": "the first gradient has no history, as in a, and H v differentiates nothing else: g · v has no "
    "grad_fn, and torch.autograd.grad refuses a tensor without one",
}


def _detached_broadcast():
    """The exercise cell's DetachedBroadcast: Broadcast, its backward handing ReduceAddCoalesced.apply
    detached gradients."""
    from ..functions import Broadcast, ReduceAddCoalesced

    class DetachedBroadcast(Broadcast):
        @staticmethod
        def backward(ctx, *grads):
            grads = [g.detach() for g in grads]
            return (None,) + ReduceAddCoalesced.apply(ctx.input_device, ctx.num_inputs, *grads)

    return DetachedBroadcast


def _second_steps_run(devices) -> dict[str, tuple[str, str]]:
    """Each step of ``_SECOND_STEPS`` run on a fresh course model: ``{letter: (outcome, what happened)}``,
    the outcome ``"right"`` (one device's gradients, or H v, to float rounding), ``"wrong"`` or ``"raises"``."""
    import torch.nn.functional as F

    from ..data_parallel import DataParallel
    from ..exercises import broadcast_with
    from . import story

    detached_broadcast = _detached_broadcast()
    x, y = (t.to(devices[0]) for t in story.make_data())
    g = torch.Generator().manual_seed(0)
    v = [torch.randn(p.shape, generator=g).to(devices[0]) for p in story.make_model().parameters()]

    def gradient_norm(net, model):
        loss = F.mse_loss(net(x), y)
        grads = torch.autograd.grad(loss, list(model.parameters()), create_graph=True)
        return loss + 0.1 * sum(t.pow(2).sum() for t in grads)

    def hvp(net, model):
        return _hvp(net, model, x, y, v)

    def grads_after(loss_of):  # a loss's .backward(): the parameters' gradients
        def run(net, model):
            loss_of(net, model).backward()
            return [p.grad for p in model.parameters()]

        return run

    steps = {  # letter: (the node in its strategy, what the step computes)
        "a": (broadcast_with(detached_broadcast), grads_after(gradient_norm)),
        "b": (broadcast_with(detached_broadcast), hvp),
    }
    found = {}
    for letter, (strategy, compute) in steps.items():
        one = story.make_model().to(devices[0])
        want = compute(one, one)
        model = story.make_model().to(devices[0])
        try:
            got = compute(DataParallel(model, list(devices), strategy=strategy), model)
        except RuntimeError as err:
            found[letter] = ("raises", f"raised RuntimeError: {str(err).splitlines()[0]}")
            continue
        if _same(list(got), [w.detach() for w in want]):
            found[letter] = ("right", "gave one device's result")
        else:
            gap = max((a - b).abs().max().item() for a, b in zip(got, want))
            found[letter] = ("wrong", f"ran, {gap:.2f} off one device's result")
    return found


def second_backwards(does: Mapping[str, object] | object, devices=("cpu", "cpu")) -> Verdict:
    """Exercise 5: ``does`` maps each step of ``_SECOND_STEPS`` to what it does, ``"right"``, ``"wrong"``
    or ``"raises"``. The check runs the two steps, with its own copy of the exercise's node, against one
    device, and compares.

    Findings: ``"a"`` or ``"b"`` (the first step predicted wrong), ``"not an answer"``.
    """
    name = "ch07.second_backwards"
    if _unset(does) or not isinstance(does, Mapping) or _unset(*does.values()):
        return Verdict(
            False, 'Set each step in `does` to "right", "wrong" or "raises", then run this cell again.'
        )
    given = {_word(k): _word(v) for k, v in does.items()}
    given = {k: "raises" if v == "raise" else v for k, v in given.items()}
    odd = sorted(k for k in _SECOND_STEPS if given.get(k) not in _SECOND_OUTCOMES)
    if malformed := _malformed(
        (
            bool(odd or set(given) - set(_SECOND_STEPS)),
            '`does` maps "a" and "b" each to "right", "wrong" or "raises"'
            + (f"; check {', '.join(odd)}" if odd else "; it has a key that is no step"),
        )
    ):
        return malformed
    found = _second_steps_run(devices)
    truth = {k: outcome for k, (outcome, _) in found.items()}
    if given == truth:
        return _correct(
            name,
            "The check just ran the two steps: "
            + "; ".join(f"{k} {found[k][1]}" for k in _SECOND_STEPS)
            + ". A backward that records nothing is refused only where nothing else of the result has a "
            "graph (b); beside a loss that has one it runs, silently wrong (a).",
            "right",
        )
    wrong = [k for k in _SECOND_STEPS if given[k] != truth[k]]
    # The message says more with each try, as the hints do: naming a wrong letter gives it away.
    tries = _failures[name] + 1
    if tries == 1:
        n = len(wrong)
        change = (
            f"{'one' if n == 1 else 'both'} of your two predictions disagree{'s' if n == 1 else ''} with what "
            "the steps do: rethink with the hint below, step by step."
        )
    elif tries == 2:
        they = "it" if len(wrong) == 1 else "they"
        change = f"change your answer for {', '.join(wrong)}: {they} did something else."
    else:
        said = {
            "right": "runs and gives one device's result",
            "wrong": "runs, but not to one device's result",
        }
        change = "; ".join(f"{k} {said.get(truth[k], 'raises')}: {_SECOND_WHY[k]}" for k in wrong) + "."
    answer = (
        "does = {"
        + ", ".join(f'"{k}": "{truth[k]}"' for k in _SECOND_STEPS)
        + "}. Answer 5, below this cell, says why for each step."
    )
    return _ladder(
        name,
        [
            "A second backward goes only through what the first backward recorded. Does "
            "ReduceAddCoalesced.apply record a node when none of its inputs requires grad?",
            "A first gradient without history is not always refused: added to a loss that has a graph, it "
            "is a constant, and backward runs; differentiated alone, it gives torch.autograd.grad a tensor "
            "with no grad_fn. Try each step on a fresh model.",
        ],
        answer,
    )(change, wrong[0])


# ---------------------------------------------------------------- chapter 08 · real GPUs


def _slip_or(fail, guess, slips: dict, otherwise: str) -> Verdict:
    """The last step of a numeric check: a known slip's change (``slips[guess]`` is ``(problem, change)``),
    else ``otherwise``, found as ``"other"``."""
    if guess in slips:
        problem, change = slips[guess]
        return fail(change + ".", problem)
    return fail(otherwise, "other")


_THRESHOLD = (
    "the cap is not a maximum: a bucket closes on the tensor that takes it to or past its cap, so that "
    "tensor joins it and a bucket can end up holding more than its cap"
)


def _under_cap(sizes, bucket_bytes: int, first_bucket_bytes: int) -> list[int]:
    """The buckets a learner gets by reading the cap as a maximum: each closes before the tensor that
    would take it past its cap (a tensor over the cap alone still gets a bucket). Not DDP's rule."""
    buckets, filled, limit = [], 0, first_bucket_bytes
    for nbytes in sizes:
        if filled and filled + nbytes > limit:
            buckets.append(filled)
            filled, limit = 0, bucket_bytes
        filled += nbytes
    return buckets + ([filled] if filled else [])


def copied_per_step(
    predicted: int | object, model: torch.nn.Module, x: torch.Tensor, slots: Sequence
) -> Verdict:
    """Exercise 1: every byte one DataParallel step of ``model`` on ``x`` copies over ``slots``, as the
    chapter's first cell prints them (``costs.step_traffic(...).by_op()``, summed). Counted on a copy of
    the model, so its gradients stay as they were.

    Findings (``Verdict.problem``): ``"slot 0"`` (a model copy counted for slot 0, whose replica is the
    model itself), ``"no gather"`` (the gathered output left out), ``"two slots"`` (the two-slot step's
    bytes, not scaled to these slots), ``"gradients"`` (the gradients' sum counted as a copy: on one
    device it is an addition, not a copy), ``"gather share"`` (the gather counted without slot 0's own
    piece), ``"scatter"`` (the batch's scatter counted: on one device its pieces are views),
    ``"elements"`` (elements, not bytes), ``"every slot, no gather"`` (a model copy for every slot and no
    gather), ``"arithmetic"`` (within 0.1% of the answer). A sum within 0.1%
    of a slip's is told that slip and to check the sum. The hints climb the ladder, the
    answer from the third failed try on.
    """
    import copy

    from ..measure import costs

    n = len(slots)
    name = f"ch08.copied_per_step.{n}"
    if (unanswered := _not_a_byte_count(predicted)) is not None:
        return unanswered
    ops = costs.step_traffic(copy.deepcopy(model), x, list(slots)).by_op()
    truth = sum(ops.values())
    P = costs.state_nbytes(model)["parameters"]
    gathered = ops.get("gather", 0)
    parts = " + ".join(f"{op} {b:,}" for op, b in ops.items())
    answer = (
        f"{truth:,} bytes ({parts}): replicate copies the model to each of the {n - 1} slots after slot 0, "
        f"{n - 1} × {P:,} bytes, and gather copies the whole output onto slot 0 once, {gathered:,} bytes, "
        "whatever the number of slots."
    )
    guess = int(predicted)  # type: ignore[call-overload]
    if guess == truth:
        return _correct(name, answer)
    two = (
        sum(costs.step_traffic(copy.deepcopy(model), x, [slots[0]] * 2).by_op().values()) if n != 2 else None
    )
    slips = {
        truth + P: (
            "slot 0",
            "slot 0 already holds the model (its replica shares the model's storage): replicate copies "
            f"it to the other {n - 1} slots only, so take one model copy out",
        ),
        truth - gathered: (
            "no gather",
            f"the gather copies the outputs onto slot 0 too: add its {gathered:,} bytes",
        ),
        truth // 4: ("elements", "you counted elements; count bytes: 4 per float32"),
    }
    slips.setdefault(  # a model copy for every slot, the gather left out: two changes
        truth + P - gathered,
        (
            "every slot, no gather",
            f"that is {n} model copies and no gather. Slot 0 needs no copy (its replica shares the model's "
            f"storage), so count {n - 1}; then add the gather, which copies the whole output onto slot 0, "
            f"{gathered:,} bytes",
        ),
    )
    if n > 1:  # the gather read as copying only the other slots' pieces: it copies slot 0's piece too
        slips.setdefault(
            truth - gathered // n,
            (
                "gather share",
                "the gather copies every slot's piece of the output into one new tensor on slot 0, "
                f"slot 0's own piece too: count the whole output, {gathered:,} bytes, "
                f"not the {gathered - gathered // n:,} of the other slots",
            ),
        )
    if "scatter" not in ops:  # one device: the scatter's pieces are views of the batch, no copy
        batch = x.numel() * x.element_size()
        scatter = (
            "scatter",
            "you added the scatter of the batch: on one device it cuts the batch into views of its "
            "rows and copies nothing, so traffic() records no scatter; leave it out (only between GPUs "
            "does it copy each piece bound for another GPU)",
        )
        slips.setdefault(truth + batch, scatter)
        slips.setdefault(truth + batch - batch // n, scatter)  # the other slots' pieces only
    if "reduce_add" not in ops and "reduce" not in ops:  # one device: the sum adds in place, no copy
        slips.setdefault(
            truth + (n - 1) * P,
            (
                "gradients",
                "the gradients' sum adds the replicas' gradients "
                "into the model's on this device: an addition, not a copy, so traffic() records none; "
                "leave the gradients out",
            ),
        )
    if two is not None:
        slips.setdefault(
            two,
            (
                "two slots",
                f"that is the two-slot step the chapter printed; on {n} slots "
                f"replicate copies the model once per slot after slot 0: count {n - 1} model copies, "
                "and the gather once",
            ),
        )
    fail = _ladder(
        name,
        [
            'Read the two "step 1 copied" and "step 2 copied" lines under "What DataParallel repeats '
            'every step": which move grows with the slots, and which copies the same bytes whatever their '
            "number?",
            f"The model is {P:,} bytes of parameters (the line under the steps). The broadcast gives every "
            "slot but slot 0 a copy; the gather copies the whole output onto slot 0 once.",
        ],
        answer,
    )
    # a sum a little off a slip's (or the answer's): the slip's change, and the sum to check
    near = [v for v in (truth, *slips) if v != guess and abs(guess - v) <= v // 1000]
    if near:
        v = min(near, key=lambda v: abs(guess - v))
        sum_off = f"{guess:,} is {abs(guess - v):,} bytes off {v:,}"
        if v == truth:
            return fail(f"{sum_off}, the right moves: check your sum.", "arithmetic")
        problem, change = slips[v]
        return fail(f"{change}; and {sum_off}, what that slip gives: check your sum too.", problem)
    return _slip_or(
        fail,
        guess,
        slips,
        f'{guess:,} bytes is too {"many" if guess > truth else "few"}. Add the two moves the "step" lines '
        "name: the broadcast (one model copy for each slot after slot 0) and the gather (the whole output, "
        "once).",
    )


def _parts_after_backward(work, strategy: str, gpu: str = "A100-SXM", n: int = 4) -> list[str]:
    """The names of the parts of the modelled step that start once every GPU's backward is done, in order;
    DDP's all-reduces named ``"bucket k"`` as the timeline labels them."""
    from ..measure import costmodel

    parts = costmodel.predict(work, gpu, n, strategy, latency=True).parts
    done = max(p.end for p in parts if p.name == "backward")
    buckets = [p for p in parts if p.name == "all-reduce"]
    names = [
        f"bucket {buckets.index(p) + 1}" if p in buckets else p.name for p in parts if p.start >= done - 1e-12
    ]
    return list(dict.fromkeys(names))


def wait_for_backward(answer: Mapping[str, object] | object, work) -> Verdict:
    """Exercise 4: for each strategy, the set of parts of its step (as the timeline names them) that must
    wait until every GPU's backward is done. Read from the modelled timeline of ``work`` on 4 A100s;
    the order is the code's (DataParallel sums the replicas' gradients once they all exist; DDP's last
    bucket holds the first layer's gradients, which backward makes last), whatever the bar lengths.

    Findings: ``"gather"`` (a forward-side move named), ``"flatten"`` (the flatten left out),
    ``"reduce"`` (the sum left out), ``"first bucket"`` (a bucket named that starts during backward),
    ``"last bucket"`` (the last bucket left out), ``"names"`` (a name the timeline does not use, a typo
    such as ``"bucket2"``: told the names, with the nearest, and the try not counted; or a string given
    for a set), ``"passes"`` (``"forward"`` or ``"backward"`` named: told the moves, the try not counted).
    """
    import difflib

    name = "ch08.wait_for_backward"
    if _unset(answer) or not isinstance(answer, Mapping) or _unset(*answer.values()):
        return Verdict(
            False,
            'Set answer = {"DataParallel": {...}, "DDP": {...}}, each a set of names from the timeline '
            '(such as "gather" or "bucket 1"), then run this cell again.',
        )
    from ..measure import costmodel

    truth = {s: set(_parts_after_backward(work, s)) for s in ("DataParallel", "DDP")}
    # the names a timeline shows: its parts, DDP's all-reduces as "bucket k", no thread starts
    known = {
        s: {
            p.name
            for p in costmodel.predict(work, "A100-SXM", 4, s, latency=True).parts
            if p.lane != "python"
        }
        for s in ("DataParallel", "DDP")
    }
    known["DDP"] = (known["DDP"] - {"all-reduce"}) | {
        f"bucket {k + 1}" for k in range(len(costmodel.buckets(work)))
    }

    def as_set(names: set[str]) -> str:
        return "{" + ", ".join(f'"{n}"' for n in sorted(names)) + "}"

    said = (
        f"DataParallel: {as_set(truth['DataParallel'])}, DDP: {as_set(truth['DDP'])}. DataParallel flattens and "
        "sums the replicas' gradients onto GPU 0 only once every backward has made them; DDP all-reduces each "
        "bucket as soon as backward has filled it, so only the last bucket, which holds the first layer's "
        "gradients, waits for backward to end."
    )
    fail = _ladder(
        name,
        [
            "A part waits for backward when it needs a gradient that backward makes last: the first layer's.",
            "In DataParallel nothing touches the gradients until every replica's backward is done; in DDP "
            "backward fills the buckets from the last layer to the first.",
        ],
        said,
    )
    strings = [s for s in ("DataParallel", "DDP") if isinstance(answer.get(s), str)]  # type: ignore[union-attr]
    if strings:  # "bucket 2" for {"bucket 2"}: read as a set it would be its letters
        return Verdict(
            False,
            f"Not yet: {strings[0]}'s answer is a string, {answer[strings[0]]!r}; give a set of names, "  # type: ignore[index]
            f"such as {{{answer[strings[0]]!r}}}, even for one part (this try does not count).",  # type: ignore[index]
            "names",
        )
    # a part's name as chapter 00's names are read (_word: any case): "Flatten" is the figure's flatten
    given = {s: {_word(v) for v in answer.get(s, ())} for s in ("DataParallel", "DDP")}  # type: ignore[union-attr]
    for s in given:
        passes = sorted(given[s] & {"forward", "backward"})
        if passes:  # the passes themselves: the question is what waits for backward to end
            return Verdict(
                False,
                f"Not yet: {' and '.join(map(repr, passes))} {'is' if len(passes) == 1 else 'are'} not a part "
                f"that waits for backward: name the moves drawn beside the passes. The {s} timeline's moves: "
                f"{', '.join(sorted(known[s] - {'forward', 'backward'}))} (this try does not count).",
                "passes",
            )
        unknown = given[s] - known[s]
        if unknown:  # a typo or a name the figure does not use: said plainly, no try spent, no hint
            near = [m for u in sorted(unknown) for m in difflib.get_close_matches(u, sorted(known[s]), 1)]
            meant = f" Did you mean {', '.join(map(repr, near))}?" if near else ""
            return Verdict(
                False,
                f"Not yet: the {s} timeline has no part named {', '.join(map(repr, sorted(unknown)))}.{meant} "
                f"Its parts: {', '.join(sorted(known[s]))}. Fix the name and run this check again "
                "(this try does not count).",
                "names",
            )
    dp, ddp = given["DataParallel"], given["DDP"]
    early = dp - truth["DataParallel"]
    if early:
        return fail(
            f"{sorted(early)} run{'s' if len(early) == 1 else ''} before backward: the loss needs the gathered "
            "outputs, and the gather's backward sends their gradients out before the replicas' backwards.",
            "gather",
        )
    if "flatten" in truth["DataParallel"] and "flatten" not in dp:
        return fail(
            "the flatten packs each replica's gradients into one buffer, so it needs them all.", "flatten"
        )
    if "reduce" not in dp:
        return fail(
            "the sum onto GPU 0 (reduce) adds every replica's gradients: it waits for all of them.", "reduce"
        )
    if ddp - truth["DDP"]:
        return fail(
            f"{sorted(ddp - truth['DDP'])} hold{'s' if len(ddp - truth['DDP']) == 1 else ''} later layers' "
            "gradients, which backward makes first: the all-reduce starts while backward still runs.",
            "first bucket",
        )
    if truth["DDP"] - ddp:
        return fail(
            f"{sorted(truth['DDP'] - ddp)} holds the first layer's gradients, which backward makes last: it "
            "cannot start before backward ends.",
            "last bucket",
        )
    return _correct(name, said)


def bucket_count(predicted: int | object, model: torch.nn.Module) -> Verdict:
    """Exercise 5: how many buckets DDP fills with ``model``'s gradients after its first step, at its
    defaults (a first bucket of 1 MiB, then 25 MiB: ``dist._DEFAULT_FIRST_BUCKET_BYTES`` and
    ``bucket_cap_mb``), gradients in backward order (the last layer's first).

    Findings: ``"no first bucket"`` (every bucket taken as 25 MiB), ``"one bucket"``, ``"cap as a
    maximum"`` (a bucket closed before the tensor that would take it past its cap), ``"per layer"`` /
    ``"per tensor"`` (a bucket per module or per tensor), ``"split"`` (tensors split to fill each bucket
    to its cap exactly: a bucket holds whole tensors).
    """
    import math

    from ..measure import costmodel

    name = "ch08.bucket_count"
    if _unset(predicted):
        return Verdict(False, "Set predicted to your number of buckets, e.g. 5, then run this cell again.")
    if not _count(predicted):
        return Verdict(False, f"Give a whole number of buckets, e.g. 5, not {predicted!r}.")
    params = [p for p in model.parameters() if p.requires_grad]
    sizes = [p.numel() * p.element_size() for p in reversed(params)]
    first, cap = 2**20, 25 * 2**20
    truth = costmodel.fill_buckets(sizes, cap, first)
    total = sum(sizes)
    mb = ", ".join(f"{b / 1e6:.1f} MB" for b in truth)
    answer = (
        f"{len(truth)} buckets ({mb}): backward makes the last layer's gradients first; bucket 1 closes on "
        f"the tensor that takes it to or past 1 MiB, every later one on the tensor that takes it to or past 25 MiB, and the "
        "last holds what is left."
    )
    guess = int(predicted)  # type: ignore[call-overload]
    if guess == len(truth):
        return _correct(name, answer)
    layers = len([m for m in model.modules() if any(True for _ in m.parameters(recurse=False))])
    slips = {}
    for count, problem, change in (
        (
            len(costmodel.fill_buckets(sizes, cap, cap)),
            "no first bucket",
            "DDP's first bucket is capped at 1 MiB, not 25 MiB, "
            "so the last layer's gradients go out in a bucket of their own",
        ),
        (1, "one bucket", f"{total / 1e6:.1f} MB of gradients is more than one bucket's 25 MiB"),
        *(
            (len(_under_cap(sizes, big, small)), "cap as a maximum", _THRESHOLD)
            for big, small in ((cap, first), (25_000_000, 1_000_000))  # read in MiB, or in MB
        ),
        (
            1 + math.ceil(max(total - first, 0) / cap),
            "split",
            "a bucket holds whole tensors and closes on the "
            "tensor that takes it to or past its cap, so it can hold more than the cap",
        ),
        (layers, "per layer", "a bucket holds many layers' gradients, up to its cap"),
        (len(sizes), "per tensor", "a bucket holds many tensors, up to its cap"),
    ):
        if count != len(truth):
            slips.setdefault(count, (problem, change))
    fail = _ladder(
        name,
        [
            "Buckets fill in the order backward makes the gradients: the last layer's first.",
            f"The last layer's weight and bias make {sizes[0] + sizes[1]:,} bytes of gradients; the first "
            "bucket closes at or past 1 MiB = 1,048,576 bytes, each later one at or past 25 MiB = 26,214,400 bytes.",
        ],
        answer,
    )
    return _slip_or(
        fail,
        guess,
        slips,
        f"{guess} is too {'many' if guess > len(truth) else 'few'}: fill the buckets tensor by tensor.",
    )


# the moves a DataParallel step makes between GPUs (``costs.check_step_counts``): Exercise 2's names
_DP_MOVES = ("scatter", "broadcast", "gather", "reduce_add")


def ddp_also_copies(answer: Mapping[str, object] | object, models: Mapping[str, torch.nn.Module]) -> Verdict:
    """Exercise 2: for each model in ``models``, which of DataParallel's per-step moves between GPUs
    (``scatter``, ``broadcast``, ``gather``, ``reduce_add``) DDP makes too, every step, at its defaults.

    DDP keeps a replica per process and all-reduces the gradients, so it scatters no batch, copies no
    parameters, gathers no output and sends no gradient to GPU 0. Before each forward it broadcasts rank
    0's buffers when the module has any (``_pre_forward`` -> ``_sync_buffers`` in torch 2.13's
    ``nn/parallel/distributed.py``; ``forward_sync_buffers`` defaults to True), so the truth for a model
    is ``{"broadcast"}`` if it holds buffers, else the empty set.

    Findings: ``"reduce_add"``, ``"scatter"``, ``"gather"`` (that move named), ``"parameters"``
    (``broadcast`` for a model without buffers), ``"buffers"`` (``broadcast`` left out for a model with
    buffers), ``"names"`` (a name not among the four, or a string for a set: told, no try spent).
    """
    import difflib

    from ..measure import costs

    name = "ch08.ddp_also_copies"
    keys = list(models)
    if _unset(answer) or not isinstance(answer, Mapping) or _unset(*answer.values()):
        return Verdict(
            False,
            "Set answer = {" + ", ".join(f'"{k}": {{...}}' for k in keys) + "}, each a set of the moves DDP "
            'also makes (such as {"gather"}, or set() for none), then run this cell again.',
        )
    missing = [k for k in keys if k not in answer]
    if missing:
        return Verdict(False, f"Not yet: give an answer for {', '.join(map(repr, missing))} too.", "names")
    buffers = {k: costs.state_nbytes(m)["buffers"] for k, m in models.items()}
    truth = {k: {"broadcast"} if buffers[k] else set() for k in keys}
    given: dict[str, set[str]] = {}
    for k in keys:
        value = answer[k]  # type: ignore[index]
        if isinstance(value, str):
            return Verdict(
                False,
                f"Not yet: {k}'s answer is a string, {value!r}; give a set, such as {{{value!r}}}, or set() for "
                "none (this try does not count).",
                "names",
            )
        given[k] = {_word(v) for v in value}  # type: ignore[union-attr]
        unknown = given[k] - set(_DP_MOVES)
        if unknown:
            near = [m for u in sorted(unknown) for m in difflib.get_close_matches(u, _DP_MOVES, 1)]
            meant = f" Did you mean {', '.join(map(repr, near))}?" if near else ""
            also = (
                " DDP's all-reduce is its own move, not one of DataParallel's: the question is which of "
                "DataParallel's DDP makes too."
                if any("all" in u and "reduce" in u for u in unknown)
                else ""
            )
            return Verdict(
                False,
                f"Not yet: {', '.join(map(repr, sorted(unknown)))} is not one of DataParallel's four moves.{meant}"
                f"{also} The four: {', '.join(_DP_MOVES)} (this try does not count).",
                "names",
            )
    with_buffers = [k for k in keys if buffers[k]]
    said = (
        "DDP makes none of DataParallel's moves for a model without buffers: each process keeps its own replica, "
        "feeds it its own rows, computes its own loss, and all-reduces the gradients, so every rank applies the "
        "same sum and the replicas stay equal. "
        + (
            f"For {', '.join(f'`{k}`' for k in with_buffers)} it broadcasts rank 0's buffers before each forward "
            f"({', '.join(f'{buffers[k]:,} bytes' for k in with_buffers)}: BatchNorm's running statistics, which "
            "each rank updates from its own rows), never the parameters."
            if with_buffers
            else ""
        )
    )
    answer_text = "answer = {" + ", ".join(f'"{k}": {truth[k] or "set()"}' for k in keys) + "}. " + said
    fail = _ladder(
        name,
        [
            "DDP keeps a whole replica in each process and all-reduces the gradients; a move is still needed "
            "only for state that the gradients do not keep equal across the replicas.",
            "Every rank applies the same all-reduced gradients, so the parameters stay equal. BatchNorm updates "
            "its running statistics in forward, from each rank's own rows (chapter 05).",
        ],
        answer_text,
    )
    every = set().union(*given.values())
    if "reduce_add" in every:
        return fail(
            "DDP sums the gradients too, but by all-reduce: the ranks exchange pieces and every GPU ends with "
            "the sum. No rank sends its gradients to GPU 0, as reduce_add does, so take reduce_add out.",
            "reduce_add",
        )
    if "scatter" in every:
        return fail(
            "each DDP process reads its own rows and feeds them to its own replica; no process cuts one batch "
            "for the others, so take scatter out.",
            "scatter",
        )
    if "gather" in every:
        return fail(
            "each DDP rank computes its loss from its own outputs, so no output is gathered: take gather out.",
            "gather",
        )
    extra = [k for k in keys if "broadcast" in given[k] and not buffers[k]]
    if extra:
        return fail(
            f"DDP copies no parameters per step: the replicas stay equal because every rank applies the same "
            f"gradients. It broadcasts buffers only, and {extra[0]!r} has none, so take broadcast out of its set.",
            "parameters",
        )
    short = [k for k in keys if buffers[k] and "broadcast" not in given[k]]
    if short and not _failures[name]:  # a first try: the idea, not the move
        return fail(
            f"{short[0]!r} holds buffers, BatchNorm's running mean and variance, and each rank's forward "
            "updates them from its own rows; the gradients do not keep them equal. What must DDP do before "
            "every forward so that every rank uses the same ones?",
            "buffers",
        )
    if short:
        return fail(
            f"{short[0]!r} holds buffers, BatchNorm's running mean and variance, which each rank updates from "
            f"its own rows; DDP broadcasts rank 0's before every forward ({buffers[short[0]]:,} bytes), so add "
            "broadcast to its set.",
            "buffers",
        )
    return _correct(name, said)


def nodes_per_thread(
    answer: Mapping[str, object] | object, model: torch.nn.Module, x: torch.Tensor, gpus: int = 4
) -> Verdict:
    """Exercise 3: how many of the backward nodes of one DataParallel step of ``model`` on ``x`` each GPU's
    engine thread runs on ``gpus`` GPUs, slot k on ``cuda:k``. The truth is the step recorded on
    ``gpus`` slots of ``x``'s device (``threads.backward_threads``, on a copy of ``model``) and the
    engine's rule applied to its nodes (``Threads.gpu_threads``): replica k's nodes on cuda:k's thread, the
    loss, the gather's backward and the sum onto the model on cuda:0's, the calling thread none.

    Findings: ``"one thread"`` (every node on one thread, as on CPU slots), ``"caller"`` (nodes given to
    the calling thread), ``"cuda:0 replica only"``, ``"no sum"``, ``"no loss"`` (cuda:0 given only some
    of its parts), ``"even split"``, ``"replica"`` (another GPU's count off), ``"other"``, ``"names"``
    (a thread not among them: told, no try spent).
    """
    import copy

    from ..measure import threads

    name = "ch08.nodes_per_thread"
    gpu_keys = [f"cuda:{k}" for k in range(gpus)]
    if _unset(answer) or not isinstance(answer, Mapping) or _unset(*answer.values()):
        return Verdict(
            False,
            "Set answer = {" + ", ".join(f'"{k}": ...' for k in gpu_keys) + "}, each the number of backward "
            "nodes that GPU's engine thread runs, e.g. 7, then run this cell again.",
        )
    given: dict[str, object] = {}
    for key, value in answer.items():
        word = _word(key).removeprefix("autograd thread ").replace(" ", "")
        given["caller" if word.startswith("caller") else word] = value
    unknown = sorted(set(given) - {*gpu_keys, "caller"})
    missing = [k for k in gpu_keys if k not in given]
    if unknown or missing:
        return Verdict(
            False,
            "Not yet: name each GPU's engine thread once, "
            + ", ".join(f'"{k}"' for k in gpu_keys)
            + (f"; {', '.join(map(repr, unknown))} is not one of them" if unknown else "")
            + " (this try does not count).",
            "names",
        )
    if not all(_count(v) for v in given.values()):
        return Verdict(False, "Not yet: give each thread a whole number of nodes, e.g. 7.", "not an answer")
    counts = {k: int(v) for k, v in given.items()}  # type: ignore[call-overload]
    recorded = threads.backward_threads(copy.deepcopy(model), x, [x.device] * gpus)
    truth = recorded.gpu_threads()
    parts = Counter(r.replica for r in recorded.rows)
    top, per_replica, shared = parts["-"], parts["replica 0"], parts["shared"] + parts["input"]
    total = len(recorded.rows)
    said = (
        ", ".join(f"{k}: {truth.get(k, 0)}" for k in gpu_keys)
        + ". Each node runs on the engine thread of the GPU of its first forward output (Node::device()). "
        f"Replica k's {per_replica} nodes made theirs on cuda:k; the loss and gather ({top} nodes) and the sum "
        f"onto the model ({shared}) on cuda:0, where the model and the gathered output live, so cuda:0's thread runs "
        f"{top} + {per_replica} + {shared} = {truth['cuda:0']}. The thread that called backward() runs none: "
        "it waits."
    )
    if all(counts.get(k) == truth.get(k, 0) for k in gpu_keys) and not counts.get("caller"):
        return _correct(name, said)
    fail = _ladder(
        name,
        [
            "Each node runs on the engine thread of the GPU its forward output is on, and replica k's outputs "
            "are on cuda:k.",
            "Count each part's nodes in the thread table: the loss and gather, one replica, the sum onto the "
            "model. Which GPU holds the loss, the gathered output and the model?",
        ],
        "answer = {" + ", ".join(f'"{k}": {truth.get(k, 0)}' for k in gpu_keys) + "}. " + said,
    )
    if counts.get("caller"):
        return fail(
            "on GPUs the thread that called backward() runs no node: it waits while each GPU's engine thread "
            "runs the nodes whose gradients are on its GPU, so give the caller 0.",
            "caller",
        )
    busy = [k for k in gpu_keys if counts[k]]
    if len(busy) == 1 and sum(counts.values()) == total:
        return fail(
            f"one thread ran all {total} nodes on CPU slots only. On GPUs each GPU's engine thread runs the nodes "
            "whose gradients are on its GPU, so share them out by GPU.",
            "one thread",
        )
    first_try = not _failures[name]  # a first wrong try gets the idea; the counts come from the second
    if len(set(counts[k] for k in gpu_keys)) == 1 and counts["cuda:0"] not in (truth["cuda:0"], per_replica):
        idea = "the engine does not share nodes out evenly: a node goes to the thread of its gradient's GPU"
        return fail(
            idea + (": which GPU holds each part of the step?" if first_try else
                    f", so each GPU gets its replica's {per_replica} and cuda:0 more."),
            "even split",
        )  # fmt: skip
    off = [k for k in gpu_keys[1:] if counts[k] != truth.get(k, 0)]
    if off:
        return fail(
            f"{off[0]}'s thread runs only the nodes whose gradients are on {off[0]}: which part of the step "
            "is that, and how many nodes does it make for this model?"
            if first_try
            else f"{off[0]}'s thread runs replica {off[0][-1]}'s nodes only, {per_replica} of them: set "
            f"{off[0]} to {truth.get(off[0], 0)}.",
            "replica",
        )
    zero = counts["cuda:0"]
    for wrong, problem, change in (
        (
            per_replica,
            "cuda:0 replica only",
            f"cuda:0 also runs the loss and gather ({top}) and the sum onto the model ({shared})",
        ),
        (
            per_replica + top,
            "no sum",
            f"cuda:0 also runs the sum onto the model ({shared} nodes): the model lives on GPU 0",
        ),
        (
            per_replica + shared,
            "no loss",
            f"cuda:0 also runs the loss and gather ({top} nodes): the output is gathered onto GPU 0",
        ),
    ):
        if zero == wrong:
            if first_try:  # the idea, not the count
                change = (
                    f"cuda:0's thread runs more than its replica's {per_replica} nodes: which GPU holds the "
                    "loss, the gathered output and the model, and so the gradients of their nodes?"
                )
            return fail(change + ("" if change.endswith("?") else "."), problem)
    return fail(
        f"cuda:0: {zero} is too {'many' if zero > truth['cuda:0'] else 'few'}: add up the parts whose gradients "
        "are on GPU 0.",
        "other",
    )


# ---------------------------------------------------------------- chapter 10 · the C++ original


def _fix_lines() -> tuple[int, int]:
    """The numbers of the parameters' and the buffers' ``FIX (#20910)`` lines of ``dp_original.cpp``."""
    from .. import cpp

    parameters, buffers = [
        n for n, text in enumerate(cpp.SOURCE.read_text().splitlines(), 1) if "FIX (#20910)" in text
    ]
    return parameters, buffers


def _no_step(name: str) -> Verdict:
    """The C++ module did not load, so the chapter made no step: say so, at no cost of a hint."""
    return Verdict(
        False,
        f"Not yet: {name} is None because the C++ module is not loaded (the cell that ran cpp.load() "
        "printed why), so there is no C++ step to check your answer against.",
        "no module",
    )


def _ch10_unready(ext, needs_module: bool = True, **counts: object) -> Verdict | None:
    """Why a chapter-10 check cannot judge yet, or None: an answer still ``...``, one that is not a whole
    number, or, where ``needs_module``, no C++ module (``ext`` is None) to take the step with. ``counts``: the
    answers by name."""
    names = " and ".join(f"`{n}`" for n in counts)
    if _unset(*counts.values()):
        return Verdict(
            False, f"Set {names} to {'numbers' if len(counts) > 1 else 'a number'}, then run this cell again."
        )
    malformed = _malformed(
        *((not _count(v), f"`{n}` is a whole number such as 2 (got {v!r})") for n, v in counts.items())
    )
    return malformed or (_no_step("ext") if ext is None and needs_module else None)


def _ch10_step(step_fn, model, x, slots, ext):
    """One C++ step of ``model`` on ``slots`` with ``ext``; the learner's random state is left as it was."""
    with torch.random.fork_rng(devices=[]):
        return step_fn(model, x, slots, extension=ext)


def _changed(*fields: tuple[str, bool]) -> str:
    return " and ".join(f"`{name}`" for name, bad in fields if bad)


_PYTHON_TWIN = (
    '\n(No C++ module is loaded, so this check ran Python\'s strategy="rewire" (chapter 03) instead: it also '
    "gives every replica's copy of a parameter an edge into one ReduceAdd node per parameter, which leads to "
    "the original's AccumulateGrad.)"
)


def _former_parameters(replicas) -> list[dict[str, torch.Tensor]]:
    """Each ``strategy="rewire"`` replica's copies of the parameters, by dotted name, as
    ``cpp.Step.replica_params`` lists them (a rewired replica keeps them in ``_former_parameters``)."""
    return [
        {
            f"{prefix}.{key}" if prefix else key: tensor
            for prefix, module in replica.named_modules()
            for key, tensor in (getattr(module, "_former_parameters", None) or {}).items()
        }
        for replica in replicas
    ]


def _ch10_python_rewire(model, slots):
    """Without the C++ module: a copy of ``model`` and its ``strategy="rewire"`` replicas on ``slots``, each
    replica's copies of the parameters listed by name (:func:`_former_parameters`)."""
    import copy

    from ..replicate import replicate

    original = copy.deepcopy(model)
    replicas = replicate(original, slots, strategy="rewire")
    return original, replicas, _former_parameters(replicas)


def _with_note(verdict: Verdict, note: str) -> Verdict:
    return Verdict(verdict.ok, verdict.message + note, verdict.problem) if note else verdict


_PYTHON_STEPS = (
    '\n(No C++ module is loaded, so this check ran one Python step under strategy="rewire" (chapter 03) and '
    'one under strategy="clone" (chapter 01) instead: they leave the same leaves as cpp.rewire_step and '
    "cpp.clone_step, so the counts are the same. To count on the C++ steps, install a C++ compiler (g++ or "
    "clang) and ninja as the cpp.load() cell said, restart the kernel and run the chapter again.)"
)


def _ch10_python_steps(model, x, slots) -> list:
    """Without the C++ module: one Python step (``data_parallel.step``, the C++ step's loss
    ``mean(output ** 2)``) of a copy of ``model`` under ``"rewire"``, then one under ``"clone"``, on
    ``slots``; each listed as a ``cpp.Step`` lists its tensors (``.params``, ``.replica_params``), for
    the learner's ``holding_a_grad``."""
    import copy
    from types import SimpleNamespace

    from ..data_parallel import step

    steps = []
    for strategy in ("rewire", "clone"):
        original = copy.deepcopy(model)
        with torch.random.fork_rng(devices=[]):
            replicas = step(original, x, slots, strategy=strategy).replicas
        copies = (
            _former_parameters(replicas)
            if strategy == "rewire"
            else [dict(r.named_parameters()) for r in replicas]
        )
        steps.append(SimpleNamespace(params=dict(original.named_parameters()), replica_params=copies))
    return steps


def reduce_add_inputs(reduce_adds, inputs_each, model, x, slots, ext) -> Verdict:
    """Exercise 1: the fixed step of a model the chapter has not run (two ``Linear`` layers) on ``slots``.
    ``reduce_adds``: how many ``ReduceAdd`` nodes it makes; ``inputs_each``: how many gradients each one
    sums. The check runs ``cpp.rewire_step(model, x, slots)`` with ``ext`` and reads the truth from the
    replicas' tensors: their distinct ``grad_fn`` objects, and how many copies share each. Without the
    module (``ext`` None) it reads them from Python's ``strategy="rewire"`` replicas, and says so."""
    from collections import Counter

    from .. import cpp

    name = "ch10.reduce_add_inputs"
    if unready := _ch10_unready(ext, needs_module=False, reduce_adds=reduce_adds, inputs_each=inputs_each):
        return unready  # a missing or malformed answer; no module is fine: Python's twin answers then
    if ext is not None:
        step = _ch10_step(cpp.rewire_step, model, x, slots, ext)
        params, replica_params, note = step.params, step.replica_params, ""
    else:  # the same graph from Python: one ReduceAdd per parameter, one input per replica's copy
        original, _, replica_params = _ch10_python_rewire(model, slots)
        params, note = dict(original.named_parameters()), _PYTHON_TWIN
    # the nodes kept in a list while counted: a freed grad_fn wrapper's id can be reused by the next one
    fns = [p.grad_fn for r in replica_params for p in r.values() if p.grad_fn is not None]
    copies = Counter(id(fn) for fn in fns)
    nodes, each = len(copies), max(copies.values(), default=0)
    parameters, replicas = len(params), len(replica_params)
    layers = len({key.rsplit(".", 1)[0] for key in params})
    answer = (
        f"reduce_adds = {nodes}, inputs_each = {each}: replicate_grad_edges makes one ReduceAdd per parameter "
        f"of the module it is given, then calls itself on each child, so the {layers} layers' {parameters} "
        f"parameters get one each; every one of the {replicas} replicas' copies of a parameter is one input of "
        "that parameter's node."
    )
    hints = [
        "replicate_grad_edges makes one ReduceAdd for each parameter of the module it is given, then does the "
        "same for each of its children; the replicas share those nodes.",
        f"Count the parameters of both Linear layers, weights and biases. A node gets one input from each "
        f"replica's copy of its parameter, and this step has {replicas} replicas.",
    ]
    wrong, problem = [], ""
    said_nodes, said_each = int(reduce_adds), int(inputs_each)
    if said_nodes != nodes:
        if said_nodes == parameters * replicas:
            wrong.append(
                f"{said_nodes} is one node per copy; the replicas' copies of a parameter share one ReduceAdd, "
                "made before the loop over the replicas"
            )
            problem = "per copy"
        elif said_nodes == layers:
            wrong.append(
                f"{said_nodes} is one node per layer, but weight and bias each get a ReduceAdd of their own"
            )
            problem = "per layer"
        elif said_nodes == parameters // layers:
            wrong.append(
                f"{said_nodes} counts one layer's parameters: replicate_grad_edges also calls itself on each "
                "child, so the other layer's get nodes too"
            )
            problem = "children"
        elif said_nodes == replicas:
            wrong.append(f"{said_nodes} is one node per replica; there is one per parameter of the original")
            problem = "per replica"
        else:
            wrong.append(
                f"you said {said_nodes} nodes: count one per parameter of the original, in every layer"
            )
            problem = "nodes"
    if said_each != each:
        if said_each == 1:
            wrong.append(
                "1 is a node's way out, its one next edge (to the original parameter's AccumulateGrad), not its "
                "ways in"
            )
        elif said_each == 2 and replicas != 2:
            wrong.append(f"2 was the chapter's slot count; this step runs on {replicas} slots")
        else:
            wrong.append(f"you said {said_each} gradients each: count the copies of one parameter")
        problem = problem or "inputs"
    if wrong:
        changed = _changed(("reduce_adds", said_nodes != nodes), ("inputs_each", said_each != each))
        return _with_note(
            _not_yet(name, "; ".join(wrong) + f". Change {changed}.", hints, answer, problem), note
        )
    return _with_note(
        _correct(
            name,
            f"{nodes} ReduceAdd nodes, one per parameter of both layers, each summing {each} gradients, one per "
            "replica: replicate_grad_edges walks the whole module tree, so every layer's parameters get a node.",
        ),
        note,
    )


def _holding_a_grad(step) -> int:
    """How many of a step's tensors, the original's and every replica's, hold a ``.grad``."""
    tensors = [*step.params.values(), *(p for r in step.replica_params for p in r.values())]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # reading .grad of a non-leaf warns; autograd left it None
        return sum(t.grad is not None for t in tensors)


def _counted(count, step) -> object:
    """What the learner's ``count`` says of one step; reading a non-leaf's ``.grad`` warns, so quietly."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return count(step)


def grads_filled(with_fix, without_fix, count, model, x, slots, ext) -> Verdict:
    """Exercise 2: predict, then count. ``with_fix`` and ``without_fix`` are the learner's predictions: how
    many tensors (the original's and every replica's) hold a ``.grad`` after one step of ``model`` on
    ``slots``, with the fix (``cpp.rewire_step``) and without it (``cpp.clone_step``). ``count`` is the
    learner's ``holding_a_grad(step)``, which counts them in one step. The check runs both steps with
    ``ext``, checks ``count`` against its own count, then the predictions against the counts."""
    from .. import cpp

    name = "ch10.grads_filled"
    if unready := _ch10_unready(ext, needs_module=False, with_fix=with_fix, without_fix=without_fix):
        return unready  # a missing or malformed answer; no module is fine: Python's two steps answer then
    if not callable(count):
        return Verdict(
            False,
            f"Not yet: `holding_a_grad` is {count!r}, not a function: run the cell that defines it, then "
            "this one.",
            "no count",
        )
    if ext is not None:
        fixed = _ch10_step(cpp.rewire_step, model, x, slots, ext)
        cloned = _ch10_step(cpp.clone_step, model, x, slots, ext)
        note = ""
    else:  # the same leaves from Python: "rewire" for the fixed step, "clone" for the one without
        (fixed, cloned), note = _ch10_python_steps(model, x, slots), _PYTHON_STEPS
    truth_with, truth_without = _holding_a_grad(fixed), _holding_a_grad(cloned)
    parameters, replicas = len(fixed.params), len(fixed.replica_params)
    try:
        counted = [_counted(count, fixed), _counted(count, cloned)]
    except Exception as err:  # the learner's function failed on a step: say where, at no cost of a hint
        said = str(err).splitlines()[0] if str(err) else ""
        return Verdict(
            False,
            f"Not yet: holding_a_grad(step) raised {type(err).__name__}: {said}. It gets one cpp.Step; "
            "count among its `tensors` list, then run this check again.",
            "count raised",
        )
    if any(c is ... for c in counted):
        return Verdict(
            False,
            "Not yet: your predictions are in; now replace the `return ...` in holding_a_grad with the count, "
            "run that cell, then this one.",
            "count unset",
        )
    if counted != [truth_with, truth_without]:
        return _with_note(
            _not_yet(
                name + ".count",
                f"holding_a_grad returned {counted[0]!r} for the fixed step and {counted[1]!r} for the cloned one, "
                "and at least one of them is not the number of its `tensors` whose .grad is set. Change its "
                "`return` line: count the tensors whose .grad is not None.",
                [
                    "A tensor holds a .grad when its .grad is not None; look at each tensor of the list, not at "
                    "the list or at the gradients' values.",
                    "The count is a sum over the tensors of a yes or no: one for each whose .grad is set.",
                ],
                "return sum(t.grad is not None for t in tensors)",
                "count",
            ),
            note,
        )
    _failures.pop(name + ".count", None)
    answer = (
        f"with_fix = {truth_with}, without_fix = {truth_without}: autograd writes a .grad only into a leaf. With "
        "the fix, set_history gave every replica copy a grad_fn, so only the original's "
        f"{parameters} parameters are leaves; without it, each of the {replicas} replicas' {parameters} "
        "parameters is a fresh leaf that keeps its own gradient, and nothing reaches the original."
    )
    hints = [
        "Autograd writes a .grad only into a leaf, through the leaf's AccumulateGrad node.",
        "With the fix, which tensors are still leaves once set_history has run? Without it, which leaves does "
        "each replica's gradient reach?",
    ]
    said_with, said_without = int(with_fix), int(without_fix)
    wrong, problem = [], ""
    if said_with != truth_with:
        counted_with = f"you predicted {said_with} with the fix and your count says {truth_with}: "
        if said_with == parameters * (replicas + 1):
            wrong.append(
                counted_with + "the replicas' copies hold no .grad, because set_history made them non-leaves "
                "and their gradients go on into ReduceAdd"
            )
            problem = "replicas fill"
        elif said_with == parameters * replicas:
            wrong.append(
                counted_with + f"{said_with} is the replicas' copies, but with the fix they are not leaves"
            )
            problem = "replicas fill"
        else:
            wrong.append(counted_with + "count the leaves that backward reaches")
            problem = "with"
    if said_without != truth_without:
        counted_without = (
            f"you predicted {said_without} without the fix and your count says {truth_without}: "
        )
        if said_without in (parameters, parameters * (replicas + 1)):
            wrong.append(
                counted_without
                + "nothing reaches the original, because clone() made every replica parameter "
                "a fresh leaf with no edge back, so the original's .grad stays None"
            )
            problem = problem or "original under clone"
        elif said_without == replicas:
            wrong.append(
                counted_without + f"each replica holds {parameters} parameters, each a leaf of its own"
            )
            problem = problem or "without"
        else:
            wrong.append(counted_without + "count each replica's leaf parameters")
            problem = problem or "without"
    if wrong:
        changed = _changed(
            ("with_fix", said_with != truth_with), ("without_fix", said_without != truth_without)
        )
        return _with_note(
            _not_yet(
                name, "; ".join(wrong) + f". Change {changed} once you can say why.", hints, answer, problem
            ),
            note,
        )
    return _with_note(
        _correct(
            name,
            f"You predicted {truth_with} with the fix, the original's parameters alone, and {truth_without} "
            "without it, the replicas' alone, and your count agrees. A rewired replica copy is not a leaf, so "
            "autograd fills no .grad there: its gradient goes into ReduceAdd and on to the original's.",
        ),
        note,
    )


def dead_ends_are_back(my_dp, deleted_line, graph, predicted_dead_ends) -> Verdict:
    """Exercise 3: with the parameters' ``set_history`` line deleted, every replica parameter is a dead end again.

    ``my_dp`` is the module compiled from ``cpp.source_without(deleted_line)``; ``graph`` is
    ``dpteach.autograd_graph`` of a ``cpp.rewire_step(..., extension=my_dp)``; ``predicted_dead_ends``
    is the learner's count, made before the run. Correct only when the line deleted is the one that
    rewires the parameters, ``my_dp`` was compiled without it, the graph shows the dead ends, and the
    prediction is their number."""
    from torch import nn

    from .. import cpp

    name = "ch10.dead_ends_are_back"
    if _unset(deleted_line, predicted_dead_ends):
        return Verdict(
            False,
            "Not yet: fill in predicted_dead_ends (a number) and deleted_line (the number or text of the line you delete) "
            "in step 1, then run steps 2 and 3.",
        )
    if not _count(predicted_dead_ends):
        return Verdict(
            False,
            f"Not yet: predicted_dead_ends is a count of replica parameters, a whole number such as 3; "
            f"got {predicted_dead_ends!r}.",
        )
    parameters_line, buffers_line = _fix_lines()
    lines = cpp.SOURCE.read_text().splitlines()

    def answer() -> str:
        slots = (
            len({p.slot for p in graph.replica_params}) if graph is not None and graph.replica_params else 2
        )
        per_replica = len(graph.originals) if graph is not None and graph.originals else 2
        return (
            f"deleted_line = {lines[parameters_line - 1].strip()!r} (line {parameters_line}, in the loop over "
            f"named_parameters), and predicted_dead_ends = {slots * per_replica}: {slots} replicas, each with its "
            f"own copy of the original's {per_replica} parameters, none of which leads back."
        )

    hints = [
        "The fix gives each replica parameter its gradient edge with one call, autograd::set_history.",
        "In the chapter's listing of replicate_grad_edges, the parameters' one is in the loop over "
        "named_parameters. For the count: each replica holds its own copy of every parameter.",
    ]

    def fail(change: str) -> Verdict:
        return _not_yet(name, change, hints, answer)

    if deleted_line is None or (isinstance(deleted_line, str) and not deleted_line.strip()):
        return fail(
            "nothing was deleted: set deleted_line to the number or text of the line you delete, run step 2 to compile "
            "the file without it, then this cell."
        )
    try:
        number = cpp.find_line(deleted_line)
    except ValueError as err:
        return Verdict(False, f"Not yet: {err}\nChange deleted_line in step 1, then run steps 2 and 3 again.")
    if my_dp is None:
        return Verdict(
            False,
            "Not yet: my_dp is None, so step 2 compiled nothing: run step 2 after step 1 (it needs a C++ "
            "compiler), then this cell.",
        )
    module_name = str(getattr(my_dp, "__name__", ""))
    whole = cpp.extension_name()
    if re.fullmatch(rf"{whole}(_v\d+)?", module_name):
        return fail(
            "my_dp is the chapter's own module, compiled from the whole file, so nothing was deleted: compile "
            "broken = cpp.source_without(deleted_line) in step 2, under its own name (cpp.extension_name(broken))."
        )
    expected = cpp.extension_name(cpp.source_without(deleted_line))
    if module_name.startswith("dpteach_cpp_") and not re.fullmatch(rf"{expected}(_v\d+)?", module_name):
        return fail(
            "my_dp was compiled from another source than the file without deleted_line (did you change "
            "deleted_line after step 2?): run step 2 again, then this cell."
        )
    deleted = f"line {number} ({lines[number - 1].strip()})"
    instead = (
        "Delete the set_history line in the loop over named_parameters instead (marked FIX (#20910)), "
        "compile again (step 2), then run this cell."
    )
    try:  # what my_dp does, whatever the graph shows; the learner's random state is left as it was
        with torch.random.fork_rng(devices=[]):
            probe = cpp.rewire_step(nn.Linear(3, 2), torch.randn(4, 3), ("cpu", "cpu"), extension=my_dp)
    except Exception as err:  # a module that is not dp_original.cpp's, or a deletion that breaks the step
        failed = f"{type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}"
        if number not in (parameters_line, buffers_line):
            return fail(
                f"my_dp cannot run a step ({failed}): deleting {deleted} breaks the step itself. {instead}"
            )
        return fail(
            f"my_dp could not run a step ({failed}): compile cpp.source_without(deleted_line) in step 2, "
            "then run this cell again."
        )
    if graph is None or not graph.replica_params:
        return fail(
            "the graph has no replica parameters: draw a step run with my_dp, broken_step = "
            "cpp.rewire_step(model, x, devices, extension=my_dp), then original, replicas = broken_step.modules() "
            "and dpteach.autograd_graph(broken_step.output, module=original, replicas=replicas)."
        )
    my_dp_strands = all(g is None for g in probe.grads.values())
    dead, replica_params = len(graph.dead_ends), len(graph.replica_params)
    all_dead = dead == replica_params and len(graph.unreached) == len(graph.originals)
    if number == buffers_line:
        return fail(
            "you deleted the buffers' set_history line: a Linear has no buffers, so that loop never runs and "
            f"nothing changed. {instead}"
        )
    if number != parameters_line:
        if dead:
            why = (
                f"the dead ends are back, but through {deleted}, not through the line that gives each replica "
                "parameter its gradient edge. "
            )
        else:
            why = (
                f"no dead ends: {deleted} does not rewire the parameters, so every replica parameter still "
                "leads to the original. "
            )
        return fail(why + instead)
    if not all_dead:
        if my_dp_strands:
            return fail(
                f"my_dp leaves every replica parameter a dead end, but your graph shows {dead} of "
                f"{replica_params}: draw the graph of a step run with extension=my_dp."
            )
        return fail("my_dp still rewires, so it was not compiled without deleted_line: run step 2 again.")
    if int(predicted_dead_ends) != dead:
        counting = [  # a ladder of its own: the line is right by now, only the count is wrong
            "A dead end is a replica parameter whose path stops at its own AccumulateGrad: in the graph, the "
            "red boxes (graph.dead_ends lists them).",
            "Each replica holds its own copy of every parameter of the model, and with the line deleted none "
            "of those copies leads back: replicas × parameters per replica.",
        ]
        return _not_yet(
            name + ".count",
            f"you predicted {int(predicted_dead_ends)} dead ends and the graph has {dead}. Change "
            "predicted_dead_ends once you can say why: count the replicas, and each one's copies of the "
            "parameters, and ask which copies still lead back.",
            counting,
            answer,
        )
    _failures.pop(name + ".count", None)
    return _correct(
        name,
        f"You deleted the parameters' set_history line, and all {dead} replica parameters are dead ends "
        "again, as you predicted: the original's .grad stays None. clone() without the edge is issue #19540.",
    )


def second_step_grad(times, model, x, devices, ext) -> Verdict:
    """Exercise 4: after a fixed step, run its replicas' forward and backward again from Python, with no
    ``zero_grad`` between: the original's weight ``.grad`` is how many times the first step's (``times``)?
    The check takes both steps itself, on a fresh ``cpp.rewire_step`` with ``ext``, so a rerun never adds a
    third; without the module (``ext`` None), on fresh Python ``strategy="rewire"`` replicas, and says so."""
    from .. import cpp
    from ..data_parallel import mean_square

    name = "ch10.second_step_grad"
    if unready := _ch10_unready(ext, needs_module=False, times=times):
        return unready  # a missing or malformed answer; no module is fine: Python's twin answers then
    chunks = x.chunk(len(devices))  # the replicas' own chunks, as the C++ step() cut them
    if ext is not None:
        with torch.random.fork_rng(devices=[]):
            step = cpp.rewire_step(model, x, devices, extension=ext)
        first, note = step.grads["weight"].clone(), ""
        replicas = zip(chunks, step.replica_params, devices)
        out = torch.cat(
            [
                torch.nn.functional.linear(c.to(d), r["weight"], r["bias"]).to(devices[0])
                for c, r, d in replicas
            ]
        )
        mean_square(out).backward()  # the C++ step's loss, through the same ReduceAdd nodes
        after = step.params["weight"].grad
    else:  # the same two backwards through Python's rewired replicas, each after its own forward

        def loss(replicas) -> torch.Tensor:
            parts = [r(c.to(d)).to(devices[0]) for r, c, d in zip(replicas, chunks, devices)]
            return mean_square(torch.cat(parts))

        original, replicas, _ = _ch10_python_rewire(model, devices)
        loss(replicas).backward()
        first, note = original.weight.grad.clone(), _PYTHON_TWIN
        loss(replicas).backward()  # no zero_grad(), no new replicas: through the same ReduceAdd nodes
        after = original.weight.grad
    truth = round(float((after * first).sum() / (first * first).sum()))  # after is a whole multiple of first
    n = len(devices)
    answer = (
        f"times = {truth}: the copies keep ReduceAdd as their grad_fn, so the second backward runs through the "
        "same nodes; each time ReduceAdd hands the original's AccumulateGrad one device's worth, and "
        "AccumulateGrad adds it to the .grad already there."
    )
    hints = [
        "Two questions: does the second backward still reach the original, and what does the original's "
        "AccumulateGrad do with a .grad that is already there?",
        f"One backward gives the original one sum of the {n} replicas' gradients. Nothing zeroes .grad between "
        "the two backwards: count the sums.",
    ]
    slips = {
        1: ("the second backward's sum is added to the .grad the first left, not written over it: that is why "
            "training loops call zero_grad()", "replaced"),
        0: ("the replicas' copies keep ReduceAdd as their grad_fn after the first backward, so the second "
            "still reaches the original", "edge gone"),
        2 * n: (f"ReduceAdd already sums the {n} replicas within one step, and the first step's .grad was that "
                "sum: count backwards, not replicas times backwards", "replicas times steps"),
    }  # fmt: skip
    if int(times) != truth:
        said, problem = slips.get(int(times), (f"you said {int(times)}", "times"))
        return _with_note(_not_yet(name, f"{said}. Change `times`.", hints, answer, problem), note)
    return _with_note(
        _correct(
            name,
            f"After the second backward the original's weight .grad is {truth} times the first step's. ReduceAdd "
            "is an ordinary node that outlives a backward, and the original's AccumulateGrad accumulates, as any "
            "leaf's does: zero_grad() between steps is as needed in C++ as in Python.",
        ),
        note,
    )


# ---------------------------------------------------------------- chapter 12 · the lab


def one_slot_step(
    learned: bool | object, is_model: bool | object, model: torch.nn.Module, replica
) -> Verdict:
    """Exercise 1: after one ``DataParallel`` step on one device under ``"clone"``, did the gradient reach
    ``model`` (``learned``), and is ``replica``, what ``replicate`` returns for that one device, the model
    itself (``is_model``)?"""
    name = "ch12.one_slot"
    if _unset(learned, is_model):
        return Verdict(False, "Set `learned` and `is_model` to True or False, then run the cell again.")
    if malformed := _malformed(
        (not isinstance(learned, bool), f"`learned` is True or False, no quotes (got {learned!r})"),
        (not isinstance(is_model, bool), f"`is_model` is True or False, no quotes (got {is_model!r})"),
    ):
        return malformed
    grads = [p.grad for p in model.parameters()]
    reached = all(g is not None for g in grads)
    hints = [  # the idea first; which answer is wrong, and why, only from the second try
        "DataParallel's job is a step; replicate's job is copies. With one device, does a step need a copy?",
        "Read DataParallel.forward's branch `if len(self.device_ids) == 1` (torch/nn/parallel/data_parallel.py; "
        "dpteach's four_moves does the same), then what replicate returns for one device.",
    ]
    answer = f"learned = {reached}, is_model = {replica is model}."
    wrong = [
        n for n, bad in (("learned", learned != reached), ("is_model", is_model != (replica is model))) if bad
    ]
    if wrong and not _failures.get(name):  # two booleans: naming the wrong one would give its answer away
        return _not_yet(
            name,
            "`learned` or `is_model` (or both) is not what this step did. To see which, print "
            "model[0].weight.grad after the backward, and `replica is model`, then change that prediction.",
            hints,
            answer,
            wrong[0],
        )
    if learned != reached:
        seen = (
            f"after the backward, model[0].weight.grad is a tensor of norm {grads[0].norm():.3g}: the "
            "gradient reached the model"
            if reached
            else "after the backward, model[0].weight.grad is None: the gradient never reached the model"
        )
        return _not_yet(name, f"{seen}. Change `learned`.", hints, answer, "learned")
    if is_model != (replica is model):
        seen = (
            "`replica is model` is False: replicate made a new module, whose parameters are clones, "
            "leaves of their own"
            if replica is not model
            else "`replica is model` is True: replicate handed back the model itself"
        )
        return _not_yet(name, f"{seen}. Change `is_model`.", hints, answer, "is_model")
    return _correct(
        name,
        "With one device DataParallel.forward calls the module itself, so the gradient lands in the model. "
        "replicate still clones it, and the clone's leaves are the stepper's dead ends. C++'s data_parallel "
        "takes the same shortcut, so a training run of it on one GPU could never have caught the 2019 bug.",
    )


def _grad_read(err: BaseException | None, answer: object, caught: list) -> tuple[str, str] | None:
    """What went wrong reading the gradients in Exercise 2, as (what to change, problem); None if nothing did."""
    # PyTorch's warning on reading a non-leaf's .grad ("... a Tensor that is not a leaf Tensor ...")
    non_leaf = [w for w in caught if "not a leaf" in str(w.message)]
    if isinstance(err, AttributeError) and "'Sequential' object" in str(err):
        return (
            f"{err}: a replica is a whole copy of the model, an nn.Sequential. Pick the layer first, "
            "clone.replicas[i][0].weight.grad, as you write model[0].weight for the model.",
            "index the layer",
        )
    if isinstance(err, AttributeError) and "'list' object" in str(err):
        return (
            f"{err}: clone.replicas is a list, one replica per slot. Index it first: clone.replicas[i].",
            "index the replica",
        )
    nones = err is not None and "NoneType" in str(err)
    nones = nones or (isinstance(answer, tuple) and any(a is None for a in answer))
    if nones and non_leaf:
        first = str(non_leaf[0].message).split(". ")[0]
        return (
            f"you read the .grad of a tensor that is not a leaf (PyTorch warned: {first}.). Under "
            '"rewire" a replica\'s weight is an output of ReduceAdd, not a leaf, and backward writes .grad only '
            "into leaves (through their AccumulateGrad), so it stays None. The replicas' own gradients are "
            "clone.replicas'; under \"rewire\" their sum is in the original's .grad, rewire.model[0].weight.grad "
            "(.retain_grad() on a replica's tensor before backward() would keep its gradient too).",
            "non-leaf grad",
        )
    if err is not None and "same device" in str(err):  # slots on several GPUs: each replica on its own
        return (
            f"{err}: each replica's gradient lies on its replica's device. Move each onto the original's "
            "before adding: .to(rewire.model[0].weight.device).",
            "devices",
        )
    if nones:
        return (
            'a .grad you read is None. Under "clone" the original never gets one (issue #19540): take the '
            "replicas' own from clone.replicas, and the original's from rewire.model.",
            "a grad is None",
        )
    if err is not None:
        return f"compare raised {type(err).__name__}: {err}. Change the line that raised it.", "raised"
    return None


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors are one, or views of one tensor's memory (same device and data pointer)."""
    return a.device == b.device and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def clone_grads_add_up(compare: Callable | object, clone, rewire) -> Verdict:
    """Exercise 2: ``compare(clone, rewire)`` returns (the sum of the ``"clone"`` replicas' 0.weight
    gradients, the ``"rewire"`` original's 0.weight gradient); the two must be equal."""
    name = "ch12.clone_grads_add_up"
    if _unset(compare) or not callable(compare):
        return Verdict(False, "Define compare(clone, rewire) first, then run this cell again.")
    answer, err = None, None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            answer = compare(clone, rewire)
        except Exception as e:  # the learner's code: say what it raised, never raise
            err = e
    if isinstance(answer, tuple) and _unset(*answer):
        return Verdict(False, "Fill in `summed` and `original` in compare, then run this cell again.")
    hints = [
        "Under \"clone\" each replica's copy of 0.weight is a leaf of its own: its .grad holds that replica's "
        'share. Under "rewire" the sum reaches the original.',
        "clone.replicas is a list of nn.Sequential, one per slot; the original is rewire.model.",
    ]
    answer_text = (
        "summed = sum(r[0].weight.grad.to(device) for r in clone.replicas), with the stub's "
        "device = rewire.model[0].weight.device; original = rewire.model[0].weight.grad."
    )
    found = _grad_read(err, answer, caught)
    if found:
        return _not_yet(name, found[0], hints, answer_text, found[1])
    two = isinstance(answer, tuple) and len(answer) == 2
    if not (two and all(isinstance(a, torch.Tensor) for a in answer)):  # type: ignore[union-attr]
        return Verdict(
            False,
            "compare must return two tensors: set summed and original to tensors and keep "
            "`return summed, original`.",
            "not two tensors",
        )
    reference = rewire.model[0].weight.grad
    summed, original = (a.to(reference.device) for a in answer)  # type: ignore[union-attr]
    grads = [r[0].weight.grad.to(reference.device) for r in clone.replicas]
    truth = sum(grads)
    if summed.shape != truth.shape or original.shape != reference.shape:
        return _not_yet(
            name,
            f"summed is {tuple(summed.shape)} and original {tuple(original.shape)}; 0.weight's gradient is "
            f"{tuple(truth.shape)}. Read 0.weight, the first Linear's weight, in both.",
            hints,
            answer_text,
            "wrong tensor",
        )
    if not torch.allclose(original, reference):
        change, problem = (
            "original is not the gradient of rewire's original 0.weight: read the .grad of 0.weight in "
            "rewire.model, the original model (not a replica).",
            "wrong original",
        )
    elif torch.allclose(summed, truth / len(grads)):
        change, problem = "summed is the replicas' mean: add their gradients up, do not divide.", "averaged"
    elif any(torch.allclose(summed, g) for g in grads):
        change, problem = "summed is one replica's gradient: add up every replica's.", "one replica"
    elif not torch.allclose(summed, truth):
        change, problem = (
            "summed is not the replicas' 0.weight gradients added up: take 0.weight's .grad from every "
            "replica in clone.replicas and add them.",
            "wrong sum",
        )
    elif _same_storage(summed, original):
        change, problem = (
            "summed and original are one tensor, so comparing them proves nothing: set summed from the "
            "\"clone\" replicas' grads and original from rewire's model, each on its own line.",
            "same tensor",
        )
    elif not _same_storage(original, reference):
        change, problem = (
            "original has the right values but is not rewire's original's own gradient: set original to "
            "rewire.model[0].weight.grad itself, not a sum or a copy.",
            "original not read",
        )
    else:
        gap = (summed - original).abs().max().item()
        equal = "Equal, to the last bit" if gap == 0 else f"Equal, up to {gap:.1e} (rounding)"
        return _correct(
            name,
            f"{equal}: the replicas computed every piece of the right gradient. What PR #20910 added "
            "was a ReduceAdd node per parameter that sums the replicas' gradients and whose edge leads to "
            "the original, so backward delivers the sum.",
        )
    return _not_yet(name, change, hints, answer_text, problem)


def _bytes_counted(width: int, slots: int) -> dict:
    """What one step copies at ``width`` on ``slots`` slots, counted as the explorer counts it: model bytes,
    the gather's bytes, and each strategy's bytes (a ``CostLab`` made with ``timed=False``)."""
    from ..widgets.cost import CostLab

    lab = CostLab(width=width, slots=slots, timed=False)
    costs = {c.strategy: c for c in lab.measure()}
    return {
        "lab": lab,
        "model": lab.model_bytes,
        "gather": costs["broadcast"].bytes_by_op.get("gather", 0),
        "broadcast": costs["broadcast"].bytes,
        "clone": costs["clone"].bytes,
        "costs": costs,
    }


# a setting no cell shows, where the same expressions must hold: a number typed in for width 128 on 3 slots
# gives the wrong bytes here
OTHER_SETTING = (40, 5)


def predicted_bytes(predict: Callable | object, lab) -> Verdict:
    """Exercise 3: ``predict(width, slots, gather_bytes)`` returns (one model copy's bytes, one ``"broadcast"``
    step's, one ``"clone"`` step's), written from its arguments; the check counts them with
    ``comm.traffic()`` at ``lab``'s setting (a ``CostLab`` made with ``timed=False``) and at
    ``OTHER_SETTING``, so a number typed in for one setting fails at the other.

    Findings (``Verdict.problem``): ``"model bytes"`` (one copy of the parameters miscounted),
    ``"slot 0"`` (one model copy too many or too few: who gets a copy), ``"gather"`` (the outputs'
    copy left out or counted twice), ``"model copies"`` (any other whole number of model copies off),
    ``"typed in"`` (right at one setting only: a number, not an expression), ``"counts"`` (anything else)."""
    name = "ch12.predicted_bytes"
    if _unset(predict) or not callable(predict):
        return Verdict(False, "Define predict(width, slots, gather_bytes) first, then run this cell again.")
    here = _bytes_counted(lab.width, lab.slots)
    there = _bytes_counted(*OTHER_SETTING)
    hints = [
        "Count per slot: which slots get a copy of the model's parameters, under each strategy? Then add "
        "what gather copies back: the outputs. Write each count from width and slots, not as a number.",
        '"broadcast" hands slot 0 the original parameters themselves; "clone" deep-copies the model for '
        "every slot. A Linear(a, b) holds a·b weights and b biases; the model has three.",
    ]
    answer = (
        "model_bytes = 4 * (width**2 + 5 * width + 1); broadcast_bytes = (slots - 1) * model_bytes + "
        "gather_bytes; clone_bytes = slots * model_bytes + gather_bytes."
    )
    results = {}
    for setting, count in (("here", here), ("there", there)):
        try:
            got = predict(count["lab"].width, count["lab"].slots, count["gather"])
        except Exception as err:  # the learner's code: say what it raised, never raise
            return Verdict(
                False, f"predict raised {type(err).__name__}: {err}. Change the line that raised it."
            )
        if isinstance(got, tuple) and _unset(*got):
            return Verdict(
                False, "Replace each ... in predict with an expression of width, slots and gather_bytes."
            )
        numbers = isinstance(got, tuple) and len(got) == 3
        if not numbers or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in got):
            return Verdict(
                False,
                f"predict must return three numbers of bytes, model_bytes, broadcast_bytes, clone_bytes "
                f"(got {got!r}).",
                "not an answer",
            )
        results[setting] = got
    at = {
        "here": f"width {lab.width} on {lab.slots} slots",
        "there": "width {} on {} slots".format(*OTHER_SETTING),
    }
    for setting, count in (("here", here), ("there", there)):
        model_bytes, broadcast_bytes, clone_bytes = results[setting]
        if model_bytes != count["model"]:
            other = "there" if setting == "here" else "here"
            typed = results[other][0] == (here if other == "here" else there)["model"]
            change = (
                f"`model_bytes` is right at {at[other]} but not at {at[setting]}: it is a number typed in. "
                "Write it from `width`."
                if typed
                else f"`model_bytes` is {model_bytes:,} at {at[setting]}, not one copy of the parameters. "
                "Count each layer's weights and biases from `width`, then 4 bytes each."
            )
            return _not_yet(name, change, hints, answer, "typed in" if typed else "model bytes")
    for setting, count in (("here", here), ("there", there)):
        _, broadcast_bytes, clone_bytes = results[setting]
        for label, guess, strategy in (
            ("broadcast_bytes", broadcast_bytes, "broadcast"),
            ("clone_bytes", clone_bytes, "clone"),
        ):
            off = guess - count[strategy]
            if not off:
                continue
            other = "there" if setting == "here" else "here"
            index = 1 if strategy == "broadcast" else 2
            if results[other][index] == (here if other == "here" else there)[strategy]:
                change, problem = (
                    f"`{label}` is right at {at[other]} but not at {at[setting]}: write it from `slots`, "
                    "`model_bytes` and `gather_bytes`, not as a number.",
                    "typed in",
                )
            elif abs(off) == count["model"]:
                change, problem = (
                    f"`{label}` is one model copy {'over' if off > 0 else 'under'} the count at {at[setting]}. "
                    f'Which slots get a copy under "{strategy}": is slot 0 one of them?',
                    "slot 0",
                )
            elif abs(off) == count["gather"]:
                change, problem = (
                    f"`{label}` {'counts' if off > 0 else 'leaves out'} the gather"
                    f"{' twice' if off > 0 else ''}: it copies the outputs back once, `gather_bytes`.",
                    "gather",
                )
            elif off % count["model"] == 0:
                change, problem = (
                    f"`{label}` is {int(abs(off) // count['model'])} model copies "
                    f"{'over' if off > 0 else 'under'} the count at {at[setting]}: count one copy per slot "
                    "that gets one.",
                    "model copies",
                )
            else:
                change, problem = (
                    f"`{label}` is not a whole number of model copies plus the gather at {at[setting]}. Write "
                    "it from `slots`, `model_bytes` and `gather_bytes`.",
                    "counts",
                )
            ops = count["costs"][strategy]
            if set(ops.bytes_by_op) - {"broadcast", "clone", "gather"}:  # slots on distinct GPUs
                change += (
                    f" These slots do not share one device, so the count has more copies: {ops.by_op()}."
                )
            return _not_yet(name, change, hints, answer, problem)
    return _correct(
        name,
        f'At {at["here"]} and at {at["there"]}, counted: "broadcast" copies the model to every slot after '
        'slot 0, "clone" to every slot; each gathers the outputs once. Backward\'s sums and the scatter copy '
        "nothing here: the slots share one device.",
    )


def _order_cases() -> list[tuple[str, object, bool]]:
    """The backwards exercise 4's rule is checked on, each recorded with a hook on every node
    (``flow.join_order``): (what it is, its JoinOrder, whether the first replica is decided by the numbers).
    The second runs the forwards in an order no cell printed; in the third each replica's forward runs on a
    fresh thread of its own, whose count starts at 0, so the replicas' numbers tie (the heap picks)."""
    from ..widgets.flow import join_order

    return [
        ("three CPU slots, forwards in turn 0, 1, 2", join_order(threaded=False, slots=3), True),
        ("three CPU slots, forwards in turn 1, 2, 0", join_order(False, 3, forward_order=[1, 2, 0]), True),
        ("three slots, a fresh thread per replica's forward", join_order(threaded=True, slots=3), False),
    ]


def summing_order(apply_rule: Callable | object) -> Verdict:
    """Exercise 4: ``apply_rule(sums, replicas)``, from the sequence numbers of one ``"rewire"`` backward's
    ReduceAddBackward nodes (``sums``) and of each replica's own nodes (``replicas[i]``), returns (the
    replica whose nodes run first, whether every ReduceAddBackward runs after the last replica node). The
    check compares it with what three recorded backwards did, so a typed-in pair fails on one of them."""
    name = "ch12.summing_order"
    if _unset(apply_rule) or not callable(apply_rule):
        return Verdict(False, "Define apply_rule(sums, replicas) first, then run this cell again.")
    hints = [  # the rule first; how it reads the numbers only from the second try
        "Of the nodes ready to run, the engine runs the one with the highest sequence number. Which replica "
        "holds the highest numbers? Do the sums' numbers lie above or below every replica node's?",
        "first_replica: the i whose max(replicas[i]) is the largest. sums_last: every sum is outnumbered by "
        "every replica node, so the largest sum is below the smallest replica number.",
    ]
    answer = (
        "first_replica = max(range(len(replicas)), key=lambda i: max(replicas[i])); "
        "sums_last = max(sums) < min(min(r) for r in replicas)."
    )
    for what, order, decided in _order_cases():
        sums, replicas = order.numbers()
        try:
            got = apply_rule(list(sums), [list(r) for r in replicas])
        except Exception as err:  # the learner's code: say what it raised, never raise
            return Verdict(
                False, f"apply_rule raised {type(err).__name__}: {err}. Change the line that raised it."
            )
        if isinstance(got, tuple) and _unset(*got):
            return Verdict(False, "Replace each ... in apply_rule with an expression of sums and replicas.")
        if not (isinstance(got, tuple) and len(got) == 2):
            return Verdict(
                False, f"apply_rule must return (first_replica, sums_last) (got {got!r}).", "not an answer"
            )
        first_replica, sums_last = got
        if malformed := _malformed(
            (
                not _count(first_replica) or not 0 <= first_replica < len(replicas),
                f"`first_replica` is a replica's number, 0 to {len(replicas) - 1} (got {first_replica!r})",
            ),
            (not isinstance(sums_last, bool), f"`sums_last` is True or False (got {sums_last!r})"),
        ):
            return malformed
        last = not order.early
        if decided and first_replica != order.first_replica:
            return _not_yet(
                name,
                f"in the backward of {what}, replica {order.first_replica}'s nodes ran first, not replica "
                f"{first_replica}'s (sums {sums}, replicas {replicas}). Change how `first_replica` reads "
                "the numbers.",
                hints,
                answer,
                "first replica",
            )
        if bool(sums_last) != last:
            ran = "after the last replica node" if last else "while replica nodes were still to run"
            return _not_yet(
                name,
                f"in the backward of {what}, the ReduceAddBackward nodes ran {ran} (sums {sums}, replicas "
                f"{replicas}). Change how `sums_last` reads the numbers.",
                hints,
                answer,
                "sums last",
            )
    return _correct(
        name,
        "Your rule gives what three recorded backwards did. On one thread the replica whose forward ran last "
        "holds the highest numbers and runs first, and the sums, made before any forward, run last. Where "
        "each forward starts a fresh count, the sums outnumber the replicas' nodes and run as soon as their "
        "gradients arrive.",
    )


# the runs exercise 5 measures: section 1a's at lr 0.631, and the same at the explorer's lr 0.2
DRIFT_RUNS = (("section 1a's run, lr 0.631", 10**-0.2), ("calm, lr 0.2", 0.2))


def _gaps(lr: float, steps: int = 10) -> list[float]:
    """The weight gap after each step of a ``"rewire"`` run on two slots against one device."""
    from ..widgets.training import TrainingLab

    lab, gaps = TrainingLab("rewire", slots=2, lr=lr, steps=steps), []
    while not lab.done:
        lab.step()
        gaps.append(lab.weight_gap())
    return gaps


def _mean_factor(gaps) -> float:
    return (gaps[-1] / gaps[0]) ** (1 / (len(gaps) - 1))


def _same_for_any_list(growth: Callable, got: float) -> bool:
    """Whether ``growth`` gives ``got`` for two more lists of other factors too: a number typed in."""
    import math

    try:
        return all(
            math.isclose(growth(g), got, rel_tol=1e-6) for g in ([1.0, 3.0, 9.0], [5.0, 5.0, 5.0, 5.0])
        )
    except Exception:  # the learner's code: a list it cannot take says nothing about literals
        return False


def calm_drift(growth: Callable | object, made_by_lr: bool | object = ...) -> Verdict:
    """Exercise 5: ``growth(gaps)``, the weight gap's mean factor per step from ``gaps[0]`` to ``gaps[-1]``,
    is checked on a made-up list and on the two runs of ``DRIFT_RUNS``; then their evidence is printed and
    ``made_by_lr`` (does the large learning rate make the gap, rather than multiply it?) is judged by it."""
    import math

    name = "ch12.calm_drift"
    if _unset(growth) or not callable(growth):
        return Verdict(False, "Define growth(gaps) first, then run this cell again.")
    hints = [  # the idea on a worked list first; the formula only on later tries
        "A mean factor multiplies: it is the one number that, multiplied in at every step, takes the first "
        "gap to the last. Worked by hand: [1e-8, 2e-8, 4e-8, 8e-8] doubles at each of its 3 steps, so its "
        "factor is 2.",
        "Between k gaps there are k - 1 steps, and their factors multiply to the last gap over the first: "
        "8e-8 / 1e-8 = 8 = 2 * 2 * 2 for the list above.",
        "So the mean factor is the (len(gaps) - 1)-th root of gaps[-1] / gaps[0]: 8 ** (1 / 3) = 2 above.",
    ]
    answer = "return (gaps[-1] / gaps[0]) ** (1 / (len(gaps) - 1)); made_by_lr = False."
    made_up = [1e-8, 2e-8, 4e-8, 8e-8]  # a gap that doubles every step: factor 2
    runs = [(what, _gaps(lr)) for what, lr in DRIFT_RUNS]
    for what, gaps in [("the made-up gaps [1e-8, 2e-8, 4e-8, 8e-8]", made_up), *runs]:
        try:
            got = growth(list(gaps))
        except Exception as err:  # the learner's code: say what it raised, never raise
            return Verdict(
                False, f"growth raised {type(err).__name__}: {err}. Change the line that raised it."
            )
        if _unset(got):
            return Verdict(False, "Replace the ... in growth with an expression of gaps.")
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            return Verdict(
                False, f"growth must return a number, a factor per step (got {got!r}).", "not an answer"
            )
        truth = _mean_factor(gaps)
        if not math.isclose(got, truth, rel_tol=1e-6):
            total = gaps[-1] / gaps[0]
            if math.isclose(got, total, rel_tol=1e-6):
                slip = "that is the growth over all the steps: take the root for one step."
            elif _same_for_any_list(growth, got):
                slip = "growth returns this number whatever the list: compute it from gaps instead."
            else:
                slip = "change growth so that its factor, multiplied in at every step, takes gaps[0] to gaps[-1]."
            return _not_yet(
                name,
                f"for {what}, growth returns {got:.4g}, not the mean factor per step, {truth:.4g}: {slip}",
                hints,
                answer,
                "growth",
            )
    evidence = "; ".join(
        f"{what}: gap {gaps[0]:.1e} after step 1, x{_mean_factor(gaps):.2f} per step from step 1 to step "
        f"{len(gaps)} ({len(gaps) - 1} steps)"
        for what, gaps in runs
    )
    if made_by_lr is ...:
        return Verdict(
            False,
            f"growth is right. The evidence, measured now: {evidence}. Set `made_by_lr` to True or False "
            "from it, then run the cell again.",
        )
    if not isinstance(made_by_lr, bool):
        return Verdict(
            False, f"`made_by_lr` is True or False, no quotes (got {made_by_lr!r}).", "not an answer"
        )
    (_, wild), (_, calm) = runs
    made = not calm[0] > 0  # the gap after step 1 is there at lr 0.2 too: the large lr does not make it
    if made_by_lr != made:
        return _not_yet(
            f"{name}.made_by_lr",
            f"read the evidence: {evidence}. Is there a gap after step 1 at lr 0.2 as well? What differs "
            "between the runs? Change `made_by_lr`.",
            [
                "Compare the two runs' gaps after step 1: is there one at lr 0.2 too?",
                "Both runs have a gap after step 1; what differs by far is the factor per step.",
            ],
            answer,
            "made by lr",
        )
    return _correct(
        name,
        f"{evidence}. Both runs have a gap after step 1: a batch sum split over the slots rounds differently "
        "at any learning rate. The large learning rate multiplies it every step; it does not make it.",
    )


# ---------------------------------------------------------------- chapter 00 · start here, exercise 3

# What each move's backward does, as chapter 00's exercise 3 lists them (the letters of its cell).
# Each says what the backward does to tensors, not which move it belongs to: the learner matches them.
# The letters follow neither the forward order of the moves nor the backward one, so they give nothing away,
# and two of them fit no move under the default strategy: "averages" (the slip of reading DDP's averaged
# gradients, or the mean loss, into replicate's backward) and "passes no gradient back" (true of replicate
# only under "clone", the bug).
BACKWARD_OF_MOVES = {
    "a": "sums several gradients into one",
    "b": "passes no gradient back",
    "c": "cuts one gradient into pieces",
    "d": "runs each replica's backward",
    "e": "averages several gradients into one",
    "f": "joins pieces into one",
}
_MOVE_BACKWARDS = {"gather": "c", "parallel_apply": "d", "replicate": "a", "scatter": "f"}
_DECOYS = ("b", "e")  # the letters that fit no move


def backward_moves(does: Mapping[str, object] | object, devices=("cpu", "cpu")) -> Verdict:
    """Exercise 3: ``does`` maps each move to the letter of what its backward does (``BACKWARD_OF_MOVES``).

    The right answer is confirmed on one step of the course's model with ``x`` requiring grad: under
    ``"broadcast"`` the model's ``.grad`` and ``x.grad`` fill (replicate's and scatter's backward ran),
    under ``"clone"`` the model's ``.grad`` stays ``None`` while ``x.grad`` still fills, and the model's
    ``.grad`` equals one device's: the replicas' gradients summed, not averaged. Findings
    (``Verdict.problem``): ``"letters"`` (not one of a to f), ``"decoy"`` (a letter that fits no move:
    an average, or no gradient at all), ``"gather and scatter"`` /
    ``"replicate and parallel_apply"`` (a pair swapped: the first wrong try says only that two moves
    swapped letters, the second names them), ``"moves"`` (any other wrong letter).
    """
    from ..data_parallel import DataParallel
    from . import story

    name = "ch00.backward_moves"
    moves = tuple(_MOVE_BACKWARDS)
    if _unset(does) or not isinstance(does, Mapping) or _unset(*does.values()):
        return Verdict(False, "Give every move in `does` a letter, a to f, then run again.")
    keys = {_word(k): v for k, v in does.items()}  # "Gather" or " gather" is the same move
    given = {m: _word(keys.get(m, "")) for m in moves}
    odd = [m for m in moves if given[m] not in BACKWARD_OF_MOVES]
    if odd:
        return Verdict(False, f"Give each move one letter, a to f: check {', '.join(odd)}.")
    answer = (
        f"does = {dict(sorted(_MOVE_BACKWARDS.items()))}: backward starts at "
        "the loss, so gather's backward runs first and cuts the output's gradient into one piece per slot; "
        "parallel_apply's runs each replica's backward on its slot; replicate's sums the replicas' gradients of "
        "each parameter into one, the model's .grad (Broadcast's backward is ReduceAddCoalesced, a sum, not an "
        "average); scatter's, if x requires grad, joins the pieces' gradients into one, x.grad (the chapter's "
        "x requires none, so there scatter's backward never runs). Letters b and e fit no move."
    )
    fail = _ladder(
        name,
        [
            "Backward runs the four moves in reverse, and each backward undoes its move: what undoes a join, "
            "a copy, a cut?",
            "Gather is a torch.cat, replicate copies each parameter once per slot, scatter cuts x: what is the "
            "backward of a join, of a tensor used in several places, of a cut?",
        ],
        answer,
    )
    wrong = [m for m in moves if given[m] != _MOVE_BACKWARDS[m]]
    decoyed = [m for m in moves if given[m] in _DECOYS]
    if decoyed:  # a letter that fits no move: say why it does not fit that move, not which letter does
        m = decoyed[0]
        if given[m] == "e" and m == "replicate":
            why = (
                "an average would divide the model's gradient by the number of slots, yet the one-step check "
                "above found one device's gradients on your slots: look again at what happens to the "
                "replicas' gradients of one parameter"
            )
        elif given[m] == "e":
            why = (
                f"{m}'s backward does not combine the gradients of several replicas' copies of one parameter"
            )
        elif m == "replicate":
            why = (
                "under the default, replicate's copies are recorded (replica 0's weight has a BroadcastBackward "
                "in the table above), so gradients do pass back through it; passing none back is 'clone', the bug"
            )
        elif m == "parallel_apply":
            why = (
                "each replica's forward ran in its own thread and autograd recorded it there, so backward goes "
                "back through every replica"
            )
        else:
            why = f"with x requiring grad, autograd records {m}'s work, so gradients pass back through it"
        return fail(f"{why}. Give {m} another letter: ask what {m} did forward, and undo it.", "decoy")
    for one, other in (("gather", "scatter"), ("replicate", "parallel_apply")):
        if (
            set(wrong) >= {one, other}
            and given[one] == _MOVE_BACKWARDS[other]
            and given[other] == _MOVE_BACKWARDS[one]
        ):
            why = (
                "gather joined the outputs, so its backward cuts the gradient per slot; scatter cut x, so its "
                "backward joins the pieces' gradients"
                if one == "gather"
                else "replicate copied each parameter once per slot, so its backward sums the copies' gradients "
                "into one; parallel_apply ran the replicas, so its backward runs each replica's backward"
            )
            if not _failures.get(name):  # a first try gets the idea; naming the pair would be the answer
                return fail(
                    "two moves have each other's letters. For each move ask what it did forward and what "
                    "undoes it, then swap the two letters that do not fit.",
                    f"{one} and {other}",
                )
            return fail(f"you swapped {one} and {other}: {why}. Swap their letters.", f"{one} and {other}")
    if wrong:
        m = wrong[0]
        return fail(
            f"{m}'s backward is not the one that {BACKWARD_OF_MOVES[given[m]]}: ask what {m} did forward, "
            "and undo it.",
            "moves",
        )
    x, y = (t.clone() for t in story.make_data())
    x = x.to(devices[0]).requires_grad_()
    found = {}
    for strategy in ("broadcast", "clone"):
        model = story.make_model().to(devices[0])
        x.grad = None
        loss = torch.nn.functional.mse_loss(
            DataParallel(model, list(devices), strategy=strategy)(x), y.to(x.device)
        )
        loss.backward()
        found[strategy] = (model[0].weight.grad is not None, x.grad is not None)
        if strategy == "broadcast":
            summed = model[0].weight.grad
    reference = story.make_model().to(devices[0])
    torch.nn.functional.mse_loss(reference(x), y.to(x.device)).backward()
    # one device's gradient is the sum of the pieces': an average would be 1/slots of it
    apart = {how: (g - reference[0].weight.grad).abs().max().item() for how, g in
             (("sum", summed), ("average", summed / len(devices)))}  # fmt: skip
    fills = {True: "fills", False: "stays None"}
    (b_model, b_x), (c_model, c_x) = found["broadcast"], found["clone"]
    return _correct(
        name,
        f"This check ran one step with x requiring grad. Under 'broadcast' the model's .grad {fills[b_model]} "
        f"and x.grad {fills[b_x]}; under 'clone' the model's .grad {fills[c_model]} while x.grad "
        f"{fills[c_x]}: every backward ran but replicate's. Under 'broadcast' the model's .grad differs from "
        f"one device's by {apart['sum']:.1e}: a sum of the replicas' gradients (an average would differ by "
        f"{apart['average']:.1e}). Letters b and e fit no move.",
    )


# ---------------------------------------------------------------- chapter 00 · start here, exercise 2


def _lane(node: str) -> int:
    """The slot whose lane holds a node of the four-moves picture: ``piece 1`` is slot 1's; x, the model,
    scatter, replicate, gather and the loss sit with slot 0, on the device that holds the model."""
    last = node.rsplit(" ", 1)[-1]
    return int(last) if last.isdigit() else 0


def moves_between_devices(moves: Sequence[str] | object, slots: int = 2) -> Verdict:
    """Exercise 2: ``moves``, the moves whose arrows in ``story.four_moves_picture()`` carry data from one
    slot's device to another's when every slot is a GPU of its own.

    The truth is read from the picture's own edges (``story.four_moves_lanes``): an arrow crosses when
    its ends sit in different lanes. Findings (``Verdict.problem``): ``"not moves"`` (a name that is no
    move, such as ``"broadcast"``), ``"parallel_apply"`` (named, but its arrows stay in their lanes),
    ``"missed"`` (a move left out). Names are read as ``_word`` reads them: ``"Scatter"`` is scatter, a
    right answer whatever its case, and the verdict adds one line on torch's capitalised Functions.
    """
    from .story import FOUR_MOVES, four_moves_lanes

    name = "ch00.moves_between_devices"
    if _unset(moves) or isinstance(moves, str) or not isinstance(moves, (set, list, tuple, frozenset)):
        return Verdict(
            False, 'Set `moves` to a set of move names, e.g. {"scatter"}, then run this cell again.'
        )
    given = {_word(m) for m in moves}  # " 'gather'" and "Gather" are gather
    capital = (
        "\n(Scatter, Gather and Broadcast with capitals are torch's autograd Functions, in "
        "torch/nn/parallel/_functions.py, that its moves call; the moves are spelled lower case.)"
        if any(_word(m) in FOUR_MOVES and str(m) != str(m).lower() for m in moves)
        else ""
    )
    odd = sorted(given - set(FOUR_MOVES))
    crossing = [(a, b) for a, b in four_moves_lanes(slots) if _lane(a) != _lane(b)]
    truth = {a if a in FOUR_MOVES else b for a, b in crossing}  # the move at one end of each arrow
    arrows = "; ".join(f"{a} → {b}" for a, b in crossing)
    answer = (
        f"moves = {{{', '.join(map(repr, sorted(truth)))}}}: the arrows {arrows} leave one lane for another. "
        "scatter sends "
        "piece 1 to slot 1, replicate copies the weights there (under the default, slot 0's replica "
        "shares the model's storage), gather brings output 1 back for the loss; parallel_apply stays in each lane."
    )
    fail = _ladder(
        name,
        [
            "On two GPUs slot 1's lane is GPU 1 and everything else, x, the model and the loss included, is on "
            "GPU 0: an arrow into or out of slot 1's lane carries tensors across.",
            "Follow slot 1's lane: where do its piece and its replica come from, and where does its output go?",
        ],
        answer,
    )
    if odd:
        return fail(
            f"name only the four moves, {', '.join(map(repr, FOUR_MOVES))}, not {', '.join(map(repr, odd))}. "
            f"Change `moves`.{capital}",
            "not moves",
        )
    if "parallel_apply" in given:
        return fail(
            "parallel_apply runs replica 1 on piece 1, both already in slot 1's lane: its arrows never leave "
            f"the lane. Take it out.{capital}",
            "parallel_apply",
        )
    if given != truth:
        why = {
            "scatter": "piece 1 must reach slot 1 before replica 1 can run on it: follow scatter's arrow",
            "replicate": "replica 1 is a copy in slot 1's lane, made from the model on slot 0",
            "gather": "output 1 is made in slot 1's lane, and the loss is computed on slot 0",
        }
        missed = sorted(truth - given)
        return fail(f"add {', '.join(missed)}: {'; '.join(why[m] for m in missed)}.{capital}", "missed")
    return _correct(
        name,
        f"{len(crossing)} arrows cross, one per move but parallel_apply, and with N slots each crosses N − 1 "
        f"times. Chapter 06 counts the bytes of replicate's copies and of the gather.{capital}",
    )


# ---------------------------------------------------------------- chapter 04 · the Python way, exercises 2, 4 and 5


def _names(keys: set) -> str:
    """A set of names as a sorted set literal, so a message reads the same on every run."""
    return "{" + ", ".join(repr(k) for k in sorted(keys)) + "}" if keys else "set()"


def shallow_copy_line(line: str | object, predicted: object) -> Verdict:
    """Exercise 4: ``predicted``, the names among ``_parameters``, ``_buffers`` and ``_modules`` that in
    ``dpteach.replicate(cpp_model, devices)[1][0]`` are ``cpp_model[0]``'s own objects (none: ``set()``);
    ``line``, one line of ``nn.Module._replicate_for_data_parallel`` (as torch has it here), the one that
    makes ``replicas[1][0].members is model[0].members``, which the chapter's trap cell prints above.

    Both are read live (a C++-style model replicated by ``dpteach.replicate``, the installed torch's
    source). The prediction is graded first, and only a right one brings the source to read the line
    from. Findings (``Verdict.problem``): ``"predicted"`` (another set of names), ``"not a line"``,
    ``"new"`` (the line that makes the empty object), ``"parameters"`` (the line that empties the
    registry), ``"buffers or modules"`` (a line that copies one of the registry's dicts), ``"flag"``
    (``_is_replica``).
    """
    import inspect

    from torch import nn

    from ..replicate import replicate
    from . import demos, story

    name = "ch04.shallow_copy_line"
    names = ("_parameters", "_buffers", "_modules")
    if _unset(predicted):
        return Verdict(
            False,
            'Set `predicted` to the registry dicts you expect to be the original\'s own objects, e.g. {"_buffers"}, '
            "or set() for none; then run again.",
        )
    if isinstance(predicted, dict) and not predicted:
        return Verdict(
            False, "Not yet: `{}` is an empty dict in Python; write set() for none of them.", "not an answer"
        )
    if isinstance(predicted, (set, frozenset, list, tuple)) and "members" in predicted:
        return Verdict(
            False,
            "Not yet: `members` is settled, the trap cell printed that slot 1's is the original's; put only names "
            "from _parameters, _buffers and _modules in `predicted`.",
            "not an answer",
        )
    if not isinstance(predicted, (set, frozenset, list, tuple)) or not all(n in names for n in predicted):
        return Verdict(
            False,
            f'Give `predicted` as a set of names from {", ".join(names)}, e.g. {{"_buffers"}}, or set(), not '
            f"{predicted!r}.",
            "not an answer",
        )
    model = demos.cpp_style(story.make_model())
    replica, own = replicate(model, ["cpu", "cpu"])[1][0], model[0]
    shared = {key for key in names if getattr(replica, key) is getattr(own, key)}
    reasons = {
        "_parameters": "`_parameters` is replaced by a new, empty dict (replicate then sets each copy by name)",
        "_buffers": "`_buffers` is replaced by a copy of its own, which replicate fills with the slot's buffers",
        "_modules": "`_modules` is replaced by a copy of its own, which replicate fills with the slot's submodules",
    }
    guessed = _ladder(
        name + ".predicted",
        [
            "A shallow copy copies a container, not what it holds; the method then replaces some containers.",
            "Only what the method leaves as it was after copying the dict stays the original's.",
        ],
        f"predicted = {_names(shared)}.",
        restart=True,
    )
    if set(predicted) != shared:
        wrong = [reasons[key] for key in names if (key in predicted) != (key in shared)]
        return guessed(
            f"`predicted` is {_names(set(predicted))}, but " + "; ".join(wrong) + ". Change `predicted`.",
            "predicted",
        )
    _failures.pop(name + ".predicted", None)

    def code(text: str) -> str:  # one line, spaces collapsed, a trailing comment ("# type: ignore") dropped
        return " ".join(re.sub(r"\s#.*$", "", text).split())

    source = inspect.getsource(nn.Module._replicate_for_data_parallel)
    lines = [code(s) for s in source.splitlines() if s.strip() and not s.strip().startswith("#")]
    right = (
        f"Your prediction is right: predicted = {_names(shared)}. "
        + "; ".join(reasons[k] for k in names)
        + ". "
    )
    if _unset(line) or not isinstance(line, str) or not line.strip():
        return Verdict(
            False,
            right
            + "Now set `line` to the line below that shares `members`, as a string, and run again:\n\n"
            + source,
        )
    given = code(line)
    truth = next(s for s in lines if "__dict__" in s)

    def bare(text: str) -> str:  # no whitespace at all: `a=b` is the line `a = b`
        return "".join(text.split())

    answer = (
        f"line = `{truth}`. It copies the dict that holds every plain attribute, not what the dict holds: the "
        "replica's `members` is the original's SimpleNamespace, so slot 1 computes with the original's tensors; "
        "the registry's three dicts are replaced on the lines after it."
    )
    fail = _ladder(
        name,
        [
            "Which line copies a container in which `members` sits?",
            "`members` is a plain attribute, neither a parameter, a buffer nor a submodule: Python keeps plain "
            "attributes in the object's __dict__.",
        ],
        answer,
        restart=True,
    )
    if bare(given) not in {bare(s) for s in lines}:
        return fail(
            "that is not a line of _replicate_for_data_parallel: copy one line of its source, below.\n\n"
            + source,
            "not a line",
        )
    if bare(given) == bare(truth):
        return _correct(
            name,
            f"predicted = {_names(shared)}, line = `{truth}`. The replica's `members` is the original's, while "
            "its `_parameters`, `_buffers` and `_modules` are its own: the line copies the dict that holds "
            "every plain attribute, not what the dict holds, and the lines after it replace the registry's "
            "three dicts.",
        )
    said = [
        ("__new__", "new", "that line makes an empty object of the module's class: it shares nothing yet"),
        (
            "_parameters",
            "parameters",
            "that line empties the replica's registry, which holds parameters only; `members` is not in it",
        ),
        (
            "_buffers",
            "buffers or modules",
            "that line gives the replica its own dict of buffers; `members` is no buffer",
        ),
        (
            "_modules",
            "buffers or modules",
            "that line gives the replica its own dict of submodules; `members` is no submodule",
        ),
        ("_is_replica", "flag", "that line only marks the replica as one"),
    ]
    for key, problem, why in said:
        if key in given:
            return fail(f"{why}. Which line hands the replica the original's plain attributes?", problem)
    return fail("that line does not put `members` into the replica. Try another.", "not that line")


def tied_weights(tensors_per_slot: int | object, same_copy: bool | object, devices=("cpu", "cpu")) -> Verdict:
    """Exercise 2: for ``nn.Sequential(a, b)`` with ``b.weight = a.weight`` (two ``nn.Linear(3, 3)``),
    ``tensors_per_slot``: how many tensors ``replicate`` broadcasts to each slot; ``same_copy``: whether
    ``replicas[1][0].weight is replicas[1][1].weight``. Both are read from a live ``dpteach.replicate``.

    Findings (``Verdict.problem``): ``"tie counted twice"`` (4), ``"biases"`` (1 or 2: the biases left out),
    ``"all slots"`` (the count for every slot together), ``"count"`` (another count), ``"untied"``.
    """
    from torch import nn

    from ..replicate import replicate

    name = "ch04.tied_weights"
    if _unset(tensors_per_slot, same_copy):
        return Verdict(False, "Set `tensors_per_slot` and `same_copy`, then run this cell again.")
    if not _count(tensors_per_slot):
        return Verdict(False, f"Give `tensors_per_slot` as a whole number, not {tensors_per_slot!r}.")
    if not isinstance(same_copy, bool):
        return Verdict(False, f"Set `same_copy` to True or False (no quotes), not {same_copy!r}.")
    a, b = nn.Linear(3, 3), nn.Linear(3, 3)
    b.weight = a.weight
    model = nn.Sequential(a, b).to(devices[0])
    params = list(model.parameters())  # what replicate.py broadcasts: a tied tensor once
    replicas = replicate(model, list(devices))
    tied = replicas[1][0].weight is replicas[1][1].weight
    count, n = len(params), len(devices)
    answer = (
        f"tensors_per_slot = {count} (a.weight, shared with b, then a.bias and b.bias), same_copy = {tied}. "
        "replicate.py broadcasts list(network.parameters()), which yields a tied tensor once, and keeps "
        "param_indices, a dict from each parameter to its index, so every module holding that parameter gets "
        "the copy at the same index: one tensor per replica, tied as in the model."
    )
    fail = _ladder(
        name,
        [
            "A tie is one tensor held by two modules. How often does model.parameters() yield it?",
            "replicate.py broadcasts list(network.parameters()) and hands each module the copy found at its "
            "parameter's index in that list (param_indices).",
        ],
        answer,
        restart=True,
    )
    guess = int(tensors_per_slot)  # type: ignore[call-overload]
    if guess != count:
        slips = {
            count + 1: (
                "tie counted twice",
                "a.weight and b.weight are one tensor, and parameters() yields it once",
            ),
            count - 1: ("biases", "the biases are parameters too: a.bias and b.bias are broadcast as well"),
            count - 2: ("biases", "the biases are parameters too: a.bias and b.bias are broadcast as well"),
            count * n: ("all slots", f"that counts all {n} slots together: give the count for one slot"),
            (count + 1) * n: (
                "all slots",
                f"that counts all {n} slots, and the tied weight twice: one slot, one weight",
            ),
        }
        problem, why = slips.get(guess, ("count", f"{guess} is too {'many' if guess > count else 'few'}"))
        return fail(f"{why}. Change `tensors_per_slot`.", problem)
    if same_copy != tied:
        copies = _ladder(
            name + ".same",
            [
                "A tie is one tensor held by two modules: does replicate hand them one copy of it, or two?",
                "replicate hands each module the copy at its parameter's index (param_indices), and a.weight "
                "and b.weight are one parameter, with one index.",
            ],
            answer,
            restart=True,
        )
        return copies(
            "the count is right, but not `same_copy`: ask whether the replica's two modules hold one copy of "
            "the tied weight or two. Change `same_copy`.",
            "untied",
        )
    _failures.pop(name + ".same", None)
    return _correct(name, answer)


def _slot_error(module, devices: Sequence, x: torch.Tensor) -> BaseException | None:
    """The error one forward of ``module``'s replicas on ``devices`` raises, or ``None``. No gather: a
    ``meta`` slot's output has no data to copy back."""
    from ..parallel_apply import parallel_apply
    from ..replicate import replicate
    from ..scatter_gather import scatter

    try:
        pieces = [(p,) for p in scatter(x, list(devices))]
        parallel_apply(replicate(module, list(devices)), pieces, devices=list(devices))
    except Exception as err:  # the learner's forward, re-raised from its slot's thread
        return err
    return None


def _reaches(fn, name: str) -> bool:
    """Whether the autograd graph behind ``fn`` holds a node of type ``name``."""
    seen, todo = set(), [fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if type(node).__name__ == name:
            return True
        todo.extend(next_fn for next_fn, _ in node.next_functions)
    return False


def kept_handle(raises: bool | object, forward: Callable | object, cls: type) -> Verdict:
    """Exercise 5: ``raises``, whether ``cls``'s own forward (``TwoHeads``: two ``nn.Linear`` heads at
    ``self.a`` and ``self.b``, also kept in the plain dict ``self.heads``, through which forward picks
    one by its name) raises on slots ``["cpu", "meta"]``; ``forward(self, x, head="a")``, the learner's
    forward for ``cls``, which must find the head by name on ``self``.

    Both are read live: ``cls``'s replicas run on ``["cpu", "meta"]``, and so do those of ``cls`` with the
    learner's ``forward``, which must also compute ``cls``'s function, for each head where ``cls.forward``
    takes ``head``, and, on two CPU slots, give slot 1 an output that comes from the broadcast copies.
    Findings (``Verdict.problem``): ``"predicted"``, ``"forward raised"``, ``"forward"`` (another
    function), ``"registry read"`` (a ``KeyError`` from a replica's empty ``_parameters``),
    ``"kept handle"`` (still raises on ``meta``), ``"not the copies"`` (slot 1's output reaches no
    ``BroadcastBackward`` node).
    """
    import inspect

    from ..parallel_apply import parallel_apply
    from ..replicate import replicate
    from ..scatter_gather import scatter

    name, slots = "ch04.kept_handle", ("cpu", "meta")
    again = "run this cell again"
    if _unset(raises):
        return Verdict(
            False,
            f"Set `raises` to True or False first: does {cls.__name__}.forward raise on slots "
            '["cpu", "meta"]? Then run this cell again.',
        )
    if not isinstance(raises, bool):
        return Verdict(False, f"Set `raises` to True or False (no quotes), not {raises!r}.", "not an answer")
    torch.manual_seed(0)
    x = torch.randn(4, 3)
    error = _slot_error(cls(), slots, x)
    truth = error is not None
    said = str(error).strip().splitlines()[-1] if error else ""
    guessed = _ladder(
        name + ".raises",
        [
            "replicate makes each replica a shallow copy of the module: which attributes get slot 1's "
            "replicas and copies, and which stay the original's own objects?",
            "Slot 1's `a` and `b` are registered submodules, so replicate hands slot 1 their replicas under "
            "those names; `heads` is a plain dict, the original's own, holding the original's heads with "
            "their CPU tensors, while slot 1's piece of the batch sits on meta.",
        ],
        f"raises = {truth}: "
        + (f"slot 1's forward stops with `{said}`" if truth else "no slot raises")
        + ".",
        restart=True,
    )
    if raises != truth:
        why = (
            "False would mean that slot 1's forward finds tensors on its own device: ask which modules "
            "self.heads holds on slot 1's replica"
            if truth
            else "True would mean that a slot's forward raised, and none did"
        )
        return guessed(f"{why}. Change `raises`.", "predicted")
    _failures.pop(name + ".raises", None)
    right = f"Your prediction is right: raises = {truth}" + (f" (slot 1: `{said}`)" if truth else "") + ". "
    ask = "Now write `forward` so that it finds the head by its name on self, and run this cell again."
    if not callable(forward):
        return Verdict(False, right + ask)
    fixed = type(cls.__name__, (cls,), {"forward": forward})
    torch.manual_seed(0)
    module = fixed()
    # every head the original forward offers, each computed by it on the original (where the dict is right)
    heads = [{}]
    if "head" in inspect.signature(cls.forward).parameters:
        heads = [{"head": key} for key in getattr(module, "heads", {"a": None})]
    try:
        outs = [module(x, **kw) for kw in heads]
    except Exception as err:  # the learner's forward: report it, never raise
        if missing := _missing_name(err, again):
            return missing
        outs = err
    if not isinstance(outs, BaseException) and any(out is None for out in outs):  # the stub's body, ``...``
        return Verdict(False, right + ask)
    fail = _ladder(
        name,
        [
            "A Python replica holds slot 1's replicas of its submodules under their names, so a lookup by "
            "name on every call finds them; a handle kept anywhere else is the original's.",
            "Find the head on self by the name you are given: getattr(self, head), inside forward.",
        ],
        'def forward(self, x, head="a"): return getattr(self, head)(x). Each call looks the head up by name, '
        "and on a replica that name holds the slot's replica of the head, which holds the slot's broadcast "
        "copies.",
        restart=True,
    )
    redo = _ladder(
        name + ".forward",
        [
            f"Keep the computation of {cls.__name__}.forward, the head named `head` applied to x: the exercise "
            "changes only "
            "where forward finds the head.",
            'Keep the signature forward(self, x, head="a"); the head named "a" is self.a, and "b" is self.b.',
        ],
        'def forward(self, x, head="a"): return getattr(self, head)(x).',
        restart=True,
    )
    if isinstance(outs, BaseException):
        return redo(
            f"your forward raised {type(outs).__name__}: {outs}. Keep the signature forward(self, x, "
            'head="a") and return the named head applied to x.',
            "forward raised",
        )
    wants = [cls.forward(module, x, **kw) for kw in heads]
    if not all(
        isinstance(out, torch.Tensor) and out.shape == want.shape and torch.allclose(out, want)
        for out, want in zip(outs, wants)
    ):
        return redo(
            f"your forward does not compute what {cls.__name__}.forward does, for every head: keep the function, "
            "the named head applied to x, and change only where forward finds the head.",
            "forward",
        )
    if (err := _slot_error(module, slots, x)) is not None:
        if missing := _missing_name(err, again):
            return missing
        last = str(err).strip().splitlines()[-1]
        if isinstance(err, KeyError):
            return fail(
                f"on a replica your forward raises `{last}`: a replica's `_parameters` is empty (the "
                'cell under "How replicate.py hands each replica its tensors" printed `replica.parameters()` '
                "as []), and its copies are plain attributes. Call the head itself, found by name on self.",
                "registry read",
            )
        return fail(
            f'on slots ["cpu", "meta"] your forward still raises (`{last}`): it reaches a head through a '
            "handle the replica shares with the original, and self.heads is the original's dict. Find the "
            "head on self by its name, getattr(self, head), instead of through self.heads.",
            "kept handle",
        )
    two = ["cpu", "cpu"]
    outputs = parallel_apply(replicate(module, two), [(p,) for p in scatter(x, two)], devices=two)
    if not _reaches(outputs[1].grad_fn, "BroadcastBackward"):
        return fail(
            "on two CPU slots, slot 1's output does not come from its broadcast copies (no BroadcastBackward "
            "node behind it): your forward reaches the original's tensors some other way. Call the head found "
            "by name on self as it is, without .to(), .detach() or self.heads.",
            "not the copies",
        )
    _failures.pop(name + ".forward", None)
    return _correct(
        name,
        f"raises = {truth}, and your forward runs on both slots: it looks the head up by name on every call, "
        "and on each replica that name holds the slot's replica of the head, whose broadcast copies' "
        "gradients Broadcast's backward sums onto the original. (In __init__, an nn.ModuleDict instead of the "
        "plain dict would do the same: replicate re-points every registered submodule.)",
    )
