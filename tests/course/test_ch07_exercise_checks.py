"""Chapter 07's exercise checks: ``checks.recorded_nodes`` (Exercise 1, under the first picture: the penalty
graph's yellow box, read), ``checks.hvp_linear`` (2: H(v1 + v2) = H v1 + H v2 through DataParallel, and a
prediction of the bytes its meter sees broadcast), ``checks.rewire_refuses`` (3: the calls that meet ReduceAdd's check),
``checks.penalty_inside`` (4: the input-gradient penalty inside forward, and whether it matches under "rewire") and ``checks.second_backwards`` (5: what
two second backwards through DetachedBroadcast do). Each accepts the chapter's worked answer, names the usual slip
(``Verdict.problem``), and gives the answer only from the third failed try; an unset answer costs no hint. Then
the chapter: each check cell ends on its check, and each exercise has its Answer block.
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
PARAMETER_BYTES = 65 * 4  # the course model's float32 parameters
# three products, each broadcasting the parameters (forward) and v (second backward) to the other slot
RIGHT_BYTES = 3 * 2 * (len(SLOTS) - 1) * PARAMETER_BYTES


pytestmark = pytest.mark.usefixtures("fresh_checks")  # every test starts at hint 1


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


# ---------------------------------------------------------------- Exercise 2: linearity of H v


@pytest.fixture
def hvp():
    x, y = story.make_data()
    model = story.make_model()
    net = dpteach.DataParallel(model, SLOTS)
    g = torch.Generator().manual_seed(1)
    v1 = [torch.randn(p.shape, generator=g) for p in model.parameters()]
    v2 = [torch.randn(p.shape, generator=g) for p in model.parameters()]
    hv = lambda v: hessian_vector_product(net, model, x, y, v)  # noqa: E731
    with dpteach.comm.traffic() as moved:  # three products through net, as the exercise's cell takes them
        for v in (v1, v2, v1):
            hv(v)
    return hv, v1, v2, (v1, v2, net, x, y, moved, RIGHT_BYTES)


def test_exercise_2_accepts_the_worked_answer(hvp):
    hv, v1, v2, rest = hvp
    verdict = checks.hvp_linear(hv(v1), hv(v2), hv([a + b for a, b in zip(v1, v2)]), *rest)
    assert verdict.ok and "H(v1 + v2) = H v1 + H v2" in verdict.message


def test_exercise_2_names_the_slips(hvp):
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


def test_exercise_2_asks_that_the_products_went_through_data_parallel(hvp):
    """Taken on the model itself, H v is right too: the traffic() meter tells the two apart."""
    hv, v1, v2, (_, _, net, x, y, _, _) = hvp
    model = net.module
    with dpteach.comm.traffic() as moved:
        hv1 = hessian_vector_product(model, model, x, y, v1)  # on one device
        hv2, hv_sum = hv(v2), hv([a + b for a, b in zip(v1, v2)])
    verdict = checks.hvp_linear(hv1, hv2, hv_sum, v1, v2, net, x, y, moved, RIGHT_BYTES)
    assert verdict.problem == "one device" and "net, the DataParallel model" in verdict.message
    no_meter = checks.hvp_linear(hv1, hv2, hv_sum, v1, v2, net, x, y, ..., RIGHT_BYTES)
    assert no_meter.problem == "no meter" and "dpteach.comm.traffic()" in no_meter.message
    assert "Hint" not in no_meter.message  # a missing meter costs no hint


def test_exercise_2_refuses_hv_sum_added_by_hand(hvp):
    """hv1 + hv2 added tensor by tensor assumes the linearity the exercise checks: the check asks for H(v1 + v2)."""
    hv, v1, v2, rest = hvp
    hv1, hv2 = hv(v1), hv(v2)
    verdict = checks.hvp_linear(hv1, hv2, [a + b for a, b in zip(hv1, hv2)], *rest)
    assert (
        verdict.problem == "hand-summed" and "a third product: hessian_vector_product(net" in verdict.message
    )
    assert gives_answer_only_at_the_third(
        three_tries(checks.hvp_linear, hv1, hv2, [a + b for a, b in zip(hv1, hv2)], *rest)
    )


def test_exercise_2_names_a_hand_summed_hv_sum_when_only_two_products_ran():
    """Two products through net, then hv_sum = hv1 + hv2 tensor by tensor: the meter saw two products, and the
    check says the sum was added, not taken as a third product (not that the products missed net)."""
    x, y = story.make_data()
    model = story.make_model()
    net = dpteach.DataParallel(model, SLOTS)
    g = torch.Generator().manual_seed(1)
    v1, v2 = ([torch.randn(p.shape, generator=g) for p in model.parameters()] for _ in range(2))
    with dpteach.comm.traffic() as moved:
        hv1, hv2 = (hessian_vector_product(net, model, x, y, v) for v in (v1, v2))
        hv_sum = [a + b for a, b in zip(hv1, hv2)]
    verdict = checks.hvp_linear(hv1, hv2, hv_sum, v1, v2, net, x, y, moved, RIGHT_BYTES)
    assert verdict.problem == "hand-summed" and "third product" in verdict.message
    assert "not model" not in verdict.message  # the products did go through net
    with dpteach.comm.traffic() as moved:  # a third product, but on the model: now the meter is the slip
        hv_model = hessian_vector_product(model, model, x, y, [a + b for a, b in zip(v1, v2)])
        hv1, hv2 = (hessian_vector_product(net, model, x, y, v) for v in (v1, v2))
    verdict = checks.hvp_linear(hv1, hv2, hv_model, v1, v2, net, x, y, moved, RIGHT_BYTES)
    assert verdict.problem == "one device" and "2 of the three products" in verdict.message


def test_exercise_2_asks_for_the_prediction_first(hvp):
    """The prediction is set before the products: unset, or not a number, it costs no hint."""
    hv, v1, v2, rest = hvp
    unset = checks.hvp_linear(..., ..., ..., *rest[:-1], ...)
    assert not unset.ok and not unset.problem and "Predict first" in unset.message
    assert checks.hvp_linear(hv(v1), hv(v2), hv(v1), *rest[:-1], "many").problem == "not an answer"


def test_exercise_2_names_the_prediction_slips_on_three_slots():
    """On the exercise's three slots the meter sees 3 products x 2 broadcasts x 2 slots x 260 bytes; the usual
    slips (half of that, slot 0 counted, one product) are named, and the hints climb to the answer."""
    x, y = story.make_data()
    model = story.make_model()
    net = dpteach.DataParallel(model, ["cpu"] * 3)
    g = torch.Generator().manual_seed(1)
    v1, v2 = ([torch.randn(p.shape, generator=g) for p in model.parameters()] for _ in range(2))
    with dpteach.comm.traffic() as moved:
        hv1, hv2 = (hessian_vector_product(net, model, x, y, v) for v in (v1, v2))
        hv_sum = hessian_vector_product(net, model, x, y, [a + b for a, b in zip(v1, v2)])
    right = 3 * 2 * 2 * PARAMETER_BYTES
    assert moved.by_op()["broadcast"] == right == 3120
    args = (hv1, hv2, hv_sum, v1, v2, net, x, y, moved)
    verdict = checks.hvp_linear(*args, right)
    assert verdict.ok and "3,120 bytes broadcast, as you predicted" in verdict.message
    found = {
        k: checks.hvp_linear(*args, guess).problem
        for k, guess in {
            "forward only": right // 2,
            "slot 0": 3 * right // 2,
            "one product": right // 3,
            "bytes": 2000,
        }.items()
    }
    assert found == {k: k for k in found}
    messages = three_tries(checks.hvp_linear, *args, right // 2)
    assert gives_answer_only_at_the_third(messages)
    assert "260" not in messages[0] and "Broadcast" not in messages[0].split("Hint 1 of 2: ")[1]  # the idea
    assert "broadcast_bytes = 3,120" in messages[2]
    with dpteach.comm.traffic() as extra:  # a fourth product inside the meter: the count is no longer theirs
        for v in (v1, v2, [a + b for a, b in zip(v1, v2)], v1):
            hessian_vector_product(net, model, x, y, v)
    assert checks.hvp_linear(hv1, hv2, hv_sum, v1, v2, net, x, y, extra, right).problem == "extra"


def test_exercise_2_unset_costs_no_hint_and_the_answer_comes_third(hvp):
    hv, v1, v2, rest = hvp
    assert not checks.hvp_linear(..., ..., ..., *rest).problem
    assert gives_answer_only_at_the_third(three_tries(checks.hvp_linear, hv(v1), hv(v2), hv(v1 + v2), *rest))


# ---------------------------------------------------------------- Exercise 3: the calls ReduceAdd refuses


def test_exercise_3_accepts_the_worked_answer_and_names_the_slips():
    assert checks.rewire_refuses({"b", "d"}, SLOTS).ok
    assert checks.rewire_refuses(["d", "b"], SLOTS).ok  # any collection of letters
    assert (
        checks.rewire_refuses({"b", "c", "d"}, SLOTS).problem == "c"
    )  # the input's gradient never runs ReduceAdd
    assert checks.rewire_refuses({"b"}, SLOTS).problem == "d"  # backward(create_graph=True) records too
    assert checks.rewire_refuses({"e"}, SLOTS).problem == "not an answer"  # no hint spent
    assert not checks.rewire_refuses(..., SLOTS).problem
    assert gives_answer_only_at_the_third(three_tries(checks.rewire_refuses, {"a", "b"}, SLOTS))


def test_exercise_3_first_try_says_a_call_left_out_raises():
    checks.reset()
    first = checks.rewire_refuses({"b"}, SLOTS).message.split("\n")[0]
    assert "1 call you left out raises too" in first and not re.search(r"\b[a-d]\b", first)
    checks.reset()
    both = checks.rewire_refuses({"a", "b"}, SLOTS).message.split("\n")[0]
    assert "1 call you left out raises too and 1 call you listed runs without error" in both


def test_exercise_3_names_the_wrong_letter_only_from_the_second_try():
    checks.reset()
    first, second, third = (
        checks.rewire_refuses({"b", "c", "d"}, SLOTS).message.split("\n")[0] for _ in range(3)
    )
    assert not re.search(r"\b[a-d]\b", first)  # the first try names no letter
    assert "1 call you listed runs without error" in first  # but says which way the set is off
    assert "for c" in second and "paths to x_in" not in second  # then which, not why
    assert "c runs" in third and "paths to x_in" in third  # why, with the answer


# ---------------------------------------------------------------- Exercise 4: the penalty inside forward


class PenaltyInside(torch.nn.Module):
    """Answer 4's module; ``detach=False`` uses the scattered piece as it is, ``mean=True`` averages in forward."""

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
def test_exercise_4_accepts_the_worked_answer(slots):
    assert checks.penalty_inside(PenaltyInside, True, slots).ok


