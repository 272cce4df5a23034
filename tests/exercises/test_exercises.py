"""The exercises' checks: "Correct!" on the worked solutions, "not written yet" on the stubs, the right kind of problem on typical mistakes.

Every wrong answer here is one a learner plausibly writes; each test asserts the check fails and
finds the kind of problem it has (``result.kinds``, a code such as ``"fresh_leaf"``), so a check
that goes soft, or blames the wrong thing, fails a test, and rewording a sentence does not.
"""

from __future__ import annotations

import dataclasses
from copy import deepcopy
from pathlib import Path

import nbformat
import pytest
import torch
from torch import nn
from torch.autograd import Function

import dpteach
from dpteach import comm, exercises
from dpteach.exercises import solutions as S
from dpteach.exercises import stubs as T
from dpteach.exercises._records import by_task
from dpteach.functions import Gather, Scatter

ROOT = Path(__file__).resolve().parents[2]

SOLUTIONS = by_task(S)  # every task's worked answer, named by its record
STUBS = by_task(T)


def text(result) -> str:
    return str(result)


@pytest.fixture(autouse=True)
def first_try():
    exercises.forget_failures()  # each test is a learner's first try: hints start at their first step
    yield
    exercises.forget_failures()


def assert_fails_with(result, *kinds):
    """The check failed, found every kind of problem in ``kinds``, and says what to change for each."""
    assert not result.passed, (
        f"the check passed a wrong answer:\n{result}"
    )  # a wrong answer is never Correct!
    for kind in kinds:
        assert kind in result.kinds, f"expected a {kind!r} problem in {result.kinds}:\n{result}"
    assert result.hints, str(result)  # what to change


# --------------------------------------------------------------------------------------------
# Solutions, stubs, and what every check promises
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", list(SOLUTIONS))
def test_solution_is_correct(key):
    result = exercises.check(key, *SOLUTIONS[key])
    assert result.passed, str(result)  # the worked solution passes every part of its check
    assert str(result).startswith("Correct!")  # and the learner reads "Correct!" first


@pytest.mark.parametrize("key", list(STUBS))
def test_stub_is_reported_not_implemented(key):
    result = exercises.check(key, *STUBS[key])  # must not raise
    task = exercises.TASKS[key]
    assert not result.passed and not result.implemented  # an untouched stub is "not yet", not a crash
    assert text(result).startswith(f"Task {task.number} ({task.title}): not written yet")  # names the task
    assert "still raises" not in text(result)  # the stub cell's error already shows its words: not repeated
    assert text(result).count("Hint:") == 1  # what to do, once


def test_a_learners_own_not_implemented_error_is_shown_in_the_check():
    def own(network, devices, detach=False):
        raise NotImplementedError("my helper is not done")

    result = exercises.check("batchnorm", own)
    assert not result.implemented  # reported as not written, not as a wrong answer
    assert "my helper is not done" in text(result)  # its own words, shown


@pytest.mark.parametrize("key", list(STUBS))
def test_stub_fails_loudly_with_its_task_name(key):
    task = exercises.TASKS[key]
    with pytest.raises(NotImplementedError, match=rf"Task {task.number} \({task.title}\)"):
        exercises.try_it(key, *STUBS[key])  # the stub cell's last line raises, naming the task


@pytest.mark.parametrize("key", list(SOLUTIONS))
def test_try_it_runs_a_solution_quietly(key, capsys):
    exercises.try_it(key, *SOLUTIONS[key])
    assert capsys.readouterr().out.startswith("Tried it:")  # it says what it ran


@pytest.mark.parametrize("key", list(SOLUTIONS))
def test_checks_never_raise_on_nonsense(key):
    result = exercises.check(key, *([None] * len(SOLUTIONS[key])))
    assert not result.passed and result.kinds == ["usage"]  # says what to pass


def test_a_crash_in_learner_code_is_explained_with_its_line():
    class Crashes(Function):
        @staticmethod
        def forward(ctx, original, *copies):
            return tuple(c.detach() for c in copies)

        @staticmethod
        def backward(ctx, *grads):
            return grads[0].reshape(7) + 1, *([None] * len(grads))  # a learner's typo

    result = exercises.check_rewire(Crashes)
    assert_fails_with(result, "error")
    assert isinstance(result.error, RuntimeError) and "Crashes.backward" in text(result)  # where
    assert "reshape(7)" in text(result)  # and which line of theirs


def test_result_shows_itself_as_html():
    good = exercises.check("scatter_gather", *SOLUTIONS["scatter_gather"])
    bad = exercises.check("scatter_gather", *STUBS["scatter_gather"])
    assert "Correct!" in good._repr_html_() and "#1a7f37" in good._repr_html_()  # green, and says Correct!
    assert "<code>" in bad._repr_html_() and "yet" in bad._repr_html_()  # code spans, and "not yet"


def test_checks_leave_the_learners_random_state_and_threads_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    threads = torch.get_num_threads()
    exercises.check("clone_bug", *SOLUTIONS["clone_bug"])
    assert torch.equal(torch.rand(3), expected)  # the check used its own random stream
    assert torch.get_num_threads() == threads  # and gave back the thread count it borrowed


# --------------------------------------------------------------------------------------------
# Task 1: find the bug in clone-based replicate
# --------------------------------------------------------------------------------------------


