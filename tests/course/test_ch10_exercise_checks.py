"""Chapter 10's checks for exercises 1, 2 and 4: ``checks.reduce_add_inputs`` (1: how many ``ReduceAdd``
nodes a two-layer model's fixed step makes on three slots, and how many inputs each has),
``checks.grads_filled`` (2: predict how many of that step's tensors hold a ``.grad``, with the fix and
without, then count them with a function of one's own)
and ``checks.second_step_grad`` (4: a second backward through the same ``ReduceAdd`` nodes, no
``zero_grad`` between). Exercise 3's check is tested in ``tests/core/test_cpp_exercise.py``.

A right answer is accepted; each wrong one is matched to its slip (``Verdict.problem``) and the message
says what to change; the hints climb and give the answer from the third failed try. Every truth is read
from the compiled module's own steps, so most of these tests need a C++ compiler (or the cached module);
without the module, exercises 1 and 4 are checked on Python's ``strategy="rewire"`` replicas, and say so.
"""

from __future__ import annotations

import contextlib
import io
import re
import textwrap
from pathlib import Path

import nbformat
import pytest
import torch
from torch import nn

import dpteach
from dpteach import cpp
from dpteach.course import checks

CHAPTER = Path(__file__).resolve().parents[2] / "notebooks" / "10_the_cpp_original.ipynb"
DEVICES = ["cpu", "cpu"]


@pytest.fixture(scope="module")
def ext():
    if not cpp.is_cached() and (cpp.compiler() is None or cpp.ninja() is None):
        pytest.skip("no C++ compiler or ninja found, and no cached module: the C++ chapter's checks need one")
    module, reason = cpp.load(progress=False)
    assert module is not None, reason
    return module


pytestmark = pytest.mark.usefixtures("fresh_checks")  # every test starts at hint 1


@pytest.fixture(scope="module")
def chapter(ext):
    """The chapter's model and batch (its key-result cell), and its two-slot fixed step."""
    torch.manual_seed(0)
    model, x = nn.Linear(3, 2), torch.randn(6, 3)
    return model, x, cpp.rewire_step(model, x, DEVICES)


def three_tries(check, *args):
    """The messages of three failed tries of one wrong answer, from a fresh count."""
    checks.reset()
    return [check(*args).message for _ in range(3)]


def gives_answer_only_at_the_third(messages):
    return [m.split("\n")[1].split(":")[0] for m in messages] == ["Hint 1 of 2", "Hint 2 of 2", "The answer"]


# ---------------------------------------------------------------- Exercises 1 and 2: a model the chapter never runs


def two_layers() -> nn.Module:
    """The exercises' deep_model: two Linear layers, as their cell builds it."""
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


SLOTS = ["cpu"] * 3


def holding_a_grad(step):
    """Exercise 2's count, as its worked answer writes it."""
    tensors = [*step.params.values(), *(p for r in step.replica_params for p in r.values())]
    return sum(t.grad is not None for t in tensors)


@pytest.fixture(scope="module")
def deep(chapter):
    torch.manual_seed(1)
    return two_layers(), chapter[1]


def test_exercise_1_accepts_one_node_per_parameter_and_one_input_per_replica(ext, deep):
    model, x = deep
    step = cpp.rewire_step(model, x, SLOTS)
    nodes = {id(p.grad_fn) for r in step.replica_params for p in r.values()}
    assert len(nodes) == 4 == len(step.params)  # both layers' weight and bias: the recursion into children
    assert all(p.grad_fn.name() == "ReduceAdd" for r in step.replica_params for p in r.values())
    verdict = checks.reduce_add_inputs(4, 3, model, x, SLOTS, ext)
    assert verdict.ok and "4 ReduceAdd nodes" in verdict.message and "3 gradients" in verdict.message
    assert checks.reduce_add_inputs(4.0, 3.0, model, x, SLOTS, ext).ok  # a whole float counts
    assert checks.reduce_add_inputs(2, 2, nn.Linear(3, 2), x, ["cpu"] * 2, ext).ok  # the truth is measured