def test_exercise_4_refuses_terms_that_are_not_the_chapters_penalty():
    """A penalty that matches itself across slots but is not penalised_loss's (the square left out)."""

    class Unsquared(PenaltyInside):
        def forward(self, x):
            out, terms = super().forward(x)
            return out, terms.sqrt()  # |norm - 1|: the same under DataParallel as on one device, yet wrong

    found = checks.penalty_inside(Unsquared, True)
    assert found.problem == "penalty wrong" and "(grad_x.norm(dim=1) - 1) ** 2" in found.message


def test_exercise_4_names_the_slips():
    assert checks.penalty_inside(lambda net: PenaltyInside(net, detach=False), True).problem == "no grad"
    assert checks.penalty_inside(lambda net: PenaltyInside(net, mean=True), True).problem == "one per replica"
    for retain in (False, True):  # without create_graph=True: the raw torch error, or a silently lost penalty
        no_graph = checks.penalty_inside(
            lambda net, r=retain: PenaltyInside(net, create_graph=False, retain=r), True
        )
        assert no_graph.problem == "no create_graph" and "create_graph=True" in no_graph.message

    class Stub(PenaltyInside):
        def forward(self, x):
            raise NotImplementedError("exercise 4")

    stub = checks.penalty_inside(Stub, True)
    assert not stub.ok and not stub.problem and "Write PenaltyInside.forward" in stub.message  # no hint spent