def clone_replicate_with(make_copy):
    """The stub's replicate_by_clone with its one line filled in by ``make_copy(param, device)``."""

    def replicate_by_clone(network, devices, detach=False):
        replicas = []
        for device in devices:
            replica = deepcopy(network).to(device)
            for original, twin in zip(network.modules(), replica.modules()):
                for key, param in original._parameters.items():
                    if param is None:
                        continue
                    copy = make_copy(param, device)
                    twin._parameters.pop(key)
                    setattr(twin, key, copy)
            replicas.append(replica)
        return replicas

    return replicate_by_clone


@pytest.mark.parametrize(
    "make_copy", [lambda p, d: p.detach().clone().to(d), lambda p, d: p.data.clone().to(d)]
)
def test_try_it_says_what_to_change_for_a_copy_without_history(make_copy, capsys):
    exercises.try_it("clone_bug", clone_replicate_with(make_copy))  # backward would raise: try_it must not
    out = capsys.readouterr().out
    assert out.startswith("Not yet: the loss does not require grad, so `backward()` cannot run")
    assert "replica 1's `0.weight` has no `grad_fn`" in out  # what is wrong, named
    assert "one operation on `param` itself that autograd records" in out  # and what to change
    assert "Change your code, then run this cell again." in out


def test_clone_the_broken_line_itself():
    result = exercises.check_clone_bug(
        clone_replicate_with(lambda p, d: nn.Parameter(p.detach().clone().to(d)))
    )
    assert_fails_with(result, "fresh_leaf")  # the edge is lost


def test_try_it_calls_a_fresh_leaf_copy_the_bug_not_a_success(capsys):
    exercises.try_it("clone_bug", clone_replicate_with(lambda p, d: nn.Parameter(p.clone().to(d))))
    out = capsys.readouterr().out
    assert out.startswith("Not yet:") and "Now run the check" not in out and "without an error" not in out
    assert "the original's `.grad` is still None for `0.weight`" in out  # the symptom, as the problem
    assert "fresh leaf" in out and "Change your code, then run this cell again." in out  # and its cause


def test_clone_the_libraries_broken_strategy():
    result = exercises.check_clone_bug("clone")
    assert_fails_with(result, "fresh_leaf", "grads_none")


def test_clone_to_without_copy_shares_memory(capsys):
    result = exercises.check_clone_bug(
        clone_replicate_with(lambda p, d: p.to(d))
    )  # .to is a no-op on the same device
    assert_fails_with(result, "shared")
    exercises.try_it("clone_bug", clone_replicate_with(lambda p, d: p.to(d)))  # must not call it fine
    out = capsys.readouterr().out
    assert out.startswith("Not yet:") and "share the original's memory" in out


def test_clone_then_to_passes_and_points_to_task_6():
    result = exercises.check_clone_bug(clone_replicate_with(lambda p, d: p.clone().to(d)))
    assert result.passed
    assert "CloneBackward0, then ToCopyBackward0" in str(result) and "Task 6" in str(result)
    one = exercises.check_clone_bug(clone_replicate_with(lambda p, d: p.to(d, copy=True)))
    assert one.passed and "Task 6" not in str(one)  # one copy: nothing to point to


def test_clone_that_ignores_the_device_fails_on_a_meta_slot():
    # every CPU slot hides this: param.clone() keeps the edge and owns its memory, on param's device
    result = exercises.check_clone_bug(clone_replicate_with(lambda p, d: p.clone()))
    assert_fails_with(result, "device")


def test_clone_under_no_grad():
    def copy_without_grad(p, d):
        with torch.no_grad():
            return p.to(d, copy=True)

    assert_fails_with(exercises.check_clone_bug(clone_replicate_with(copy_without_grad)), "no_grad")


def test_clone_edge_to_a_replica_leaf_instead_of_the_original():
    result = exercises.check_clone_bug(
        clone_replicate_with(lambda p, d: nn.Parameter(p.detach()).to(d, copy=True))
    )
    assert_fails_with(result, "wrong_leaf")  # an edge, but to the wrong leaf


def test_clone_the_library_strategies_that_work_pass():
    assert exercises.check_clone_bug("rewire").passed  # the real fixes pass the same check
    assert exercises.check_clone_bug("broadcast").passed


# --------------------------------------------------------------------------------------------
# Task 2: rewire gradient edges
# --------------------------------------------------------------------------------------------


def reduce_add_with(backward, forward=None):
    class ReduceAdd(Function):
        @staticmethod
        def forward(ctx, original, *copies):
            ctx.destination = original.device
            return forward(original, copies) if forward else tuple(c.detach() for c in copies)

    ReduceAdd.backward = staticmethod(backward)
    return ReduceAdd


def test_rewire_gradients_handed_to_the_replicas_instead_of_the_original():
    wrong = reduce_add_with(lambda ctx, *grads: (None,) + grads)
    assert_fails_with(exercises.check_rewire(wrong), "sum_missing")  # edges to the replica, not the original


def test_rewire_sum_on_the_wrong_device():
    wrong = reduce_add_with(lambda ctx, *grads: (sum(grads),) + (None,) * len(grads))  # no .to(destination)
    result = exercises.check_rewire(wrong)
    assert_fails_with(result, "sum_device")
    assert "no data: it stands in for a second GPU" in str(result)  # the message says what `meta` is