@pytest.mark.parametrize(
    "nodes, each, slip",
    [
        (12, 3, "per copy"),  # one node per replica copy
        (2, 3, "per layer"),  # one node per layer
        (3, 3, "per replica"),
        (5, 3, "nodes"),
        (4, 1, "inputs"),  # the node's way out, not its ways in
        (4, 2, "inputs"),  # the chapter's two slots
    ],
)
def test_exercise_1_names_each_slip_and_says_what_to_change(ext, deep, nodes, each, slip):
    model, x = deep
    verdict = checks.reduce_add_inputs(nodes, each, model, x, SLOTS, ext)
    assert not verdict.ok and verdict.problem == slip
    assert verdict.message.startswith("Not yet: ") and "Change `" in verdict.message
    assert "Hint 1 of 2" in verdict.message and "reduce_adds = 4" not in verdict.message


def test_exercise_1_gives_the_answer_only_from_the_third_try(ext, deep):
    messages = three_tries(checks.reduce_add_inputs, 2, 3, *deep, SLOTS, ext)
    assert gives_answer_only_at_the_third(messages)
    assert "reduce_adds = 4, inputs_each = 3" in messages[2]
    for hint in messages[:2]:
        assert "[" not in hint and "grad_fn" not in hint  # the idea, no code to copy


def test_exercise_1_asks_for_numbers_and_the_compiled_module(ext, deep):
    model, x = deep
    assert checks.reduce_add_inputs(..., 3, model, x, SLOTS, ext).message.startswith("Set `reduce_adds`")
    assert checks.reduce_add_inputs("4", 3, model, x, SLOTS, ext).problem == "not an answer"
    without = checks.reduce_add_inputs(4, 3, model, x, SLOTS, None)  # no module: Python's twin, said so
    assert without.ok and "No C++ module is loaded" in without.message


def test_exercise_2_counts_the_grads_with_and_without_the_fix(ext, deep):
    model, x = deep
    verdict = checks.grads_filled(4, 12, holding_a_grad, model, x, SLOTS, ext)
    assert verdict.ok and "not a leaf" in verdict.message and "your count agrees" in verdict.message
    assert checks.grads_filled(2, 4, holding_a_grad, nn.Linear(3, 2), x, ["cpu"] * 2, ext).ok  # measured


def test_exercise_2_reads_no_grad_the_replicas_do_not_hold(ext, deep):
    model, x = deep
    fixed, cloned = cpp.rewire_step(model, x, SLOTS), cpp.clone_step(model, x, SLOTS)
    assert all(not p.is_leaf for r in fixed.replica_params for p in r.values())
    assert all(g is not None for g in fixed.grads.values())  # the original's four
    assert all(g is None for g in cloned.grads.values())  # nothing reaches the original under clone
    assert all(g is not None for r in cloned.replica_grads for g in r.values())  # 3 x 4 replica leaves


@pytest.mark.parametrize(
    "with_fix, without_fix, slip",
    [
        (16, 12, "replicas fill"),  # the replicas' copies too
        (12, 12, "replicas fill"),
        (4, 4, "original under clone"),  # the original under clone as under the fix
        (4, 16, "original under clone"),
        (4, 3, "without"),  # one per replica
        (0, 12, "with"),
    ],
)
def test_exercise_2_names_each_slip_and_says_what_to_change(ext, deep, with_fix, without_fix, slip):
    verdict = checks.grads_filled(with_fix, without_fix, holding_a_grad, *deep, SLOTS, ext)
    assert not verdict.ok and verdict.problem == slip
    assert verdict.message.startswith("Not yet: ") and "Change `" in verdict.message
    assert "you predicted" in verdict.message and "your count says" in verdict.message  # compared
    assert "Hint 1 of 2" in verdict.message and "with_fix = 4" not in verdict.message


def test_exercise_2_gives_the_answer_only_from_the_third_try(ext, deep):
    messages = three_tries(checks.grads_filled, 16, 12, holding_a_grad, *deep, SLOTS, ext)
    assert gives_answer_only_at_the_third(messages)
    assert "with_fix = 4, without_fix = 12" in messages[2]
    first_hint = messages[0].split("Hint 1 of 2: ")[1].splitlines()[0]
    assert "(" not in first_hint and "leaf" in first_hint  # the idea, no code to copy