def test_exercise_4_asks_the_rewire_prediction_first():
    """The prediction comes before the class: unset it costs no hint, and not a bool it is named."""
    unset = checks.penalty_inside(PenaltyInside)
    assert not unset.ok and not unset.problem and "Predict first" in unset.message
    assert checks.penalty_inside(PenaltyInside, "yes").problem == "not an answer"
    assert "Hint" not in checks.penalty_inside(PenaltyInside, "yes").message


def test_exercise_4_runs_the_class_under_rewire_for_the_prediction():
    """The input penalty's first gradient never reaches ReduceAdd: under "rewire" the class matches one device,
    so rewire = False is the slip, and its hints climb from the idea to the answer."""
    messages = three_tries(checks.penalty_inside, PenaltyInside, False)
    assert checks.penalty_inside(PenaltyInside, False).problem == "rewire"
    assert gives_answer_only_at_the_third(messages)
    assert "your PenaltyInside is right" in messages[0]
    assert "rewire = True" not in messages[0] + messages[1] and "rewire = True" in messages[2]
    right = checks.penalty_inside(PenaltyInside, True)
    assert right.ok and 'Under "rewire" it matches too' in right.message


def test_exercise_4_hints_name_the_idea_before_the_code():
    class Stub(PenaltyInside):
        def forward(self, x):
            return super().forward(x)[0], torch.zeros(len(x), requires_grad=True)  # not the penalty

    first, second, third = three_tries(checks.penalty_inside, Stub, True)
    hint1 = first.split("Hint 1 of 2: ")[1]
    assert "detach" not in hint1 and "requires_grad_" not in hint1 and "create_graph" not in hint1
    assert "x.detach().requires_grad_()" in third  # the code comes with the answer


