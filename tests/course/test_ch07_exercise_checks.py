"""Chapter 07's exercise checks: ``checks.hvp_linear`` (Exercise 1: H(v1 + v2) = H v1 + H v2 through
DataParallel), ``checks.rewire_refuses`` (2: the calls that meet ReduceAdd's check), ``checks.penalty_inside`` (3: the
input-gradient penalty inside forward) and ``checks.recorded_node`` (4: the node ReduceAddCoalesced's
backward records). Each accepts the chapter's worked answer, names the usual slip (``Verdict.problem``),
and gives the answer only from the third failed try; an unset answer costs no hint. Then the chapter: each
check cell ends on its check, and each exercise has its Answer block.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
import torch
import torch.nn.functional as F

import dpteach
from dpteach.course import checks, story

ROOT = Path(__file__).resolve().parents[2]
SLOTS = ["cpu"] * 2


@pytest.fixture(autouse=True)
def _fresh():
    checks.reset()
    yield
    checks.reset()


def hessian_vector_product(net, model, x, y, v):  # the chapter's
    params = list(model.parameters())
    grads = torch.autograd.grad(F.mse_loss(net(x), y), params, create_graph=True)
    return torch.autograd.grad(sum((g * u).sum() for g, u in zip(grads, v)), params)


def three_tries(check, *args):
    """The messages of three failed tries of one wrong answer, from a fresh count."""
    checks.reset()
    return [check(*args).message for _ in range(3)]


def gives_answer_only_at_the_third(messages):
    return [m.split("\n")[1].split(":")[0] for m in messages] == ["Hint 1 of 2", "Hint 2 of 2", "The answer"]


# ---------------------------------------------------------------- Exercise 1: linearity of H v


@pytest.fixture
def hvp():
    x, y = story.make_data()
    model = story.make_model()
    net = dpteach.DataParallel(model, SLOTS)
    g = torch.Generator().manual_seed(1)
    v1 = [torch.randn(p.shape, generator=g) for p in model.parameters()]
    v2 = [torch.randn(p.shape, generator=g) for p in model.parameters()]
    hv = lambda v: hessian_vector_product(net, model, x, y, v)  # noqa: E731
    return hv, v1, v2, (v1, v2, model, x, y)


def test_exercise_1_accepts_the_worked_answer(hvp):
    hv, v1, v2, rest = hvp
    verdict = checks.hvp_linear(hv(v1), hv(v2), hv([a + b for a, b in zip(v1, v2)]), *rest)
    assert verdict.ok and "H(v1 + v2) = H v1 + H v2" in verdict.message


def test_exercise_1_names_the_slips(hvp):
    hv, v1, v2, rest = hvp
    right_sum = hv([a + b for a, b in zip(v1, v2)])
    found = {
        "joined lists": checks.hvp_linear(hv(v1), hv(v2), hv(v1 + v2), *rest),  # v1 + v2 on lists: H v1
        "joined results": checks.hvp_linear(hv(v1), hv(v2), list(hv(v1)) + list(hv(v2)), *rest),
        "swapped": checks.hvp_linear(hv(v2), hv(v1), right_sum, *rest),
        "hv2": checks.hvp_linear(hv(v1), hv(v1), right_sum, *rest),
        "not an answer": checks.hvp_linear(1.0, hv(v2), right_sum, *rest),
    }
    assert {k: v.problem for k, v in found.items()} == {k: k for k in found}
    assert "[a + b for a, b in zip(v1, v2)]" in found["joined lists"].message  # says what to change


def test_exercise_1_refuses_hv_sum_added_by_hand(hvp):
    """hv1 + hv2 added tensor by tensor assumes the linearity the exercise checks: the check asks for H(v1 + v2)."""
    hv, v1, v2, rest = hvp
    hv1, hv2 = hv(v1), hv(v2)
    verdict = checks.hvp_linear(hv1, hv2, [a + b for a, b in zip(hv1, hv2)], *rest)
    assert (
        verdict.problem == "hand-summed" and "hessian_vector_product on the summed vectors" in verdict.message
    )
    assert gives_answer_only_at_the_third(
        three_tries(checks.hvp_linear, hv1, hv2, [a + b for a, b in zip(hv1, hv2)], *rest)
    )


def test_exercise_1_unset_costs_no_hint_and_the_answer_comes_third(hvp):
    hv, v1, v2, rest = hvp
    assert not checks.hvp_linear(..., ..., ..., *rest).problem
    assert gives_answer_only_at_the_third(three_tries(checks.hvp_linear, hv(v1), hv(v2), hv(v1 + v2), *rest))


# ---------------------------------------------------------------- Exercise 2: the calls ReduceAdd refuses


def test_exercise_2_accepts_the_worked_answer_and_names_the_slips():
    assert checks.rewire_refuses({"b", "d"}, SLOTS).ok
    assert checks.rewire_refuses(["d", "b"], SLOTS).ok  # any collection of letters
    assert (
        checks.rewire_refuses({"b", "c", "d"}, SLOTS).problem == "c"
    )  # the input's gradient never runs ReduceAdd
    assert checks.rewire_refuses({"b"}, SLOTS).problem == "d"  # backward(create_graph=True) records too
    assert checks.rewire_refuses({"e"}, SLOTS).problem == "not an answer"  # no hint spent
    assert not checks.rewire_refuses(..., SLOTS).problem
    assert gives_answer_only_at_the_third(three_tries(checks.rewire_refuses, {"a", "b"}, SLOTS))


def test_exercise_2_names_the_wrong_letter_only_from_the_second_try():
    checks.reset()
    first, second, third = (
        checks.rewire_refuses({"b", "c", "d"}, SLOTS).message.split("\n")[0] for _ in range(3)
    )
    assert not re.search(r"\b[a-d]\b", first)  # the first try names no letter
    assert "for c" in second and "paths to x_in" not in second  # then which, not why
    assert "c runs" in third and "paths to x_in" in third  # why, with the answer


# ---------------------------------------------------------------- Exercise 3: the penalty inside forward


class PenaltyInside(torch.nn.Module):
    """Answer 3's module; ``detach=False`` uses the scattered piece as it is, ``mean=True`` averages in forward."""

    def __init__(self, net, detach=True, mean=False, create_graph=True, retain=False):
        super().__init__()
        self.net, self.detach, self.mean = net, detach, mean
        self.create_graph, self.retain = create_graph, retain or create_graph

    def forward(self, x):
        if self.detach:
            x = x.detach().requires_grad_()
        out = self.net(x)
        (grad_x,) = torch.autograd.grad(
            out.sum(), x, create_graph=self.create_graph, retain_graph=self.retain
        )
        terms = (grad_x.norm(dim=1) - 1) ** 2
        return out, terms.mean() if self.mean else terms