def test_exercise_2_asks_for_numbers_and_the_compiled_module(ext, deep):
    model, x = deep
    assert checks.grads_filled(4, ..., holding_a_grad, model, x, SLOTS, ext).message.startswith(
        "Set `with_fix`"
    )
    assert checks.grads_filled(4, "12", holding_a_grad, model, x, SLOTS, ext).problem == "not an answer"
    without = checks.grads_filled(4, 12, holding_a_grad, model, x, SLOTS, None)  # no module: Python's steps
    assert (
        without.ok
        and "No C++ module is loaded" in without.message
        and "install a C++ compiler" in without.message
    )
    wrong = checks.grads_filled(16, 12, holding_a_grad, model, x, SLOTS, None)  # still judged, with a hint
    assert not wrong.ok and wrong.problem == "replicas fill" and "No C++ module is loaded" in wrong.message


def test_the_checks_leave_the_learners_random_state_alone(ext, deep):
    state = torch.random.get_rng_state()
    checks.reduce_add_inputs(4, 3, *deep, SLOTS, ext)
    checks.grads_filled(4, 12, holding_a_grad, *deep, SLOTS, ext)
    assert torch.equal(torch.random.get_rng_state(), state)


# ---------------------------------------------------------------- Exercise 4: a second step


def test_exercise_4_accepts_twice_the_first_steps_grad(ext, chapter):
    model, x, _ = chapter
    verdict = checks.second_step_grad(2, model, x, DEVICES, ext)
    assert verdict.ok and "2 times" in verdict.message and "zero_grad()" in verdict.message
    assert checks.second_step_grad(2.0, model, x, DEVICES, ext).ok  # a whole float counts
    assert checks.second_step_grad(2, model, x, DEVICES, ext).ok  # a rerun takes its own two steps: still 2
    assert checks.second_step_grad(2, model, x, ["cpu"] * 3, ext).ok  # on any number of slots


def test_exercise_4_leaves_the_learners_model_and_random_state_as_they_were(ext, chapter):
    model, x, _ = chapter
    state, weight = torch.random.get_rng_state(), model.weight.detach().clone()
    checks.second_step_grad(2, model, x, DEVICES, ext)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert torch.equal(model.weight, weight) and model.weight.grad is None


@pytest.mark.parametrize(
    "times, slip",
    [
        (1, "replaced"),  # thought the second backward writes over .grad
        (0, "edge gone"),  # thought the ReduceAdd edges die with the first backward
        (4, "replicas times steps"),  # two replicas times two steps
        (3, "times"),
    ],
)
def test_exercise_4_names_each_slip_and_says_what_to_change(ext, chapter, times, slip):
    model, x, _ = chapter
    verdict = checks.second_step_grad(times, model, x, DEVICES, ext)
    assert not verdict.ok and verdict.problem == slip
    assert verdict.message.startswith("Not yet: ") and "Change `times`" in verdict.message
    assert "Hint 1 of 2" in verdict.message and "times = 2" not in verdict.message


def test_exercise_4_hints_climb_from_the_idea_to_the_answer(ext, chapter):
    model, x, _ = chapter
    messages = three_tries(checks.second_step_grad, 1, model, x, DEVICES, ext)
    assert gives_answer_only_at_the_third(messages)
    first_hint = messages[0].split("Hint 1 of 2: ")[1].splitlines()[0]
    assert "(" not in first_hint and "AccumulateGrad" in first_hint  # the idea, no code to copy
    assert "times = 2" in messages[2]


def test_exercise_4_asks_for_a_number_and_the_compiled_module(ext, chapter):
    model, x, _ = chapter
    assert checks.second_step_grad(..., model, x, DEVICES, ext).message.startswith("Set `times`")
    assert checks.second_step_grad("2", model, x, DEVICES, ext).problem == "not an answer"
    without = checks.second_step_grad(2, model, x, DEVICES, None)  # no module: Python's twin, said so
    assert without.ok and "No C++ module is loaded" in without.message