def test_exercise_4_a_mean_per_replica_differs_only_where_pieces_are_unequal():
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


# ---------------------------------------------------------------- Exercise 5: what each second backward does

RIGHT_STEPS = {"a": "wrong", "b": "raises"}


def test_exercise_5_accepts_the_worked_answer_and_reports_the_run():
    verdict = checks.second_backwards(RIGHT_STEPS, SLOTS)
    assert verdict.ok and verdict.problem == "right"
    # the message reports the run: b's own error, and how far a was off
    assert "b raised RuntimeError: element 0 of tensors does not require grad" in verdict.message
    assert "a ran, " in verdict.message and "off one device's result" in verdict.message


def test_exercise_5_reads_answers_as_typed():
    assert checks.second_backwards({" A ": "WRONG", "b": "raise"}, SLOTS).ok


@pytest.mark.parametrize(
    "slip, problem",
    [
        ({"a": "right"}, "a"),  # apply records nothing for detached inputs: the penalty is a constant
        ({"a": "raises"}, "a"),  # beside the MSE's graph the lost history raises nothing
        ({"b": "wrong"}, "b"),  # the same lost history, but nothing else to differentiate: autograd refuses
    ],
)
def test_exercise_5_names_the_first_wrong_step(slip, problem):
    verdict = checks.second_backwards({**RIGHT_STEPS, **slip}, SLOTS)
    assert not verdict.ok and verdict.problem == problem and "Hint 1 of 2" in verdict.message


def test_exercise_5_says_more_with_each_try_and_the_answer_third():
    messages = three_tries(checks.second_backwards, {"a": "right", "b": "right"}, SLOTS)
    first, second, third = (m.split("\n")[0] for m in messages)
    assert not re.search(r"\b[a-d]\b", first) and "both of your two predictions disagree" in first
    assert "for a, b" in second and "detached" not in second  # then which, not why
    assert "a runs, but not to one device's result" in third and "detached" in third  # why, with the answer
    assert "b raises" in third
    assert gives_answer_only_at_the_third(messages)
    assert 'does = {"a": "wrong", "b": "raises"}' in messages[2]