@pytest.mark.parametrize("where", ["on the node's device", "moved"])
def test_rewire_sum_written_into_an_incoming_gradient_is_named_as_such(where):
    def in_place(ctx, *grads):
        total = grads[0] if where == "on the node's device" else grads[0].to(ctx.destination)
        for g in grads[1:]:
            total += g.to(total.device)  # into the first gradient autograd handed in
        return (total.to(ctx.destination),) + (None,) * len(grads)

    result = exercises.check_rewire(reduce_add_with(in_place))
    assert_fails_with(result, "grad_inplace")
    assert "sum_device" not in result.kinds and "error" not in result.kinds  # not blamed on the device
    assert "writes into the gradient it receives for copy 0" in str(result) and "new tensor" in str(result)
    assert "another device" not in str(result)


def test_rewire_mean_instead_of_sum():
    def mean(ctx, *grads):
        return (sum(g.to(ctx.destination) for g in grads) / len(grads),) + (None,) * len(grads)

    result = exercises.check_rewire(reduce_add_with(mean))
    assert_fails_with(result, "sum_divided")  # a third of the sum
    assert "7g/3, the mean" in str(result) and "do not divide" in str(result)


@pytest.mark.parametrize("kept, said", [(slice(0, 1), "g only"), (slice(1, None), "2g + 4g only")])
def test_rewire_dropped_copies_are_named_not_called_a_division(kept, said):
    def some(ctx, *grads):
        return (sum(g.to(ctx.destination) for g in grads[kept]),) + (None,) * len(grads)

    result = exercises.check_rewire(reduce_add_with(some))
    assert_fails_with(result, "sum_dropped")
    assert f"the original got {said}" in str(result) and "divide" not in str(result)


def test_rewire_forward_returns_copies_of_the_original_not_the_replicas():
    right = SOLUTIONS["rewire"][0].backward
    wrong = reduce_add_with(
        right, forward=lambda original, copies: tuple(original.detach().clone() for _ in copies)
    )
    assert_fails_with(exercises.check_rewire(wrong), "outputs")


def test_rewire_forward_returns_too_few_outputs():
    right = SOLUTIONS["rewire"][0].backward
    wrong = reduce_add_with(right, forward=lambda original, copies: tuple(c.detach() for c in copies[:1]))
    assert_fails_with(exercises.check_rewire(wrong), "outputs")


# --------------------------------------------------------------------------------------------
# Task 3: a Broadcast / ReduceAddCoalesced pair that survives double backward
# --------------------------------------------------------------------------------------------


def pair(broadcast_backward=None, reduce_forward=None, reduce_backward=None, broadcast_forward=None):
    """The solution's two classes, as a learner's cell defines them (each names the other), with one method swapped."""

    class Broadcast(Function):
        forward = staticmethod(broadcast_forward or S.MyBroadcast.forward)

        @staticmethod
        def backward(ctx, *grads):
            if broadcast_backward:
                return broadcast_backward(ctx, grads, ReduceAddCoalesced)
            return (None,) + ReduceAddCoalesced.apply(ctx.input_device, ctx.num_inputs, *grads)

    class ReduceAddCoalesced(Function):
        forward = staticmethod(reduce_forward or S.MyReduceAddCoalesced.forward)

        @staticmethod
        def backward(ctx, *grads):
            if reduce_backward:
                return reduce_backward(ctx, grads, Broadcast)
            return (None, None) + Broadcast.apply(ctx.devices, *grads)

    return Broadcast, ReduceAddCoalesced


def raw_comm_sum(ctx, grads, partner):
    groups = [grads[i : i + ctx.num_inputs] for i in range(0, len(grads), ctx.num_inputs)]
    return (None,) + tuple(comm.reduce_add_coalesced(groups, ctx.input_device))  # a raw comm call, no partner


def no_grad_sum(ctx, grads, partner):
    with torch.no_grad():  # the partner's apply, but outside autograd
        return (None,) + partner.apply(ctx.input_device, ctx.num_inputs, *grads)


def raw_comm_copy(ctx, grads, partner):
    return (None, None) + tuple(t for slot in comm.broadcast_coalesced(grads, ctx.devices) for t in slot)


def first_slot_only(ctx, destination, num_inputs, *grads):
    ctx.devices = [grads[i].device for i in range(0, len(grads), num_inputs)]
    return tuple(g.clone() for g in grads[:num_inputs])  # forgets to add the other slots


def doubled(ctx, grads, partner):
    return (None, None) + partner.apply(ctx.devices, *(2 * g for g in grads))  # twice the gradient of a sum


def test_broadcast_backward_with_raw_comm_is_not_the_partner():
    result = exercises.check_broadcast_pair(*pair(broadcast_backward=raw_comm_sum))
    assert_fails_with(result, "not_differentiable")  # comm moves data and records no graph


def test_broadcast_backward_under_no_grad_is_not_differentiable():
    result = exercises.check_broadcast_pair(*pair(broadcast_backward=no_grad_sum))
    assert_fails_with(result, "not_differentiable")


def test_reduce_backward_with_raw_comm_is_not_differentiable():
    result = exercises.check_broadcast_pair(*pair(reduce_backward=raw_comm_copy))
    assert_fails_with(result, "not_differentiable")