def test_a_malformed_answer_names_only_the_field_that_is_wrong(ext, deep):
    ex1 = checks.reduce_add_inputs("4", 3, *deep, SLOTS, ext).message
    assert "`reduce_adds`" in ex1 and "inputs_each" not in ex1
    ex1 = checks.reduce_add_inputs(4, None, *deep, SLOTS, ext).message
    assert "`inputs_each`" in ex1 and "reduce_adds" not in ex1
    ex2 = checks.grads_filled(True, 12, holding_a_grad, *deep, SLOTS, ext).message
    assert "`with_fix`" in ex2 and "without_fix" not in ex2
    ex2 = checks.grads_filled(4, 12.5, holding_a_grad, *deep, SLOTS, ext).message
    assert "`without_fix`" in ex2 and "with_fix" not in ex2.replace("without_fix", "")
    assert "Hint" not in ex1 + ex2  # a slip of form costs no hint


# ---------------------------------------------------------------- the chapter's cells

CALLS = {
    "ex1-check": "checks.reduce_add_inputs(reduce_adds, inputs_each, deep_model, x, slots, ext)",
    "ex2-check": "checks.grads_filled(with_fix, without_fix, holding_a_grad, deep_model, x, slots, ext)",
    "ex3-check": "checks.dead_ends_are_back(my_dp, deleted_line, graph, predicted_dead_ends)",
    "ex4-check": "checks.second_step_grad(times, model, x, devices, ext)",
}


def _cells():
    return nbformat.read(CHAPTER, as_version=4).cells


def _tagged(tag: str) -> int:
    (i,) = [i for i, c in enumerate(_cells()) if tag in c.metadata.get("tags", [])]
    return i


def _answer(n: int) -> str:
    (body,) = [
        m.group(1)
        for c in _cells()
        if c.cell_type == "markdown"
        for m in re.finditer(rf"<summary>Answer {n}</summary>(.*?)</details>", c.source, re.S)
    ]
    return textwrap.dedent(re.search(r"```python\n(.*?)```", body, re.S).group(1))


def test_each_exercise_has_a_check_cell_then_its_answer():
    cells = _cells()
    for n, (tag, call) in enumerate(CALLS.items(), start=1):
        i = _tagged(tag)
        assert cells[i].source.rstrip().splitlines()[-1] == call, tag  # the last line shows the verdict
        assert cells[i + 1].source.startswith(f"<details><summary>Answer {n}</summary>"), tag
        first = {2: _tagged("ex2-count"), 3: _tagged("ex3-source")}.get(n, i)  # 2 and 3 span several cells
        assert first <= i
        before = cells[first - 1].source.split("</details>")[-1]
        assert re.search(rf"^{n}\. ", before, re.M), tag  # the question sits just above its cells


def _scope(ext) -> dict:
    torch.manual_seed(0)
    model, x = nn.Linear(3, 2), torch.randn(6, 3)
    return dict(
        ext=ext, reason=None, cpp=cpp, checks=checks, dpteach=dpteach, torch=torch, nn=nn, model=model, x=x,
        devices=list(DEVICES), after=cpp.rewire_step(model, x, DEVICES),
    )  # fmt: skip


def _body(tag: str) -> str:
    return "\n".join(_cells()[_tagged(tag)].source.rstrip().splitlines()[:-1])


def _run_check(tag: str, scope: dict, answer: str | None = None):
    *body, last = _cells()[_tagged(tag)].source.rstrip().splitlines()
    with contextlib.redirect_stdout(io.StringIO()):
        if tag == "ex2-check":
            exec(_body("ex1-check"), scope)  # exercise 1's cell builds deep_model and slots for both
            exec(_cells()[_tagged("ex2-count")].source, scope)  # the predictions and holding_a_grad
        exec("\n".join(body), scope)
        if answer:
            exec(answer, scope)  # the learner's lines, as the unfolded answer writes them
    return eval(last, scope)


@pytest.mark.parametrize("n", [1, 2, 4])
def test_each_check_cell_as_shipped_asks_for_an_answer(ext, n):
    verdict = _run_check(f"ex{n}-check", _scope(ext))
    assert not verdict.ok and verdict.message.startswith("Set `") and "Hint" not in verdict.message