@pytest.mark.parametrize("slots", [SLOTS, ["cpu"] * 4])
def test_exercise_3_accepts_the_worked_answer(slots):
    assert checks.penalty_inside(PenaltyInside, slots).ok


def test_exercise_3_names_the_slips():
    assert checks.penalty_inside(lambda net: PenaltyInside(net, detach=False)).problem == "no grad"
    assert checks.penalty_inside(lambda net: PenaltyInside(net, mean=True)).problem == "one per replica"
    for retain in (False, True):  # without create_graph=True: the raw torch error, or a silently lost penalty
        no_graph = checks.penalty_inside(
            lambda net, r=retain: PenaltyInside(net, create_graph=False, retain=r)
        )
        assert no_graph.problem == "no create_graph" and "create_graph=True" in no_graph.message

    class Stub(PenaltyInside):
        def forward(self, x):
            raise NotImplementedError("exercise 3")

    stub = checks.penalty_inside(Stub)
    assert not stub.ok and not stub.problem and "Write PenaltyInside.forward" in stub.message  # no hint spent


def test_exercise_3_a_mean_per_replica_differs_only_where_pieces_are_unequal():
    """Why the check also runs 3 slots: 256 rows split 128, 128 on 2 slots, 86, 86, 84 on 3."""
    x, y = story.make_data()
    out, terms = PenaltyInside(story.make_model())(x)  # one device: every row's term, one mean
    rows = (F.mse_loss(out, y) + terms.mean()).item()
    losses = {}
    for n in (2, 3):
        with pytest.warns(UserWarning):  # gather's warning on 0-d outputs
            out, means = dpteach.DataParallel(PenaltyInside(story.make_model(), mean=True), ["cpu"] * n)(x)
        losses[n] = (F.mse_loss(out, y) + means.mean()).item()
    assert losses[2] == pytest.approx(rows, rel=1e-5) and losses[3] != pytest.approx(rows, rel=1e-6)


# ---------------------------------------------------------------- Exercise 4: the recorded node


def test_exercise_4_accepts_the_worked_answer_and_names_the_slips():
    assert checks.recorded_node("BroadcastBackward", SLOTS).ok
    assert checks.recorded_node("Broadcast", SLOTS).ok  # as the compact drawing writes it
    assert checks.recorded_node("ReduceAddCoalescedBackward", SLOTS).problem == "forward node"  # out's
    assert checks.recorded_node(None, SLOTS).problem == "nothing recorded"  # u needed no grad
    assert checks.recorded_node(["BroadcastBackward"] * 2, SLOTS).ok  # the name of each gradient's grad_fn
    assert checks.recorded_node([None, None], SLOTS).problem == "nothing recorded"
    mixed = checks.recorded_node(["BroadcastBackward", "AddBackward0"], SLOTS)
    assert mixed.problem == "not one name" and "set recorded to that one name" in mixed.message
    other = checks.recorded_node("AddBackward0", SLOTS)
    assert "set recorded to that name" in other.message  # says what to change
    assert gives_answer_only_at_the_third(three_tries(checks.recorded_node, "AddBackward0", SLOTS))


# ---------------------------------------------------------------- the chapter's cells


def _cells():
    return nbformat.read(ROOT / "notebooks" / "07_double_backward.ipynb", as_version=4).cells


CALLS = {
    "ex1-check": "checks.hvp_linear(hv1, hv2, hv_sum, v1, v2, model, x, y)",
    "ex2-check": "checks.rewire_refuses(raises, devices)",
    "ex3-check": "checks.penalty_inside(PenaltyInside, devices)",
    "ex4-check": "checks.recorded_node(recorded, devices)",
}


def test_each_exercise_has_a_check_cell_then_its_answer():
    cells = _cells()
    for n, (tag, call) in enumerate(CALLS.items(), start=1):
        (i,) = [i for i, c in enumerate(cells) if tag in c.metadata.get("tags", [])]
        assert cells[i].source.rstrip().splitlines()[-1] == call, tag  # the last line shows the verdict
        assert re.match(rf"<details><summary>Answer {n}</summary>", cells[i + 1].source), tag
        before = cells[i - 1].source if n == 1 else cells[i - 1].source.split("</details>")[-1]
        assert re.search(rf"^{n}\. ", before, re.M), tag  # the question sits just above its check
