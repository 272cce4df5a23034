"""Chapter 10's checks for exercises 1, 2 and 4: ``checks.reduce_add_inputs`` (1: the replica copies that
lead into one ``ReduceAdd``), ``checks.replica_grads_none`` (2: why a rewired replica's ``.grad`` is None)
and ``checks.second_step_grad`` (4: a second backward through the same ``ReduceAdd`` nodes, no
``zero_grad`` between). Exercise 3's check is
tested in ``tests/core/test_cpp_exercise.py``.

A right answer is accepted; each wrong one is matched to its slip (``Verdict.problem``) and the message
says what to change; the hints climb and give the answer from the third failed try. Every truth is read
from the compiled module's own steps, so these tests need a C++ compiler (or the cached module).
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


# ---------------------------------------------------------------- Exercise 1: three slots


@pytest.fixture(scope="module")
def three(chapter):
    model, x, _ = chapter
    return cpp.rewire_step(model, x, ["cpu"] * 3)


def test_exercise_1_accepts_three_copies_into_one_node(three):
    node = three.replica_params[0]["weight"].grad_fn
    assert node.name() == "ReduceAdd" and all(r["weight"].grad_fn is node for r in three.replica_params)
    verdict = checks.reduce_add_inputs(3, True, three)
    assert verdict.ok and "one ReduceAdd" in verdict.message and "AccumulateGrad" in verdict.message
    assert checks.reduce_add_inputs(3.0, True, three).ok  # a whole float counts


@pytest.mark.parametrize(
    "count, same, slip",
    [
        (6, True, "every parameter"),  # weight's and bias's copies together
        (1, True, "next edge"),  # the node's way out, not its ways in
        (2, True, "count"),  # the chapter's two slots
        (3, False, "same node"),  # a printed grad_fn shows an address; `is` says one node
    ],
)
def test_exercise_1_names_each_slip_and_says_what_to_change(three, count, same, slip):
    verdict = checks.reduce_add_inputs(count, same, three)
    assert not verdict.ok and verdict.problem == slip
    assert verdict.message.startswith("Not yet: ") and "Change `" in verdict.message
    assert "Hint 1 of 2" in verdict.message and "into_reduce_add = 3" not in verdict.message


def test_exercise_1_gives_the_answer_only_from_the_third_try(three):
    messages = three_tries(checks.reduce_add_inputs, 2, True, three)
    assert gives_answer_only_at_the_third(messages)
    assert "into_reduce_add = 3, same_node = True" in messages[2]


def test_exercise_1_asks_for_an_answer_and_a_fixed_three_slot_step(chapter, three):
    model, x, two = chapter
    assert checks.reduce_add_inputs(..., ..., three).message.startswith("Set `into_reduce_add`")
    assert checks.reduce_add_inputs("3", True, three).problem == "not an answer"
    assert checks.reduce_add_inputs(3, "yes", three).problem == "not an answer"
    assert checks.reduce_add_inputs(3, True, None).problem == "no module"
    assert checks.reduce_add_inputs(3, True, two).problem == "not three rewired"  # two slots
    clone = cpp.clone_step(model, x, ["cpu"] * 3)
    assert checks.reduce_add_inputs(3, True, clone).problem == "not three rewired"  # no ReduceAdd at all
    assert "Hint" not in checks.reduce_add_inputs(3, True, clone).message  # costs no hint


# ---------------------------------------------------------------- Exercise 2: where the .grad went


def test_exercise_2_accepts_not_a_leaf_and_the_node_it_flows_into(chapter):
    _, _, after = chapter
    weight = after.replica_params[0]["weight"]
    assert not weight.is_leaf and weight.grad_fn.name() == "ReduceAdd"
    assert all(g is None for grads in after.replica_grads for g in grads.values())
    verdict = checks.replica_grads_none(False, "ReduceAdd", after)
    assert verdict.ok and "not a leaf" in verdict.message
    assert checks.replica_grads_none(False, " 'reduceadd'", after).ok  # spaces, quotes and case aside


@pytest.mark.parametrize(
    "leaf, node, slip",
    [
        (True, "ReduceAdd", "leaf"),
        (False, "AccumulateGrad", "AccumulateGrad"),  # a leaf's node: this copy is not one
        (False, "ReduceAddBackward", "Python's name"),  # the Python strategy's node (chapter 03)
        (False, "CatBackward0", "node"),
    ],
)
def test_exercise_2_names_each_slip_and_says_what_to_change(chapter, leaf, node, slip):
    verdict = checks.replica_grads_none(leaf, node, chapter[2])
    assert not verdict.ok and verdict.problem == slip
    assert verdict.message.startswith("Not yet: ") and "Change `" in verdict.message
    assert "Hint 1 of 2" in verdict.message


def test_exercise_2_gives_the_answer_only_from_the_third_try(chapter):
    messages = three_tries(checks.replica_grads_none, True, "ReduceAdd", chapter[2])
    assert gives_answer_only_at_the_third(messages)
    assert "leaf = False, flows_into = 'ReduceAdd'" in messages[2]


def test_exercise_2_asks_for_an_answer_and_a_fixed_step(chapter):
    model, x, _ = chapter
    assert checks.replica_grads_none(..., "ReduceAdd", chapter[2]).message.startswith("Set `leaf`")
    assert checks.replica_grads_none("False", "ReduceAdd", chapter[2]).problem == "not an answer"
    assert checks.replica_grads_none(False, None, chapter[2]).problem == "not an answer"
    assert checks.replica_grads_none(False, "ReduceAdd", None).problem == "no module"
    clone = cpp.clone_step(model, x, DEVICES)  # its replicas' weights are leaves: nothing to explain
    assert checks.replica_grads_none(False, "ReduceAdd", clone).problem == "not rewired"


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
    assert checks.second_step_grad(2, model, x, DEVICES, None).problem == "no module"


def test_a_malformed_answer_names_only_the_field_that_is_wrong(ext, chapter):
    model, x, after = chapter
    three = cpp.rewire_step(model, x, ["cpu"] * 3)
    ex1 = checks.reduce_add_inputs("3", True, three).message
    assert "`into_reduce_add`" in ex1 and "same_node" not in ex1
    ex1 = checks.reduce_add_inputs(3, "True", three).message
    assert "`same_node`" in ex1 and "into_reduce_add" not in ex1
    ex2 = checks.replica_grads_none("False", "ReduceAdd", after).message
    assert "`leaf`" in ex2 and "flows_into" not in ex2
    ex2 = checks.replica_grads_none(False, None, after).message
    assert "`flows_into`" in ex2 and "leaf" not in ex2
    assert "Hint" not in ex1 + ex2  # a slip of form costs no hint


def test_exercise_1s_hints_nudge_and_never_write_the_code(three):
    messages = three_tries(checks.reduce_add_inputs, 2, True, three)
    for hint in messages[:2]:
        assert "[" not in hint and " is three" not in hint  # no comprehension, no ready `is` test


# ---------------------------------------------------------------- the chapter's cells

CALLS = {
    "ex1-check": "checks.reduce_add_inputs(into_reduce_add, same_node, three)",
    "ex2-check": "checks.replica_grads_none(leaf, flows_into, after if ext else None)",
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
        first = _tagged("ex3-source") if n == 3 else i  # exercise 3 is a loop of three cells
        before = cells[first - 1].source.split("</details>")[-1]
        assert re.search(rf"^{n}\. ", before, re.M), tag  # the question sits just above its cells


def _scope(ext) -> dict:
    torch.manual_seed(0)
    model, x = nn.Linear(3, 2), torch.randn(6, 3)
    return dict(
        ext=ext, reason=None, cpp=cpp, checks=checks, dpteach=dpteach, torch=torch, model=model, x=x,
        devices=list(DEVICES), after=cpp.rewire_step(model, x, DEVICES),
    )  # fmt: skip


def _run_check(tag: str, scope: dict, answer: str | None = None):
    *body, last = _cells()[_tagged(tag)].source.rstrip().splitlines()
    with contextlib.redirect_stdout(io.StringIO()):
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


def test_the_check_cells_say_why_without_the_compiled_module():
    torch.manual_seed(0)  # no compiled module, so no step: the scope the chapter has then
    scope = dict(
        ext=None, reason="no compiler", cpp=cpp, checks=checks, dpteach=dpteach, torch=torch,
        model=nn.Linear(3, 2), x=torch.randn(6, 3), devices=list(DEVICES),
    )  # fmt: skip
    for n in (1, 2, 4):  # `after` is never defined without the module: the cells must not read it
        verdict = _run_check(f"ex{n}-check", scope, _answer(n))
        assert not verdict.ok and verdict.problem == "no module", n