@pytest.mark.parametrize("n", [1, 2, 4])
def test_each_check_cell_with_its_worked_answer_says_correct(ext, n):
    verdict = _run_check(f"ex{n}-check", _scope(ext), _answer(n))
    assert verdict.ok, verdict.message


def _no_module_scope() -> dict:
    torch.manual_seed(0)  # no compiled module, so no step: the scope the chapter has then
    return dict(
        ext=None, reason="no compiler", cpp=cpp, checks=checks, dpteach=dpteach, torch=torch, nn=nn,
        model=nn.Linear(3, 2), x=torch.randn(6, 3), devices=list(DEVICES),
    )  # fmt: skip


def test_without_the_compiled_module_every_exercise_but_3_still_checks_and_says_so():
    # `after` is never defined without the module: the cells must not read it
    for n in (1, 2, 4):  # answers that need no build: checked on Python's strategies, which they name
        verdict = _run_check(f"ex{n}-check", _no_module_scope(), _answer(n))
        assert (
            verdict.ok and "No C++ module is loaded" in verdict.message and "strategy=" in verdict.message
        ), n


@pytest.mark.parametrize(
    "check, args, slip",
    [
        (checks.reduce_add_inputs, (12, 3), "per copy"),
        (checks.reduce_add_inputs, (4, 2), "inputs"),
        (checks.second_step_grad, (1,), "replaced"),
        (checks.second_step_grad, (4,), "replicas times steps"),
    ],
)
def test_without_the_compiled_module_a_wrong_answer_still_names_its_slip(check, args, slip):
    checks.reset()
    torch.manual_seed(1)
    x = torch.randn(6, 3)
    if check is checks.reduce_add_inputs:
        verdict = check(*args, two_layers(), x, SLOTS, None)
    else:
        model = nn.Linear(3, 2)
        verdict = check(*args, model, x, DEVICES, None)
        assert model.weight.grad is None  # the twin steps a copy, never the learner's model
    assert not verdict.ok and verdict.problem == slip and "No C++ module is loaded" in verdict.message


def test_exercise_2_asks_for_the_predictions_before_the_count_and_checks_both(ext, deep):
    """The first cell asks for both predictions above the count; the check wants the predictions, then the
    count, checks the count against its own, then compares the predictions with it."""
    model, x = deep
    cell = _cells()[_tagged("ex2-count")].source
    assert cell.index("with_fix = ...") < cell.index("without_fix = ...") < cell.index("def holding_a_grad(")
    assert "warnings" not in cell and "non-leaf" not in cell  # nothing in the stub gives the answer away
    scope = dict(ext=ext, cpp=cpp, deep_model=model, x=x, slots=SLOTS)
    exec(cell, scope)
    stub = scope["holding_a_grad"]
    assert checks.grads_filled(..., ..., stub, model, x, SLOTS, ext).message.startswith("Set `with_fix`")
    unset = checks.grads_filled(4, 12, stub, model, x, SLOTS, ext)  # the predictions in, the count not yet
    assert not unset.ok and unset.problem == "count unset" and "holding_a_grad" in unset.message
    filled = cell.replace("return ...  #", "return sum(t.grad is not None for t in tensors)  #")
    assert filled != cell
    exec(filled, scope)
    assert checks.grads_filled(4, 12, scope["holding_a_grad"], model, x, SLOTS, ext).ok
    miscount = checks.grads_filled(4, 12, lambda step: len(step.params), model, x, SLOTS, ext)  # 4 and 4
    assert not miscount.ok and miscount.problem == "count" and "Change its `return` line" in miscount.message
    assert "returned 4 for the fixed step and 4 for the cloned one" in miscount.message
    assert "12" not in miscount.message  # the true counts stay the predictions' to find
    broken = checks.grads_filled(4, 12, lambda step: step.missing, model, x, SLOTS, ext)
    assert broken.problem == "count raised" and "AttributeError" in broken.message
    assert checks.grads_filled(4, 12, None, model, x, SLOTS, ext).problem == "no count"