def plain_sum(ctx, grads, partner):  # right and differentiable, but no partner node
    n = ctx.num_inputs
    return (None,) + tuple(sum(g.to(ctx.input_device) for g in grads[k::n]) for k in range(n))


def plain_copies(ctx, grads, partner):  # right and differentiable, but no partner node
    return (None, None) + tuple(g.to(d) for d in ctx.devices for g in grads)


@pytest.mark.parametrize("side", ["Broadcast", "ReduceAddCoalesced"])
def test_backward_of_plain_differentiable_ops_is_asked_for_the_partner(side):
    swapped = {"broadcast_backward": plain_sum} if side == "Broadcast" else {"reduce_backward": plain_copies}
    result = exercises.check_broadcast_pair(*pair(**swapped))
    assert_fails_with(result, "partner")


def test_reduce_that_forgets_the_other_slots():
    result = exercises.check_broadcast_pair(*pair(reduce_forward=first_slot_only))
    assert_fails_with(result, "broadcast_sum", "sum")  # both sides of the pair


def input_by_input(ctx, devices, *inputs):
    ctx.input_device, ctx.num_inputs = inputs[0].device, len(inputs)
    per_slot = comm.broadcast_coalesced(inputs, devices)
    return tuple(slot[k] for k in range(len(inputs)) for slot in per_slot)  # input-major: not slot by slot


def test_broadcast_outputs_input_by_input_are_out_of_order():
    result = exercises.check_broadcast_pair(*pair(broadcast_forward=input_by_input))
    assert_fails_with(result, "layout")


def test_try_it_says_the_broadcast_outputs_are_out_of_order(capsys):
    exercises.try_it("broadcast_pair", *pair(broadcast_forward=input_by_input))  # no replica's traceback
    out = capsys.readouterr().out
    assert out.startswith("Not yet: output 1 of Broadcast.apply(devices, a, b) should be slot 0's copy of b")
    assert "outputs go slot by slot: every input's copy on slot 0" in out  # what to change
    assert "Change your code, then run this cell again." in out


def test_try_it_runs_a_step_with_the_broadcast_outputs_in_order(capsys):
    exercises.try_it("broadcast_pair", *pair())
    assert capsys.readouterr().out.startswith(
        "Tried it: one DataParallel step on 2 CPU slots ran without an error"
    )


def test_broadcast_pair_of_the_library_passes():
    assert exercises.check_broadcast_pair(
        dpteach.functions.Broadcast, dpteach.functions.ReduceAddCoalesced
    ).passed


def test_reduce_backward_that_scales_the_gradient():
    result = exercises.check_broadcast_pair(*pair(reduce_backward=doubled))
    assert_fails_with(result, "sum_backward")  # the backward scales, the forward's sums are right
    assert "sum" not in result.kinds


def one_sum_short(ctx, destination, num_inputs, *grads):
    ctx.devices = [grads[i].device for i in range(0, len(grads), num_inputs)]
    groups = [grads[i : i + num_inputs] for i in range(0, len(grads), num_inputs)]
    return tuple(comm.reduce_add_coalesced(groups, destination))[:-1]  # the last input's sum forgotten


def test_too_few_sums_are_blamed_on_reduce_forward_by_try_it_and_the_check_alike(capsys):
    wrong = pair(reduce_forward=one_sum_short)  # Broadcast's methods are right: they must not be blamed
    result = exercises.check_broadcast_pair(*wrong)
    assert_fails_with(result, "sum")
    assert (
        result.kinds == ["sum"] and "grad_count" not in result.kinds
    )  # not "Broadcast.backward returned ..."
    exercises.try_it("broadcast_pair", *wrong)
    out = capsys.readouterr().out
    assert out.startswith("Not yet: ReduceAddCoalesced.forward returned 1 tensor(s) for num_inputs=2"), out
    assert result.messages[0] in out  # the same sentence, the same counts, in both


def test_the_pair_helper_builds_a_correct_pair():
    assert exercises.check_broadcast_pair(
        *pair()
    ).passed  # so each test above differs from a solution by one method


# --------------------------------------------------------------------------------------------
# Task 4: scatter and gather nested inputs
# --------------------------------------------------------------------------------------------


def scatter_with(dataclass_rule=None, namedtuple_rule=None, detach=False):
    """The solution's scatter with one rule replaced by a typical mistake."""

    def scatter(inputs, devices, dim=0):
        def scatter_map(obj):
            if isinstance(obj, torch.Tensor):
                return list(Scatter.apply(devices, None, dim, obj.detach() if detach else obj))
            if isinstance(obj, tuple) and hasattr(obj, "_fields"):
                if namedtuple_rule:
                    return namedtuple_rule(obj, scatter_map)
                return [type(obj)(*f) for f in zip(*map(scatter_map, obj))]
            if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
                if dataclass_rule:
                    return dataclass_rule(obj, scatter_map, devices)
                names = [f.name for f in dataclasses.fields(obj)]
                return [
                    dataclasses.replace(obj, **dict(zip(names, v)))
                    for v in zip(*(scatter_map(getattr(obj, n)) for n in names))
                ]
            if isinstance(obj, tuple) and obj:
                return list(zip(*map(scatter_map, obj)))
            if isinstance(obj, list) and obj:
                return [list(v) for v in zip(*map(scatter_map, obj))]
            if isinstance(obj, dict) and obj:
                return [type(obj)(zip(obj, v)) for v in zip(*map(scatter_map, obj.values()))]
            return [obj for _ in devices]

        return scatter_map(inputs)

    return scatter