def test_exercise_5_asks_for_an_answer_and_costs_no_hint():
    unset = {"a": ..., "b": "raises"}
    for does in (..., unset, {"a": "right"}, {**RIGHT_STEPS, "e": "right"}, {**RIGHT_STEPS, "a": "maybe"}):
        verdict = checks.second_backwards(does, SLOTS)
        assert not verdict.ok and "Hint" not in verdict.message, does
    wrong = checks.second_backwards({**RIGHT_STEPS, "b": "right"}, SLOTS)
    assert "Hint 1 of 2" in wrong.message  # the tries above spent none


def _chapter_namespace():
    """The chapter's own definitions that exercise 5's steps use, taken from its code cells."""
    import ast

    from dpteach import exercises
    from dpteach.functions import Broadcast, ReduceAddCoalesced
    from dpteach.replicate import ReduceAdd, broadcast, rewire

    wanted = {"gradient_norm_loss", "hessian_vector_product", "DetachedBroadcast", "net_of"}
    scope = {"torch": torch, "F": F, "dpteach": dpteach, "exercises": exercises, "devices": SLOTS}
    scope |= {"Broadcast": Broadcast, "ReduceAddCoalesced": ReduceAddCoalesced, "ReduceAdd": ReduceAdd}
    scope["rewire"], scope["broadcast"] = rewire, broadcast
    for cell in _cells():
        if cell.cell_type != "code":
            continue
        for node in ast.parse(cell.source).body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name in wanted:
                exec(compile(ast.Module([node], []), "<chapter 07>", "exec"), scope)
                wanted.discard(node.name)
    assert not wanted, f"the chapter no longer defines {sorted(wanted)}"
    return scope


def test_exercise_5_steps_do_with_the_chapters_own_code_what_the_check_says():
    """Each step, as the exercise's cell writes it, run with the chapter's own classes and losses: its outcome
    is the check's truth (which runs its own copies of them)."""
    (cell,) = [c for c in _cells() if "ex5-check" in c.metadata.get("tags", [])]
    steps = dict(re.findall(r"^# ([a-d]): (.+)$", cell.source, re.M))
    assert steps == checks._SECOND_STEPS  # the cell shows the steps the check runs
    scope = _chapter_namespace()
    x, y = story.make_data()
    v = [torch.randn_like(p) for p in story.make_model().parameters()]
    found = {}
    on_one_device = r"net_of\(model, \w+\)|dpteach\.DataParallel\(model, devices, strategy=\w+\)"
    for letter, step in steps.items():
        on_one = re.sub(on_one_device, "model", step)
        assert on_one != step
        runs = {}
        for label, text in (("parallel", step), ("one device", on_one)):
            model = story.make_model()
            try:
                out = eval(text, scope | {"model": model, "x": x, "y": y, "v": v})
            except RuntimeError:
                runs[label] = None
                continue
            runs[label] = list(out) if out is not None else [p.grad for p in model.parameters()]
        if runs["parallel"] is None:
            found[letter] = "raises"
        else:
            pairs = zip(runs["parallel"], runs["one device"])
            found[letter] = (
                "right" if all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in pairs) else "wrong"
            )
    assert found == {k: outcome for k, (outcome, _) in checks._second_steps_run(SLOTS).items()} == RIGHT_STEPS


# ---------------------------------------------------------------- Exercise 1: reading the penalty graph


@pytest.fixture
def penalty_graph():
    """The chapter's first graph: one weight on two slots, its gradient penalised."""
    torch.manual_seed(0)
    small = torch.nn.Linear(2, 1, bias=False)
    replicas = dpteach.replicate(small, SLOTS)
    pieces = dpteach.scatter(torch.randn(4, 2), SLOTS)
    out = dpteach.gather(dpteach.parallel_apply(replicas, [(p,) for p in pieces], devices=SLOTS), "cpu")
    loss = F.mse_loss(out, torch.randn(4, 1))
    grads = torch.autograd.grad(loss, list(small.parameters()), create_graph=True)
    penalty = grads[0].pow(2).sum()
    return dpteach.autograd_graph(
        penalty, module=small, replicas=replicas, names={"grad weight": grads[0]}, create_graph=(loss, grads)
    )


