"""The small exercises' checks (``dpteach.course.checks``): right answers pass, wrong ones say what to
change, and the hints climb a ladder: the idea first, the answer only from the third failed try."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import dpteach
from dpteach.course import checks
from dpteach.graph import compare_strategies

pytestmark = pytest.mark.usefixtures("fresh_checks")  # every test starts at hint 1


def _three_tries(call):
    return [call() for _ in range(3)]


def test_a_wrong_answer_climbs_the_hint_ladder_and_gives_the_answer_last():
    a = torch.ones(3, requires_grad=True)
    tensors = {"a": a, "b": a * 2, "c": torch.ones(3), "d": (a * 2).detach()}
    wrong = {"a": True, "b": True, "c": False, "d": False}  # b is not a leaf; c and d are
    first, second, third = _three_tries(lambda: checks.leaves(wrong, tensors))
    assert not first.ok and "3 of your 4 answers are wrong." in first.message  # how many, not which:
    assert "b, c, d" not in first.message + second.message  # four True/False answers, found in two tries
    assert "Hint 1 of 2" in first.message and "False" not in first.message.split("Hint")[1]  # no answer yet
    assert "Hint 2 of 2" in second.message
    assert "change your answer for b, c, d" in third.message  # named with the answer
    assert "The answer: a: True, b: False, c: True, d: True." in third.message
    right = checks.leaves({"a": True, "b": False, "c": True, "d": True}, tensors)
    assert right.ok and right.message.startswith("Correct!") and "Only a will get a .grad" in right.message
    assert "Hint 1 of 2" in checks.leaves(wrong, tensors).message  # a success starts the ladder again


def test_an_unset_answer_asks_for_one_and_costs_no_hint():
    assert not checks.leaves({"a": ..., "b": True}, {"a": torch.ones(1), "b": torch.ones(1)}).ok
    assert checks.one_replica_rewired(..., None, None).message.startswith("Set `grad_0_weight`")  # chapter 03
    assert checks.counter_survives(...).message.startswith("Define class MyCounter")  # chapter 05's cell
    assert checks.replicatable_scale(...).message.startswith("Define class Scale")  # chapter 04's cell
    assert (
        "Hint 1"
        in checks.mean_per_piece(3.0, [torch.ones(2)] * 2, torch.full((2,), 2.0), torch.ones(4, 1)).message
    )


def test_accumulators_counts_each_node_once():
    shared = nn.Linear(4, 4)
    model = nn.Sequential(shared, nn.Tanh(), shared)
    loss = model(torch.randn(8, 4)).pow(2).mean()
    assert checks.accumulators(2, loss, model).ok  # one weight, one bias, each used twice
    too_many = checks.accumulators(4, loss, model)
    assert not too_many.ok and "once per edge" in too_many.message and "set of the nodes" in too_many.message
    assert "too few" in checks.accumulators(1, loss, model).message


def test_accumulators_names_the_frozen_parameter_when_counted_one_per_parameter():
    shared, head = nn.Linear(4, 4), nn.Linear(4, 1)  # chapter 02's exercise 2: a shared Linear, a frozen bias
    head.bias.requires_grad_(False)
    model = nn.Sequential(shared, nn.Tanh(), shared, nn.Tanh(), head)
    loss = model(torch.randn(8, 4)).pow(2).mean()
    assert checks.accumulators(3, loss, model).ok and "frozen" in checks.accumulators(3, loss, model).message
    assert "frozen parameter" in checks.accumulators(4, loss, model).message  # one per parameter: the slip
    assert "once per edge" in checks.accumulators(5, loss, model).message  # walk prints five lines
    quoted = checks.accumulators("3", loss, model).message
    assert "not a number" in quoted and "without quotes" in quoted
    assert quoted.count("3") == 1  # the learner's own '3': the message suggests no number of its own


def _clone_setup(devices):
    model = dpteach.course.story.make_model()
    x, y = dpteach.course.story.make_data()

    def forward(replicas):
        pieces = dpteach.scatter(x, devices)
        outputs = dpteach.parallel_apply(replicas, [(p,) for p in pieces], devices=devices)
        return nn.functional.mse_loss(dpteach.gather(outputs, devices[0]), y)

    return model, x, y, forward


def test_mean_per_piece_says_a_word_is_not_a_number():
    per_replica, grad, batch = [torch.ones(2)] * 2, torch.full((2,), 2.0), torch.ones(4, 1)
    verdict = checks.mean_per_piece("two", per_replica, grad, batch)
    assert not verdict.ok and "number" in verdict.message  # a verdict, not a ValueError from float()
    quoted = checks.mean_per_piece("2", per_replica, grad, batch)
    assert not quoted.ok and "number" in quoted.message  # the right value as text is not yet the answer


def _per_piece_case(rows):
    """Real per-replica gradients of one batch's mean loss for a linear model, pieces as scatter cuts them."""
    torch.manual_seed(0)
    batch, weight = torch.randn(sum(rows), 3), torch.randn(3, requires_grad=True)
    copies = [weight.detach().clone().requires_grad_() for _ in rows]
    loss = sum(((piece @ w) ** 2).sum() for piece, w in zip(batch.chunk(len(rows)), copies)) / len(batch)
    per_replica = torch.autograd.grad(loss, copies)
    return per_replica, sum(per_replica), batch