def test_scatter_that_passes_dataclasses_through_whole():
    whole = scatter_with(
        dataclass_rule=lambda obj, _, devices: [obj for _ in devices]
    )  # torch's behaviour, #41327
    result = exercises.check_scatter_gather(whole, S.gather)
    assert_fails_with(result, "rows")


def test_scatter_that_drops_dataclass_fields():
    def tensors_only(obj, scatter_map, devices):
        tensors = {
            f.name: getattr(obj, f.name)
            for f in dataclasses.fields(obj)
            if isinstance(getattr(obj, f.name), torch.Tensor)
        }
        return [type(obj)(**dict(zip(tensors, v))) for v in zip(*map(scatter_map, tensors.values()))]

    result = exercises.check_scatter_gather(scatter_with(dataclass_rule=tensors_only), S.gather)
    assert_fails_with(result, "dropped")  # the non-tensor field is gone


def test_scatter_that_turns_namedtuples_into_tuples():
    as_tuple = scatter_with(namedtuple_rule=lambda obj, scatter_map: list(zip(*map(scatter_map, obj))))
    result = exercises.check_scatter_gather(as_tuple, S.gather)
    assert_fails_with(result, "type")


def test_scatter_that_detaches():
    result = exercises.check_scatter_gather(scatter_with(detach=True), S.gather)
    assert_fails_with(result, "grad")


def test_scatter_that_gives_empty_containers_no_pieces():
    def zip_all(inputs, devices, dim=0):  # zip over an empty container's items gives zero pieces
        def scatter_map(obj):
            if isinstance(obj, torch.Tensor):
                return list(Scatter.apply(devices, None, dim, obj))
            if isinstance(obj, tuple) and hasattr(obj, "_fields"):
                return [type(obj)(*fields) for fields in zip(*map(scatter_map, obj))]
            if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
                names = [f.name for f in dataclasses.fields(obj)]
                per_slot = zip(*(scatter_map(getattr(obj, name)) for name in names))
                return [dataclasses.replace(obj, **dict(zip(names, values))) for values in per_slot]
            if isinstance(obj, (tuple, list)):
                return [type(obj)(values) for values in zip(*map(scatter_map, obj))]
            if isinstance(obj, dict):
                return [type(obj)(zip(obj, values)) for values in zip(*map(scatter_map, obj.values()))]
            return [obj for _ in devices]

        return scatter_map(inputs)

    result = exercises.check_scatter_gather(zip_all, S.gather)
    assert not result.passed  # (x, y, (), [], {}) came back as no pieces at all


def test_the_hint_on_chunk_comes_only_where_a_tensor_gave_fewer_pieces():
    def empty(inputs, devices, dim=0):
        return []  # a scatter that returns an empty container: fewer pieces than chunk gives, no hint on chunk

    def one_per_slot(inputs, devices, dim=0):  # pads to one piece per slot where chunk gave fewer
        pieces = S.scatter(inputs, devices, dim)
        return pieces + pieces[-1:] * (len(devices) - len(pieces))

    assert "count" not in exercises.check_scatter_gather(empty, S.gather).kinds
    assert_fails_with(exercises.check_scatter_gather(empty, S.gather), "pieces")
    padded = exercises.check_scatter_gather(one_per_slot, S.gather)  # only "2 rows over 4 slots" differs
    assert_fails_with(padded, "count")
    assert "chunk" in " ".join(padded.hints) and "pieces" not in padded.kinds
    assert "chunk" not in " ".join(exercises.check_scatter_gather(empty, S.gather).hints)


def test_gather_that_keeps_dicts_per_slot():
    def lazy_gather(outputs, target_device, dim=0):
        if isinstance(outputs[0], torch.Tensor):
            return Gather.apply(target_device, dim, *outputs)
        return list(outputs)  # containers left as one per slot

    result = exercises.check_scatter_gather(S.scatter, lazy_gather)
    assert_fails_with(result, "type")


# --------------------------------------------------------------------------------------------
# Task 5: keep BatchNorm statistics from slot 0
# --------------------------------------------------------------------------------------------


def test_batchnorm_rewire_as_it_is_copies_slot0_buffers():
    result = exercises.check_batchnorm("rewire")  # PR #20910 left buffers deep-copied (#21144)
    assert_fails_with(result, "buffer_copied")
    assert result.kinds == ["buffer_copied"] and len(result.hints) == 1  # the lost statistics follow from it


def test_batchnorm_buffers_shared_on_every_slot():
    def every_slot(network, devices, detach=False):
        replicas = dpteach.replicate(network, devices, detach, strategy="rewire")
        for replica in replicas:
            for name, buffer in network.named_buffers():
                owner, _, key = name.rpartition(".")
                replica.get_submodule(owner)._buffers[key] = buffer
        return replicas

    assert_fails_with(exercises.check_batchnorm(every_slot), "buffer_shared")