def test_exercise_1_accepts_the_worked_answer(penalty_graph):
    assert checks.recorded_nodes(11, "ReduceAddCoalesced", penalty_graph).ok  # Answer 1's numbers
    assert checks.recorded_nodes(11.0, " reduceaddcoalescedbackward ", penalty_graph).ok  # as typed


def test_exercise_1_names_the_slips(penalty_graph):
    found = {
        "penalty counted": checks.recorded_nodes(13, "ReduceAddCoalesced", penalty_graph),
        "slots only": checks.recorded_nodes(8, "ReduceAddCoalesced", penalty_graph),
        "one slot": checks.recorded_nodes(4, "ReduceAddCoalesced", penalty_graph),
        "count": checks.recorded_nodes(10, "ReduceAddCoalesced", penalty_graph),
        "forward node": checks.recorded_nodes(11, "Broadcast", penalty_graph),
        "name": checks.recorded_nodes(11, "Scatter", penalty_graph),
        "not an answer": checks.recorded_nodes("eleven", "Scatter", penalty_graph),
    }
    assert {k: v.problem for k, v in found.items()} == {k: k for k in found}
    assert "Pow and Sum" in found["penalty counted"].message  # says what to change
    assert not checks.recorded_nodes(..., "Scatter", penalty_graph).problem  # unset: no hint spent
    messages = three_tries(checks.recorded_nodes, 8, "ReduceAddCoalesced", penalty_graph)
    assert gives_answer_only_at_the_third(messages)
    assert "count" not in messages[0].split("Hint 1 of 2: ")[1].split(" = ")[0]  # hint 1 names the idea


# ---------------------------------------------------------------- the chapter's cells


def _cells():
    return nbformat.read(ROOT / "notebooks" / "07_double_backward.ipynb", as_version=4).cells


CALLS = {
    "ex1-check": "checks.recorded_nodes(count, makes_grad, penalty_graph)",
    "ex2-check": "checks.hvp_linear(hv1, hv2, hv_sum, v1, v2, net, x, y, moved, broadcast_bytes)",
    "ex3-check": "checks.rewire_refuses(raises, devices)",
    "ex4-check": "checks.penalty_inside(PenaltyInside, rewire, devices)",
    "ex5-check": "checks.second_backwards(does, devices)",
}


def test_each_exercise_has_a_check_cell_then_its_answer():
    cells = _cells()
    for n, (tag, call) in enumerate(CALLS.items(), start=1):
        (i,) = [i for i, c in enumerate(cells) if tag in c.metadata.get("tags", [])]
        assert cells[i].source.rstrip().splitlines()[-1] == call, tag  # the last line shows the verdict
        assert re.match(rf"<details><summary>Answer {n}</summary>", cells[i + 1].source), tag
        before = cells[i - 1].source if n == 1 else cells[i - 1].source.split("</details>")[-1]
        assert re.search(rf"^{n}\. ", before, re.M), tag  # the question sits just above its check


def test_exercise_4_stub_asks_and_does_not_give_the_recipe():
    """The stub's comments and its raise name what forward returns, not how: the answer is in Answer 4."""
    cells = _cells()
    (at,) = [i for i, c in enumerate(cells) if "ex4-check" in c.metadata.get("tags", [])]
    stub = cells[at].source
    for recipe in ("detach", "requires_grad_", "create_graph", "norm(dim=1)"):
        assert recipe not in stub, recipe
    assert "x.detach().requires_grad_()" in cells[at + 1].source  # Answer 4 has it
    question = " ".join(cells[at - 1].source.split("</details>")[-1].split())
    assert "What must `forward` do" in question and '"rewire"' in question


def test_exercise_2_cell_runs_on_three_slots_and_asks_a_prediction():
    cells = _cells()
    (cell,) = [c for c in cells if "ex2-check" in c.metadata.get("tags", [])]
    assert "[devices[0]] * 3" in cell.source and "broadcast_bytes = ...  # predict first" in cell.source