def test_mean_per_piece_accepts_the_number_of_slots_only():
    per_replica, grad, batch = _per_piece_case([4, 4, 4])
    assert checks.mean_per_piece(3, per_replica, grad, batch).ok
    for wrong in (1 / 3, 1, 2):
        assert not checks.mean_per_piece(wrong, per_replica, grad, batch).ok
    assert "The answer: 3" in checks.mean_per_piece(0.5, per_replica, grad, batch).message  # third failure


def test_mean_per_piece_accepts_the_slot_count_for_pieces_rows_apart():
    per_replica, grad, batch = _per_piece_case([86, 86, 84])  # 256 rows on 3 slots, as Tensor.chunk cuts them
    assert checks.mean_per_piece(3, per_replica, grad, batch).ok
    assert not checks.mean_per_piece(2.8, per_replica, grad, batch).ok


def test_rewire_to_broadcast_reads_the_answer_from_the_graphs():
    devices = ["cpu", "cpu"]
    model, x, y, _ = _clone_setup(devices)
    comparison = compare_strategies(model, x, devices, loss_fn=lambda out: nn.functional.mse_loss(out, y))
    assert checks.rewire_to_broadcast(4, "BroadcastBackward", 8, comparison).ok
    assert checks.rewire_to_broadcast(4, "Broadcast", 8, comparison).ok  # the name as the pictures draw it
    assert not checks.rewire_to_broadcast(4, "ReduceAdd", 8, comparison).ok
    wrong = checks.rewire_to_broadcast(4, "BroadcastBackward", 12, comparison)
    assert "`edges_into_added`" in wrong.message and "`removed_nodes`" not in wrong.message
    assert "picture" in wrong.message or "frame" in wrong.message  # what the chapter shows: no table
    assert "table" not in checks.rewire_to_broadcast(3, "ReduceAdd", 12, comparison).message


def test_pieces_follows_torch_chunk():
    assert checks.pieces([3, 3, 3, 3, 3, 1], rows=16, slots=6).ok
    assert not checks.pieces([3, 3, 3, 3, 2, 2], rows=16, slots=6).ok
    assert "hold all 16" in checks.pieces([3, 3], rows=16, slots=6).message


def test_accumulators_reached_predict_then_check():
    devices = ["cpu", "cpu"]
    checks.reset()
    assert checks.accumulators_reached(8, devices).ok  # 4 parameters in each of 2 replicas, none the model's
    one_model = checks.accumulators_reached(4, devices)
    assert "Change `prediction`" in one_model.message and one_model.problem == "one model"
    assert checks.accumulators_reached(12, devices).problem == "model too"
    assert "whole number" in checks.accumulators_reached("one", devices).message
    checks.reset()


def test_answers_of_the_wrong_kind_are_told_what_to_give():
    assert "whole numbers" in checks.pieces(["x"], rows=16, slots=6).message  # no TypeError
    assert "whole numbers" in checks.pieces("33", rows=16, slots=6).message
    assert "True or False" in checks.leaves({"a": "yes"}, {"a": torch.ones(1)}).message
    assert "not a number" in checks.accumulators(True, None, None).message
    assert not checks._failures  # none of these costs a hint


def _leaves_behind(loss, skip):
    found, seen, todo = [], set(), [loss.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        if hasattr(fn, "variable") and id(fn.variable) not in skip:
            found.append(fn.variable)
        todo += [f for f, _ in fn.next_functions]
    return found


def test_dead_end_detector_passes_the_walk_and_says_what_a_wrong_one_misses():
    model, devices = dpteach.course.story.make_model(), ["cpu", "cpu"]
    right = lambda loss, m: _leaves_behind(loss, {id(p) for p in m.parameters()})  # noqa: E731
    assert checks.dead_ends_found(right, model, devices).ok
    every_leaf = checks.dead_ends_found(lambda loss, m: _leaves_behind(loss, set()), model, devices)
    assert not every_leaf.ok and 'under "rewire"' in every_leaf.message  # the originals are no dead ends
    assert "skip the model's own parameters" in every_leaf.message and "Hint 1 of 2" in every_leaf.message
    half_of_them = lambda loss, m: right(loss, m)[:4]  # noqa: E731 - half the dead ends
    missed = checks.dead_ends_found(half_of_them, model, devices)
    assert not missed.ok and "you missed ['replica" in missed.message and "Hint 2 of 2" in missed.message
    assert "returned None" in checks.dead_ends_found(lambda loss, m: None, model, devices).message
    assert checks.dead_ends_found(..., model, devices).message.startswith("Define find_dead_ends")
    assert not checks.dead_ends_found(lambda loss, m: [], model, devices).ok  # "clone" has eight