def test_batchnorm_on_top_of_clone_loses_gradients():
    def on_clone(network, devices, detach=False):
        replicas = dpteach.replicate(network, devices, detach, strategy="clone")
        for name, buffer in network.named_buffers():
            owner, _, key = name.rpartition(".")
            replicas[0].get_submodule(owner)._buffers[key] = buffer
        return replicas

    assert_fails_with(exercises.check_batchnorm(on_clone), "fresh_leaf")


def test_batchnorm_cloned_buffers_on_slot0():
    def cloned(network, devices, detach=False):
        replicas = dpteach.replicate(network, devices, detach, strategy="rewire")
        for name, buffer in network.named_buffers():
            owner, _, key = name.rpartition(".")
            replicas[0].get_submodule(owner)._buffers[key] = buffer.clone()  # a copy, not the buffer
        return replicas

    assert_fails_with(exercises.check_batchnorm(cloned), "buffer_copied")


def test_batchnorm_values_copied_into_slot0_are_told_the_copy_is_the_slip():
    """`.copy_` gives slot 0's copies the original's values: the statistics are lost, and the hint must say
    slot 0 holds a copy, not blame the later slots, which this answer never touched."""
    copied = slot0_buffers_by(lambda module, key, buffer: module._buffers[key].copy_(buffer))
    exercises.forget_failures()
    first, second = (exercises.check_batchnorm(copied) for _ in range(2))
    exercises.forget_failures()
    for result in (first, second):
        assert_fails_with(result, "buffer_copied")
        assert "stats" not in result.kinds and "later slots" not in str(result), str(result)
    assert "`.copy_`) is still a copy" in str(first), str(first)  # the idea names the slip among its kind


def test_batchnorm_a_dotted_name_on_the_top_module_is_told_it_is_a_path():
    """`replicas[0]._buffers["1.running_mean"] = buffer` puts the buffer where forward never reads it: the
    check names that, not "a copy" alone, and its hint names the idea (a path), not the code."""

    def dotted(network, devices, detach=False):
        replicas = dpteach.replicate(network, devices, detach, strategy="rewire")
        for name, buffer in network.named_buffers():
            replicas[0]._buffers[name] = buffer
        return replicas

    result = exercises.check_batchnorm(dotted)
    assert result.kinds == ["buffer_dotted"], str(result)
    assert "under the name `1.running_mean`" in str(result) and "is a path" in result.hints[0]
    assert "rpartition" not in result.hints[0]


def test_batchnorm_the_library_broadcast_strategy_passes():
    assert exercises.check_batchnorm("broadcast").passed  # Python's replicate.py shares slot 0's buffers


def slot0_buffers_by(put):
    """Task 5's answer with its one line, putting the original's buffer into slot 0's module, as ``put``."""

    def keep_bn_statistics(network, devices, detach=False):
        replicas = dpteach.replicate(network, devices, detach, strategy="rewire")
        for name, buffer in network.named_buffers():
            owner, _, key = name.rpartition(".")
            put(replicas[0].get_submodule(owner), key, buffer)
        return replicas

    return keep_bn_statistics


def test_batchnorm_a_buffer_written_past_the_registry_fails():
    # forward reads module.__dict__ first, so the statistics do land in the model; but the replica's
    # registered buffer (what replicate.py sets, and named_buffers / state_dict / .to use) is still the copy
    loophole = slot0_buffers_by(lambda module, key, buffer: module.__dict__.__setitem__(key, buffer))
    result = exercises.check_batchnorm(loophole)
    assert_fails_with(result, "buffer_unregistered")
    assert result.kinds == ["buffer_unregistered"]  # not a copy problem, not lost statistics: the registry


@pytest.mark.parametrize(
    "put",
    [lambda module, key, buffer: module._buffers.__setitem__(key, buffer), setattr],  # setattr registers it
    ids=["_buffers", "setattr"],
)
def test_batchnorm_a_buffer_put_in_the_registry_passes(put):
    result = exercises.check_batchnorm(slot0_buffers_by(put))
    assert result.passed, str(result)


# --------------------------------------------------------------------------------------------
# Sources for notebook cells, and the two notebooks
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", list(STUBS))
def test_stub_source_is_a_cell_that_fails_loudly(key):
    namespace: dict = {}
    with pytest.raises(NotImplementedError, match=f"Task {exercises.TASKS[key].number}"):
        exec(compile(exercises.stub_source(key), f"<stub {key}>", "exec"), namespace)  # the cell raises
    assert exercises.check_source(key).startswith("exercises.check_")  # its check cell names the check


@pytest.mark.parametrize("key", list(SOLUTIONS))
def test_solution_source_is_a_cell_whose_check_passes(key, capsys):
    namespace: dict = {}
    exec(compile(exercises.solution_source(key), f"<solution {key}>", "exec"), namespace)  # runs as a cell
    result = eval(exercises.check_source(key), namespace)
    assert result.passed, str(result)  # the code shown in the solutions notebook is itself correct


def test_unknown_exercise_names_the_valid_ones():
    with pytest.raises(KeyError, match="'rewire'"):
        exercises.stub_source("rewrite")


NB = ROOT / "notebooks" / "11_exercises.ipynb"
SOLUTIONS_NB = ROOT / "notebooks" / "solutions" / "11_exercises_solutions.ipynb"


def _cells(path, role):
    nb = nbformat.read(path, as_version=4)
    return {
        c.metadata["dpteach"]["exercise"]: c
        for c in nb.cells
        if c.cell_type == "code" and c.metadata.get("dpteach", {}).get("role") == role
    }


def test_exercises_notebook_holds_every_stub_and_check():
    stubs, checks = _cells(NB, "stub"), _cells(NB, "check")
    assert set(stubs) == set(checks) == set(exercises.TASKS)  # one stub and one check per task
    for key, cell in stubs.items():
        assert cell.source == exercises.stub_source(key)  # the cell is the library's stub, verbatim
        assert "raises-exception" in cell.metadata.get("tags", [])  # so a headless run expects its error
        assert checks[key].source == exercises.check_source(key)
        assert "raises-exception" not in checks[key].metadata.get("tags", [])  # a check never raises


def test_solutions_notebook_holds_every_solution():
    solutions, checks = _cells(SOLUTIONS_NB, "solution"), _cells(SOLUTIONS_NB, "check")
    assert set(solutions) == set(checks) == set(exercises.TASKS)
    for key, cell in solutions.items():
        assert cell.source == exercises.solution_source(key)  # the code shown is the code tested above


@pytest.mark.notebook
def test_notebooks_run_and_checks_answer():
    from executed import executed  # the run tests/course/test_notebooks.py shares: each notebook runs once

    for path, _role, expected in (
        (SOLUTIONS_NB, "solution", "Correct!"),
        (NB, "stub", "not written yet (see the cell above)"),
    ):
        nb, _, _ = executed(path)
        checks = [c for c in nb.cells if c.metadata.get("dpteach", {}).get("role") == "check"]
        assert len(checks) == len(exercises.TASKS)
        for cell in checks:
            shown = "".join(o.get("data", {}).get("text/plain", "") for o in cell.outputs)
            key = cell.metadata["dpteach"]["exercise"]
            assert expected in shown, f"{path.name}, {key}: {shown}"  # every check answers, as expected
        errors = [c for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
        tagged = [c for c in nb.cells if "raises-exception" in c.metadata.get("tags", [])]
        assert len(errors) == len(tagged)  # the only errors are the stubs', which are tagged


# --------------------------------------------------------------------------------------------
# Hints in steps, and errors that say what to change
# --------------------------------------------------------------------------------------------

WRONG_FIRST_TRIES = {  # a typical first wrong answer per task whose hint once handed over the answer
    "clone_bug": (clone_replicate_with(lambda p, d: nn.Parameter(p.detach().clone().to(d))),),
    "broadcast_pair": pair(reduce_forward=first_slot_only),
    "batchnorm": ("rewire",),
}
ANSWER_CODE = (
    "clone().to(device)",
    "copy=True",
    "get_submodule(owner)._buffers[key] = buffer",
    "range(0, len(grads), num_inputs)",
)


@pytest.mark.parametrize("key", list(WRONG_FIRST_TRIES))
def test_the_first_hint_names_the_idea_and_the_answer_comes_after_repeated_failures(key):
    tries = [exercises.check(key, *WRONG_FIRST_TRIES[key]) for _ in range(3)]
    first, second, third = (" ".join(r.hints) for r in tries)
    assert not any(code in first for code in ANSWER_CODE), first  # the idea, not the code
    assert first != second != third  # one step further on each failure
    assert "solution_source" not in first + second and f"solution_source({key!r})" in third  # offered third


def test_each_kind_of_mistake_climbs_its_own_steps():
    copied = [exercises.check_batchnorm("rewire") for _ in range(2)]  # buffer_copied (its hint first), twice
    assert [r.hints[0][:13] for r in copied] == ["(step 1 of 3)", "(step 2 of 3)"]
    other = exercises.check_batchnorm(  # a different mistake: its own first step, not a step further
        slot0_buffers_by(lambda module, key, buffer: module.__dict__.__setitem__(key, buffer))
    )
    assert other.kinds == ["buffer_unregistered"] and other.hints[0].startswith("(step 1 of 2)")
    # the third failed check of the task, whatever its mistakes, offers the worked answer
    assert "solution_source('batchnorm')" in other.hints[-1] and "3 failed checks" in other.hints[-1]


def test_no_step_further_is_promised_once_the_last_step_is_shown():
    results = [exercises.check_batchnorm("rewire") for _ in range(4)]
    assert [r.hints[0][:13] for r in results] == ["(step 1 of 3)", "(step 2 of 3)"] + ["(step 3 of 3)"] * 2
    # a hint's "(step n of m)" says what is left; no extra line talks about the hints themselves
    assert not any("one step further" in h for r in results[:2] for h in r.hints)
    for r in results[2:]:
        shown = " ".join(r.hints)
        assert "one step further" not in shown and "still stuck" not in shown  # the code is already shown
        assert "solution_source('batchnorm')" in shown


def test_a_wrong_call_is_not_a_try():
    for _ in range(3):
        exercises.check_batchnorm()  # no answer passed: a usage problem
    assert not any("solution_source" in h for h in exercises.check_batchnorm("rewire").hints)


def test_a_repeated_problem_says_what_its_repeats_are():
    from dpteach.exercises._feedback import Findings

    findings = Findings(exercises.TASKS["batchnorm"], {})
    for i in range(4):
        findings.problem("missing", f"widget {i} is missing", "widgets")
    for kind in ("device", "shared", "output"):
        findings.problem(kind, f"a {kind} problem")
    result = findings.result()
    assert result.messages[0] == "widget 0 is missing (the same problem in 3 more widgets)"  # what they are
    assert len(result.messages) == 3 < len(result.kinds) == 4  # the first three, said ...
    assert "4 problems found" in result.headline and "first 3" in result.headline  # ... and the count plain
    assert len(result.hints) >= 3  # one hint for each problem shown


def test_every_hint_says_its_step_and_a_long_run_of_repeats_is_not_counted_out():
    from dpteach.exercises._feedback import Findings

    findings = Findings(exercises.TASKS["batchnorm"], {})
    for i in range(12):
        findings.problem("device", f"widget {i} is on the wrong device", "widgets")
    result = findings.result()
    assert result.messages[0].endswith("(the same problem in many more widgets)")  # not "11 more"
    assert result.hints == [
        "(step 1 of 1) " + exercises._feedback.COMMON_HINTS["device"]
    ]  # one step, labelled
    shown = exercises.check_clone_bug("clone")  # the chapter's demo: every hint labelled
    assert shown.hints and all(h.startswith("(step ") for h in shown.hints), shown.hints


def test_passes_asks_a_check_aside():
    exercises.check_batchnorm("rewire")  # one failed try: its hint at step 1, one try counted
    before = {k: dict(v) for k, v in exercises._feedback._failures.items()}
    assert not exercises.passes("batchnorm", "rewire") and exercises.passes(
        "batchnorm", *SOLUTIONS["batchnorm"]
    )
    assert exercises._feedback._failures == before  # neither a failure nor a pass changed the counts
    assert (
        exercises.check_batchnorm("rewire").hints[0].startswith("(step 2 of 3)")
    )  # the next real try climbs


def test_a_hint_not_shown_does_not_climb():
    from dpteach.exercises._feedback import Findings

    for _ in range(2):  # buffer_copied is found fourth: not shown, so its steps do not move
        findings = Findings(exercises.TASKS["batchnorm"], {})
        for kind in ("missing", "device", "shared", "buffer_copied"):
            findings.problem(kind, f"a {kind} problem")
        assert "buffer_copied" not in " ".join(findings.result().messages)
    alone = Findings(exercises.TASKS["batchnorm"], {})
    alone.problem("buffer_copied", "a copy")
    assert alone.result().hints[0].startswith("(step 1 of 3)")


def test_an_error_raised_in_the_library_is_not_blamed_on_a_line_of_the_learners():
    result = exercises.check_batchnorm(lambda network, devices, detach=False: [])  # no replicas at all
    assert_fails_with(result, "error")
    assert "your code raised" not in result.messages[0]  # no frame of the learner's raised it


def test_a_pass_starts_the_hints_again():
    for _ in range(3):
        exercises.check_batchnorm("rewire")
    assert exercises.check_batchnorm(SOLUTIONS["batchnorm"][0]).passed
    assert "solution_source" not in " ".join(exercises.check_batchnorm("rewire").hints)


def test_no_hint_sends_the_learner_to_try_it_for_an_error_it_does_not_show():
    def scatter(inputs, devices, dim=0):  # fails only on dataclasses, which try_it never scatters
        if dataclasses.is_dataclass(inputs):
            raise TypeError("no dataclasses")
        return S.scatter(inputs, devices, dim)

    assert exercises.try_it("scatter_gather", scatter, S.gather) is None  # try_it passes
    result = exercises.check_scatter_gather(scatter, S.gather)
    assert_fails_with(result, "error")
    assert "try_it" not in " ".join(result.hints) and isinstance(result.error, TypeError)


def test_a_backward_that_returns_the_wrong_count_is_told_what_to_return():
    wrong = reduce_add_with(lambda ctx, *grads: sum(grads))  # forgets the None for each copy
    result = exercises.check_rewire(wrong)
    assert_fails_with(result, "grad_count")
    assert "return 4" in text(result)  # the number to return: one per input of forward (original, 3 copies)


def test_an_error_in_reduce_add_coalesced_forward_is_blamed_on_it():
    class MyReduceAddCoalesced(Function):
        @staticmethod
        def forward(ctx, destination, num_inputs, *grads):
            return grads[0].reshape(7)  # a learner's slip

        @staticmethod
        def backward(ctx, *grads):
            return (None, None) + S.MyBroadcast.apply(ctx.devices, *grads)

    class MyBroadcast(S.MyBroadcast):
        @staticmethod
        def backward(ctx, *grads):
            return (None,) + MyReduceAddCoalesced.apply(ctx.input_device, ctx.num_inputs, *grads)

    result = exercises.check_broadcast_pair(MyBroadcast, MyReduceAddCoalesced)
    assert_fails_with(result, "error")
    assert "ReduceAddCoalesced.forward" in result.messages[0] and "Broadcast alone" not in text(result)


def test_try_it_says_whether_the_originals_buffers_changed(capsys):
    exercises.try_it("batchnorm", S.keep_bn_statistics)
    assert (
        "buffers that changed: 1.running_mean, 1.running_var, 1.num_batches_tracked"
        in capsys.readouterr().out
    )
    exercises.try_it(
        "batchnorm", lambda n, d, detach=False: dpteach.replicate(n, d, detach, strategy="rewire")
    )
    assert "buffers that changed: none" in capsys.readouterr().out  # the rewire replicas' copies took them
