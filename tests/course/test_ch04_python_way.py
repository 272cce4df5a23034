"""Chapter 04: Broadcast / ReduceAddCoalesced, why Python may assign replica tensors, the C++ failure, Option Two."""

from __future__ import annotations

import copy
import inspect
import re
import types
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.testing import assert_close

import dpteach
from dpteach.course import checks, demos, story
from dpteach.functions import Broadcast
from dpteach.replicate import STRATEGIES

ROOT = Path(__file__).resolve().parents[2]
CPU2 = ["cpu", "cpu"]
CPU3 = ["cpu", "cpu", "cpu"]
DETAILS_RE = re.compile(r"<details\b.*?</details>", re.S)


def tol(a, b):
    assert_close(a, b, rtol=1e-4, atol=1e-6)


def data():
    return story.make_data()


def grads_one_device(model):
    """The reference: the same model, one device, one backward of the MSE loss."""
    x, y = data()
    reference = copy.deepcopy(model)
    F.mse_loss(reference(x), y).backward()
    return [p.grad for p in reference.parameters()]


def grads_parallel(model, devices, strategy):
    x, y = data()
    F.mse_loss(dpteach.DataParallel(model, devices, strategy=strategy)(x), y).backward()
    return [p.grad for p in model.parameters()]


# --- Broadcast and ReduceAddCoalesced -------------------------------------------------------


@pytest.mark.parametrize("devices", [CPU2, CPU3])
def test_broadcast_outputs_are_device_major_and_slot0_is_the_input(devices):
    model = nn.Linear(3, 2)
    outputs = Broadcast.apply(devices, model.weight, model.bias)
    assert len(outputs) == 2 * len(devices)  # one copy of each tensor per slot
    for i, out in enumerate(outputs):
        slot, source = divmod(i, 2)
        original = (model.weight, model.bias)[source]
        assert_close(out, original)  # device-major: slot 0's weight, bias, then slot 1's ...
        assert (out.data_ptr() == original.data_ptr()) == (slot == 0)  # only slot 0 shares storage
    assert len({id(o.grad_fn) for o in outputs}) == 1  # every output hangs off one BroadcastBackward node
    assert type(outputs[0].grad_fn).__name__ == "BroadcastBackward"


@pytest.mark.parametrize("devices", [CPU2, CPU3])
def test_reduce_add_coalesced_sums_the_slots_gradients(devices):
    model = nn.Linear(3, 2)
    outputs = Broadcast.apply(devices, model.weight, model.bias)
    sum(out.sum() for out in outputs[0::2]).backward()
    assert_close(
        model.weight.grad, torch.full_like(model.weight, float(len(devices)))
    )  # ones from each slot, added
    assert_close(model.bias.grad, torch.zeros_like(model.bias))  # no slot used its bias: zeros, summed


def test_replicate_sets_non_leaf_attributes_and_registers_no_parameters():
    model = nn.Linear(3, 2)
    replica = dpteach.replicate(model, CPU2)[1]
    assert list(replica.parameters()) == []  # _parameters emptied, as replicate.py does (#33907)
    assert "weight" in replica.__dict__  # the copy is a plain attribute
    assert type(replica.weight.grad_fn).__name__ == "BroadcastBackward" and not replica.weight.is_leaf


def test_python_attribute_is_the_registry_entry():
    model = nn.Linear(3, 2)
    assert model.weight is model._parameters["weight"]  # found through nn.Module.__getattr__
    assert "weight" not in model.__dict__  # there is no field of its own


# --- the C++ failure, in Python --------------------------------------------------------------


def test_cpp_style_linear_holds_two_handles_on_one_tensor_and_computes_like_linear():
    model = story.make_model()
    cpp_model = demos.cpp_style(model)
    assert cpp_model[0].members.weight is cpp_model[0].weight  # member and registry: one tensor
    assert torch.equal(cpp_model(data()[0]), model(data()[0]))  # the same function, the same numbers


def test_failed_attempt_works_for_nn_linear():
    model = story.make_model()
    for got, want in zip(
        grads_parallel(model, CPU2, demos.failed_attempt), grads_one_device(story.make_model())
    ):
        tol(got, want)  # Linear.forward reads the registry, so the broadcast copies are used


def test_failed_attempt_gives_the_cpp_style_original_no_gradient():
    cpp_model = demos.cpp_style(story.make_model())
    assert grads_parallel(cpp_model, CPU2, demos.failed_attempt) == [None] * 4  # #19540 reproduced


def test_failed_attempt_replica_member_is_the_clones_leaf_where_the_gradient_stops():
    cpp_model = demos.cpp_style(story.make_model())
    replicas = dpteach.replicate(cpp_model, CPU2, strategy=demos.failed_attempt)
    layer = replicas[1][0]
    assert (
        type(layer._parameters["weight"].grad_fn).__name__ == "BroadcastBackward"
    )  # the registry got the copy
    assert (
        layer.members.weight.is_leaf and layer.members.weight is not layer._parameters["weight"]
    )  # the member did not
    x, y = data()
    outputs = dpteach.parallel_apply(replicas, [(p,) for p in dpteach.scatter(x, CPU2)], devices=CPU2)
    loss = F.mse_loss(dpteach.gather(outputs, "cpu"), y)
    loss.backward()
    assert layer.members.weight.grad is not None  # the gradient stops in the replica's member
    assert cpp_model[0].weight.grad is None  # and never reaches the original
    graph = dpteach.autograd_graph(loss, module=cpp_model, replicas=replicas)
    assert len(graph.unreached) == 4  # the drawing: all four original parameters unreached


def train(model, strategy=None, steps=40, lr=0.2):
    x, y = data()
    net = model if strategy is None else dpteach.DataParallel(model, CPU2, strategy=strategy)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = F.mse_loss(net(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_training_under_the_failed_attempt():
    reference = train(story.make_model())
    linear = train(story.make_model(), demos.failed_attempt)
    cpp = train(demos.cpp_style(story.make_model()), demos.failed_attempt)
    assert_close(
        torch.tensor(linear), torch.tensor(reference), rtol=1e-4, atol=1e-6
    )  # on the one-device curve
    assert cpp == [cpp[0]] * len(cpp)  # flat: no step changes a weight
    assert reference[-1] < 0.5 * reference[0]  # while one device does learn


def test_grad_fn_of_a_tensor_cannot_be_reassigned():
    leaf = torch.zeros(2, requires_grad=True)
    with pytest.raises(AttributeError, match="not writable"):
        leaf.grad_fn = None  # why Python's rewire cannot do what C++'s set_history did


# --- Option One, the fix that landed -------------------------------------------------------


@pytest.mark.parametrize("devices", [CPU2, CPU3])
@pytest.mark.parametrize("make", [lambda: demos.cpp_style(story.make_model()), story.make_model])
def test_option_one_matches_one_device(devices, make):
    for got, want in zip(
        grads_parallel(make(), devices, demos.option_one), grads_one_device(story.make_model())
    ):
        tol(got, want)  # C++-style or not: the tensors' own history leads to the original


def test_option_one_rewires_the_tensor_the_member_holds():
    cpp_model = demos.cpp_style(story.make_model())
    layer = dpteach.replicate(cpp_model, CPU2, strategy=demos.option_one)[1][0]
    assert layer.members.weight is layer._parameters["weight"]  # no handle was re-pointed ...
    assert layer.members.weight is not cpp_model[0].weight  # ... the replica holds its own copy ...
    assert type(layer.members.weight.grad_fn).__name__ == "ReduceAddInPlaceBackward"  # ... with the new edge


def test_option_one_graph_leads_every_member_through_one_node_per_original():
    """The chapter's Option One picture: no dead end, each original reached through its ReduceAddInPlace node."""
    cpp_model = demos.cpp_style(story.make_model())
    replicas = dpteach.replicate(cpp_model, CPU2, strategy=demos.option_one)
    x, y = data()
    outputs = dpteach.parallel_apply(replicas, [(p,) for p in dpteach.scatter(x, CPU2)], devices=CPU2)
    graph = dpteach.autograd_graph(
        F.mse_loss(dpteach.gather(outputs, "cpu"), y), module=cpp_model, replicas=replicas
    )
    assert not graph.dead_ends and not graph.unreached
    nodes = [n for n in graph.nodes if str(n).startswith("ReduceAddInPlaceBackward")]
    assert len(nodes) == 4  # one per original parameter, shared by both slots


def test_option_one_trains_the_cpp_style_network_like_one_device():
    reference = train(story.make_model())
    tol(torch.tensor(train(demos.cpp_style(story.make_model()), demos.option_one)), torch.tensor(reference))


def test_option_one_keeps_tied_weights_tied_and_detach_keeps_plain_clones():
    a, b = nn.Linear(3, 3), nn.Linear(3, 3)
    b.weight = a.weight
    net = nn.Sequential(a, b)
    replicas = dpteach.replicate(net, CPU2, strategy=demos.option_one)
    assert replicas[1][0].weight is replicas[1][1].weight  # one copy, rebased once
    plain = dpteach.replicate(net, CPU2, detach=True, strategy=demos.option_one)
    assert all(p.grad_fn is None for p in plain[1].parameters())  # detach=True: no edges


# --- Option Two ---------------------------------------------------------------------------


@pytest.mark.parametrize("devices", [CPU2, CPU3])
def test_option_two_matches_one_device(devices):
    model = demos.cpp_style(story.make_model(), demos.ReplicatableLinear)
    for got, want in zip(
        grads_parallel(model, devices, demos.option_two), grads_one_device(story.make_model())
    ):
        tol(got, want)  # each module re-points its own members: gradients reach the original


def test_option_two_refuses_modules_that_are_not_replicatable():
    for model, name in [
        (story.make_model(), "Linear"),
        (demos.cpp_style(story.make_model()), "CppStyleLinear"),
    ]:
        with pytest.raises(TypeError, match=rf"Replicatable.*{name} \('0'\)"):
            dpteach.replicate(
                model, CPU2, strategy=demos.option_two
            )  # the PR's con: every module must change


def test_replicatable_base_says_what_to_implement():
    with pytest.raises(NotImplementedError, match="load_replica_params"):
        demos.Replicatable().load_replica_params({})


# --- RNNs: Python's own member handles --------------------------------------------------------


def test_rnn_flat_weights_follow_the_replica_tensors():
    rnn = nn.RNN(3, 4, batch_first=True)
    replicas = dpteach.replicate(rnn, CPU2)
    assert (
        replicas[1]._flat_weights[0] is replicas[1].weight_ih_l0
    )  # RNNBase.__setattr__ kept the list in step
    assert replicas[1]._flat_weights is not rnn._flat_weights  # _replicate_for_data_parallel copied the list
    assert rnn._flat_weights[0] is rnn.weight_ih_l0  # so the original's list still holds its own tensor


def test_the_chapters_rnn_evidence_fails_without_either_override(monkeypatch):
    """The chapter's RNN cell looks before any forward, so each of its two asserts needs one override."""
    rnn = nn.RNN(3, 4, batch_first=True)
    with monkeypatch.context() as m:
        m.setattr(nn.RNNBase, "__setattr__", nn.Module.__setattr__)  # no writing into the list
        replica = dpteach.replicate(rnn, CPU2)[1]
        assert replica._flat_weights[0] is rnn.weight_ih_l0  # the replica's list keeps the original's tensor
    with monkeypatch.context() as m:
        m.setattr(nn.RNNBase, "_replicate_for_data_parallel", nn.Module._replicate_for_data_parallel)
        replica = dpteach.replicate(rnn, CPU2)[1]
        assert (
            rnn._flat_weights[0] is replica.weight_ih_l0
        )  # one shared list: the original's now holds a copy


def test_rnn_under_data_parallel_matches_one_device():
    rnn = nn.RNN(3, 4, batch_first=True)
    reference = copy.deepcopy(rnn)
    sequence = torch.randn(6, 5, 3)
    reference(sequence)[0].pow(2).mean().backward()
    dpteach.DataParallel(rnn, CPU2)(sequence)[0].pow(2).mean().backward()
    for p, q in zip(rnn.parameters(), reference.parameters()):
        tol(p.grad, q.grad)


def test_an_rnn_replica_rebuilds_its_flat_weights_by_name_at_forward():
    """Since PR #91111 forward calls _update_flat_weights(): a stale list is rebuilt from the attributes."""
    rnn = nn.RNN(3, 4, batch_first=True)
    replica = dpteach.replicate(rnn, CPU2)[1]
    replica.__dict__["_flat_weights"] = list(rnn._flat_weights)  # stale: the original's tensors
    replica(torch.randn(2, 5, 3))
    assert replica._flat_weights[0] is replica.weight_ih_l0  # read by name, as Linear does


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_cpu_slots_hide_the_shared_members_trap(strategy):
    """The chapter's trap cell: on two CPU slots every .grad fills, on a second device the forward stops."""
    x, y = data()
    cpp_model = demos.cpp_style(story.make_model())
    assert dpteach.replicate(cpp_model, CPU2, strategy=strategy)[1][0].members is cpp_model[0].members
    F.mse_loss(dpteach.DataParallel(cpp_model, CPU2, strategy=strategy)(x), y).backward()
    for got, want in zip([p.grad for p in cpp_model.parameters()], grads_one_device(story.make_model())):
        tol(got, want)  # right, but only because slot 1 read the original's own tensors
    with pytest.raises(RuntimeError, match="not on the expected device meta"):
        dpteach.DataParallel(cpp_model, ["cpu", "meta"], strategy=strategy)(x)  # meta stands in for a GPU


def test_the_first_figure_one_device_failed_attempt_and_option_one():
    """Chapter 04's first figure: story.train on a C++-style model, as the chapter's first cells call it."""
    one = story.train(None, CPU2, steps=20).losses
    linear = story.train(demos.failed_attempt, CPU2, steps=20).losses
    flat = story.train(demos.failed_attempt, CPU2, steps=20, model=demos.cpp_style(story.make_model())).losses
    fixed = story.train(demos.option_one, CPU2, steps=20, model=demos.cpp_style(story.make_model())).losses
    tol(torch.tensor(linear), torch.tensor(one))  # the dashes on the wide line
    tol(torch.tensor(fixed), torch.tensor(one))  # Option One's dots on it too
    assert flat == [flat[0]] * 20 and one[-1] < 0.5 * one[0]  # the dotted line stays flat; one device learns


def test_default_strategy_replicas_share_the_cpp_style_members_with_the_original():
    cpp_model = demos.cpp_style(story.make_model())
    replicas = dpteach.replicate(cpp_model, CPU2)
    assert replicas[1][0].members.weight is cpp_model[0].weight  # the trap: slot 1 computes with the original
    assert replicas[1][0].members is cpp_model[0].members  # the shallow copy shares the attribute itself
    assert replicas[1][0].weight is not cpp_model[0].weight  # the registry name holds the copy
    shared = [
        name
        for name in ("_parameters", "_buffers", "_modules")
        if getattr(replicas[1][0], name) is getattr(cpp_model[0], name)
    ]
    assert shared == []  # exercise 4: the registry's dicts are the replica's own


@pytest.mark.cuda
def test_default_strategy_cpp_style_fails_loudly_across_devices():
    devices = ["cuda:0", "cpu"]  # two distinct devices: slot 1 is not where the original's members live
    cpp_model = demos.cpp_style(story.make_model()).to(devices[0])
    x = story.make_data()[0].to(devices[0])
    with pytest.raises(RuntimeError, match="same device"):
        dpteach.DataParallel(cpp_model, devices)(x)  # the trap: a device mismatch, not a silent success


@pytest.mark.cuda
def test_failed_attempt_on_a_gpu():
    devices = ["cuda:0", "cuda:0"]
    cpp_model = demos.cpp_style(story.make_model()).to(devices[0])
    x, y = (t.to(devices[0]) for t in data())
    F.mse_loss(dpteach.DataParallel(cpp_model, devices, strategy=demos.failed_attempt)(x), y).backward()
    assert all(p.grad is None for p in cpp_model.parameters())  # the same bug on a GPU
    model = demos.cpp_style(story.make_model(), demos.ReplicatableLinear).to(devices[0])
    F.mse_loss(dpteach.DataParallel(model, devices, strategy=demos.option_two)(x), y).backward()
    for p, q in zip(model.parameters(), grads_one_device(story.make_model())):
        tol(p.grad.cpu(), q)  # Option Two works there too


def test_tied_weights_stay_tied_in_each_replica():
    a, b = nn.Linear(3, 3), nn.Linear(3, 3)
    b.weight = a.weight
    replicas = dpteach.replicate(nn.Sequential(a, b), CPU2)
    assert replicas[1][0].weight is replicas[1][1].weight  # exercise 2's starting point


# --- the Going-deeper block on mark_dirty, and exercise 3's check -----------------------------


def _chapter():
    import nbformat

    return nbformat.read(ROOT / "notebooks" / "04_the_python_way.ipynb", as_version=4)


def test_reduce_add_in_place_rebases_a_members_history():
    """Option One's node: the member gets the node as its grad_fn, the original the gradient."""
    layer, replica = demos.CppStyleLinear(3, 2), demos.CppStyleLinear(3, 2)
    with torch.no_grad():
        replica.load_state_dict(layer.state_dict())
    for p in replica.parameters():
        p.requires_grad_(False)  # mark_dirty refuses a leaf that requires grad
    member = replica.members.weight
    (out,) = demos.ReduceAddInPlace.apply(layer.weight, replica.weight)
    assert out is member and type(member.grad_fn).__name__ == "ReduceAddInPlaceBackward"  # same object
    replica(torch.ones(4, 3)).sum().backward()
    assert torch.equal(layer.weight.grad, torch.full((2, 3), 4.0))  # 4 rows of ones reached the original


def test_mark_dirty_bumps_the_version_and_drops_the_grad():
    """The fold on mark_dirty: a dirty copy is treated as modified in place."""
    original, copy_ = torch.ones(2, requires_grad=True), torch.zeros(2)
    copy_.grad = torch.ones(2)
    version = copy_._version
    (out,) = demos.ReduceAddInPlace.apply(original, copy_)
    assert out is copy_ and copy_._version == version + 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # .grad of a non-leaf warns
        assert copy_.grad is None


def test_a_returned_input_comes_back_as_a_view_differentiable_or_not():
    weight, frozen = torch.ones(2, requires_grad=True), torch.ones(2)
    outputs = Broadcast.apply(CPU2, weight, frozen)
    assert outputs[0]._base is weight and type(outputs[0].grad_fn).__name__ == "BroadcastBackward"
    assert outputs[1]._base is frozen and outputs[1].grad_fn is None  # marked non-differentiable
    assert not outputs[3].requires_grad  # every slot's copy of the frozen input is marked


def test_apply_records_a_node_only_with_grad_mode_and_backward_only_under_create_graph():
    weight = torch.ones(3, requires_grad=True)
    with torch.no_grad():
        assert all(out.grad_fn is None for out in Broadcast.apply(CPU2, weight))
    (grad,) = torch.autograd.grad(sum((o * o).sum() for o in Broadcast.apply(CPU2, weight)), weight)
    assert grad.grad_fn is None  # a plain backward records nothing
    outputs = Broadcast.apply(CPU2, weight)
    (grad,) = torch.autograd.grad(sum((o * o).sum() for o in outputs), weight, create_graph=True)
    assert type(grad.grad_fn).__name__ == "ReduceAddCoalescedBackward"  # the partner's apply, recorded


def _scale_class(
    *, replicatable=True, repoint_member=True, reads_registry=False, wrong_forward=False, set_registry=True
):
    from types import SimpleNamespace

    bases = (nn.Module, demos.Replicatable) if replicatable else (nn.Module,)

    def __init__(self):
        nn.Module.__init__(self)
        scale = nn.Parameter(torch.ones(3) * 2)
        self.register_parameter("scale", scale)
        self.members = SimpleNamespace(scale=scale)

    def forward(self, x):
        scale = self.scale if reads_registry else self.members.scale
        return x * scale * 2 + 1 if wrong_forward else x * scale

    def load_replica_params(self, tensors):
        if set_registry:
            self._parameters["scale"] = tensors["scale"]
        if repoint_member:
            self.members = SimpleNamespace(scale=tensors["scale"])

    body = {"__init__": __init__, "forward": forward}
    if replicatable:
        body["load_replica_params"] = load_replica_params
    return type("Scale", bases, body)


def test_exercise_3_check_accepts_the_worked_answer():
    from dpteach.course import checks

    verdict = checks.replicatable_scale(_scale_class(), None)
    assert verdict.ok and verdict.message.startswith("Correct!")
    instance = checks.replicatable_scale(_scale_class()(), None)  # Scale() where Scale belongs
    assert not instance.ok and "not an instance" in instance.message and "Hint" not in instance.message


@pytest.mark.parametrize(
    "kwargs, says",
    [
        (dict(replicatable=False), "demos.Replicatable"),
        (dict(repoint_member=False), "self.members"),
        (
            dict(reads_registry=True),
            "read the member handle",
        ),  # Python-style: passes Option Two, not C++ style
        (dict(wrong_forward=True), "x * self.members.scale, and nothing else"),
        (dict(set_registry=False), "put tensors['scale'] into self._parameters['scale'] too"),  # members only
    ],
)
def test_exercise_3_check_says_what_to_change(kwargs, says):
    from dpteach.course import checks

    checks.reset()
    verdict = checks.replicatable_scale(
        _scale_class(**kwargs), None
    )  # a wrong answer is a verdict, not a raise
    assert not verdict.ok and says in verdict.message.split("Hint")[0]  # the change, before the hint
    assert "Hint 1 of 2" in verdict.message
    assert not checks.replicatable_scale(...).ok  # no class yet: asks for one


@pytest.mark.parametrize(
    "predicted, says",
    [
        (torch.zeros(3), "zeros would mean that a gradient arrived"),
        (0, "zeros would mean that a gradient arrived"),
        (torch.full((3,), 8.0), "would mean that the gradient reached the original"),
    ],
)
def test_exercise_3_grades_the_prediction_first(predicted, says):
    checks.reset()
    verdict = checks.replicatable_scale(_scale_class(), predicted)  # a right class cannot rescue it
    assert not verdict.ok and verdict.problem == "predicted" and says in verdict.message.split("Hint")[0]
    assert "Change `predicted_grad`" in verdict.message and "Hint 1 of 2" in verdict.message
    assert "the object None" in checks.replicatable_scale(_scale_class(), "None").message  # no hint spent
    unset = checks.replicatable_scale(_scale_class())
    assert not unset.ok and unset.message.startswith("Set `predicted_grad` first")
    right = checks.replicatable_scale(..., None)  # the prediction right, no class yet
    assert (
        not right.ok and "Your prediction is right" in right.message and "define class Scale" in right.message
    )


def test_exercise_3_prediction_matches_what_option_two_does_with_members_left_alone():
    """The graded prediction, None, is what a loader that leaves members alone gives the original."""
    module = _scale_class(repoint_member=False)()
    x = torch.randn(8, 3)
    dpteach.DataParallel(module, CPU2, strategy=demos.option_two)(x).pow(2).mean().backward()
    assert module.scale.grad is None


def test_exercise_3_hints_start_again_when_the_slip_changes():
    checks.reset()
    first = checks.replicatable_scale(_scale_class(repoint_member=False), None)
    again = checks.replicatable_scale(_scale_class(repoint_member=False), None)
    other = checks.replicatable_scale(_scale_class(reads_registry=True), None)  # another slip
    assert "Hint 1 of 2" in first.message and "Hint 2 of 2" in again.message  # the same slip climbs
    assert other.problem == "reads registry" and "Hint 1 of 2" in other.message  # a new one starts over
    checks.replicatable_scale(_scale_class(reads_registry=True), None)
    third = checks.replicatable_scale(_scale_class(reads_registry=True), None)
    assert "The answer" in third.message  # the third try at one slip gets the answer


def test_exercise_3_check_refuses_the_stub_and_never_mentions_reset():
    from dpteach.course import checks

    checks.reset()
    stub = type("Scale", (nn.Module, demos.Replicatable), {})  # no parameter, no forward, no loader
    for answer in (stub, _scale_class(reads_registry=True), _scale_class(wrong_forward=True)):
        verdict = checks.replicatable_scale(answer, None)
        assert not verdict.ok and "reset()" not in verdict.message  # the exercise never asks for reset()
    assert "no parameter named 'scale'" in checks.replicatable_scale(stub, None).message


def test_exercise_3_check_cell_is_found_by_its_tag():
    (cell,) = [c for c in _chapter().cells if "ex3-check" in c.metadata.get("tags", [])]
    assert 'checks.replicatable_scale(globals().get("Scale", ...), predicted_grad)' in cell.source
    assert "predicted_grad = ..." in cell.source


# --- exercise 1's check ----------------------------------------------------------------------


def test_exercise_1_check_accepts_the_device_major_index_and_slot_0s_views():
    model = story.make_model()
    outputs = Broadcast.apply(CPU3, *model.parameters())
    assert outputs[9].data_ptr() != model[0].bias.data_ptr() and torch.equal(outputs[9], model[0].bias)
    assert [out._base is p for out, p in zip(outputs[:4], model.parameters())] == [True] * 4  # views
    checks.reset()
    assert checks.broadcast_layout(9, {0, 1, 2, 3}).ok  # the exercise: three slots, param_copies[2][1]
    assert checks.broadcast_layout(6, [0, 1, 2, 3], CPU2, slot=1, tensor=2).ok  # slot 1's 2.weight on two
    assert not checks.broadcast_layout(9, {0, 1, 2, 3}, CPU2, slot=1, tensor=2).ok


@pytest.mark.parametrize(
    "index, shared, problem",
    [
        (1, {0, 1, 2, 3}, "slot 0"),
        (10, {0, 1, 2, 3}, "from 1"),
        (8, {0, 1, 2, 3}, "other tensor"),
        (3, {0, 1, 2, 3}, "index"),
        (9, set(), "no sharing"),
        (9, set(range(12)), "all share"),
        (9, {0}, "shared"),
    ],
)
def test_exercise_1_check_names_the_slip(index, shared, problem):
    checks.reset()
    verdict = checks.broadcast_layout(index, shared)
    assert not verdict.ok and verdict.problem == problem and "Hint 1 of 2" in verdict.message


def test_exercise_1_check_names_both_slips_when_two_readings_give_one_index():
    checks.reset()
    # on 3 slots two slips land on 5: tensor-major (1 * 3 + 2), and slot 1's copy (1 * 4 + 1)
    verdict = checks.broadcast_layout(5, {0, 1, 2, 3})
    assert not verdict.ok and verdict.problem == "tensor-major"
    assert "device-major" in verdict.message and "slots count from 0" in verdict.message  # both explanations
    change = verdict.message.split("Hint")[0]
    assert (
        "or else" not in change and "(if you read it another way: that is slot 1's copy" in change
    )  # one, then the other
    tensor_major = checks.broadcast_layout(5, {0, 1, 2, 3}, CPU2, slot=1, tensor=2)  # 2 * 2 + 1 on two slots
    assert tensor_major.problem == "tensor-major"


def test_exercise_1_check_asks_for_numbers_and_costs_no_hint():
    assert checks.broadcast_layout(..., ...).message.startswith("Set `index`")
    assert "whole number" in checks.broadcast_layout("6", {0}).message
    assert "set of whole numbers" in checks.broadcast_layout(6, 3).message


def _scale_without_import():
    """Exercise 3's Scale written in a cell that never imported SimpleNamespace."""

    class Scale(nn.Module, demos.Replicatable):
        def __init__(self):
            super().__init__()
            scale = nn.Parameter(torch.ones(3) * 2)
            self.register_parameter("scale", scale)
            self.members = SimpleNamespace(scale=scale)  # noqa: F821

    return Scale


def test_a_missing_import_is_named_and_costs_no_hint():
    from dpteach.course import checks

    checks.reset()
    verdict = checks.replicatable_scale(_scale_without_import(), None)
    assert not verdict.ok and "NameError: SimpleNamespace is not defined — import it" in verdict.message
    assert "from types import SimpleNamespace" in verdict.message  # the line that imports it
    assert "Hint" not in verdict.message and "__init__ takes no argument" not in verdict.message


def test_exercise_1_check_cell_is_found_by_its_tag():
    (cell,) = [c for c in _chapter().cells if "ex1-check" in c.metadata.get("tags", [])]
    assert 'checks.broadcast_layout(index, shared, ["cpu"] * 3)' in cell.source


# --- the chapter's layout: answers after checks, the trap asked before it is shown -------------


def _tagged_index(cells, tag):
    (i,) = [i for i, c in enumerate(cells) if tag in c.metadata.get("tags", [])]
    return i


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_each_exercise_has_its_own_answer_right_after_its_check(n):
    cells = _chapter().cells
    at = _tagged_index(cells, f"ex{n}-check")
    after = cells[at + 1]
    assert after.cell_type == "markdown" and after.source.startswith("<details><summary>Answer</summary>"), (
        f"exercise {n}: put its <details><summary>Answer</summary> block in the cell after its check"
    )
    start = next(i for i, c in enumerate(cells) if c.source.startswith("## Exercises"))
    asked = "\n".join(DETAILS_RE.sub("", c.source) for c in cells[start:at] if c.cell_type == "markdown")
    assert re.search(rf"^{n}\. ", asked, re.M), f"exercise {n}: ask it under ## Exercises, above its check"


def test_nothing_before_exercise_4_shows_its_answer():
    """Exercise 4 asks which of a replica's dicts are the original's, and the line that shares `members`."""
    cells = _chapter().cells
    line = next(
        s.strip()
        for s in inspect.getsource(nn.Module._replicate_for_data_parallel).splitlines()
        if "__dict__" in s
    )
    earlier = [c.source for c in cells[: _tagged_index(cells, "ex4-check")]]
    assert not any(line in s for s in earlier), "the shared-dict line appears before exercise 4 asks for it"
    for name in ("_parameters is", "_buffers is", "_modules is"):
        assert not any(name in s for s in earlier), (
            f"a cell before exercise 4 shows whether {name} the original's"
        )
    check = cells[_tagged_index(cells, "ex4-check")].source
    assert "getsource" not in check and "print(" not in check, (
        "exercise 4's cell prints before the check grades"
    )


def test_the_trap_shows_whose_members_slot_1_reads_and_says_why():
    cells = _chapter().cells
    at = _tagged_index(cells, "cpu-slots-trap")
    assert "trap_replica.members is trap_model[0].members" in cells[at].source  # printed, True
    said = " ".join(DETAILS_RE.sub("", cells[at + 1].source).split())
    assert "shallow copy" in said and "deep copy" in said  # replicate's replica against the failed attempt's
    assert "original's leaves" in said and "broadcast copies unused" in said  # why two CPU slots look right
    assert "second GPU" in said and "RuntimeError" in said


def test_the_rnn_section_follows_the_rule_it_illustrates():
    cells = _chapter().cells
    rnn = next(i for i, c in enumerate(cells) if c.cell_type == "code" and "nn.RNN(3, 4" in c.source)
    assert rnn > _tagged_index(cells, "cpu-slots-trap") + 1, "the RNN cell comes before the rule"
    told = " ".join(DETAILS_RE.sub("", cells[rnn - 1].source).split())
    assert "rebuilds the list" in told  # the main path says forward rebuilds it too


def test_the_trap_is_predicted_before_it_runs_and_a_rule_follows():
    cells = _chapter().cells
    at = _tagged_index(cells, "cpu-slots-trap")
    asked = cells[at - 1]
    assert asked.cell_type == "markdown" and "Predict" in DETAILS_RE.sub("", asked.source)
    demo, rule_at = _tagged_index(cells, "handle-kinds"), _tagged_index(cells, "handle-rule")
    assert at + 1 < demo < rule_at, "the trap, its explanation, the two-handles demo, then the rule"
    rule = " ".join(DETAILS_RE.sub("", cells[rule_at].source).split())  # line breaks read as spaces
    assert "read each parameter by name" in rule and "rebuilt on every forward" in rule
    assert "the shallow copy shares the container" in rule  # the cause, not the rebuilding
    assert "re-points registry names" in rule
    assert "`Parameter` attribute follows the replica" in rule  # the rule is not "keep no handles at all"
    assert "only where an op checks devices" in rule  # meta is no sure test: a bare matmul runs on it
    for kind in ("list", "dict", "namespace", "closure"):
        assert kind in rule


class _Handles(nn.Module):
    """The rule's cases: a Parameter set as an attribute, and the same tensor in each kind of container."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2)
        weight = self.lin.weight
        self.w = weight  # Module.__setattr__ registers a Parameter: one more registry entry
        self.listed, self.keyed = [weight], {"w": weight}
        self.spaced = types.SimpleNamespace(w=weight)
        self.closed = lambda x: F.linear(x, weight)


def test_a_parameter_attribute_follows_the_replica_and_a_handle_in_a_container_does_not():
    """The rule's claims, read off a replica: attribute by name follows, list/dict/namespace/closure stay."""
    original = _Handles()
    assert "w" in original._parameters  # the attribute went into the registry
    replica = dpteach.replicate(original, CPU2)[1]
    assert replica.w is replica.lin.weight and type(replica.w.grad_fn).__name__ == "BroadcastBackward"
    held = [
        replica.listed[0],
        replica.keyed["w"],
        replica.spaced.w,
        replica.closed.__closure__[0].cell_contents,
    ]
    assert all(t is original.lin.weight for t in held)  # each container is the original's own object


def test_the_chapters_handle_demo_prints_both_kinds():
    cells = _chapter().cells
    source = cells[_tagged_index(cells, "handle-kinds")].source
    assert "self.w = self.lin.weight" in source and "self.cache = [self.lin.weight]" in source
    assert "handles_replica.w is handles_replica.lin.weight" in source


def test_cpp_style_linear_keeps_its_members_out_of_the_registry():
    """Why CppStyleLinear uses a SimpleNamespace: a Parameter attribute would be registered and re-pointed."""
    layer = demos.CppStyleLinear(3, 2)
    assert set(layer._parameters) == {"weight", "bias"}  # members added no registry entry
    assert isinstance(layer.members, types.SimpleNamespace)
    said = " ".join(next(c.source for c in _chapter().cells if c.id == "c17").split())
    assert "SimpleNamespace" in said and "Module.__setattr__" in said


def test_gradients_are_compared_by_one_helper_defined_once():
    code = [c.source for c in _chapter().cells if c.cell_type == "code"]
    assert sum("def assert_grads_match" in s for s in code) == 1
    assert sum("torch.testing.assert_close" in s for s in code) == 1  # only inside the helper
    assert sum("assert_grads_match(" in s for s in code) >= 4  # its definition and its uses


# --- exercise 5's check: heads kept in a plain dict -------------------------------------------


class TwoHeads(nn.Module):
    """Exercise 5's module: two nn.Linear heads, also kept in a plain dict through which forward picks one."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(3, 2), nn.Linear(3, 2)
        self.heads = {"a": self.a, "b": self.b}

    def forward(self, x, head="a"):
        return self.heads[head](x)


def _by_name(self, x, head="a"):
    return getattr(self, head)(x)


def _through_modules(self, x, head="a"):  # the replica's own _modules, filled by replicate
    return self._modules[head](x)


def _stub(self, x, head="a"): ...


def _moved(self, x, head="a"):  # around the copies: the original's head, its tensors moved to the input
    lin = self.heads[head]
    return F.linear(x, lin.weight.to(x.device), lin.bias.to(x.device))


def _always_a(self, x, head="a"):
    return self.a(x)


def _no_head(self, x):  # drops the head argument
    return self.a(x)


def _registry(self, x, head="a"):  # a replica's _parameters is empty
    lin = getattr(self, head)
    return F.linear(x, lin._parameters["weight"], lin._parameters["bias"])


def _unimported(self, x, head="a"):
    return getattr(self, head)(x) * scale  # noqa: F821


def test_exercise_5s_module_raises_on_a_meta_slot_and_finding_the_head_by_name_runs():
    """The truth the check reads, on the chapter's own class: the kept dict fails on meta, by name runs."""
    (cell,) = [c for c in _chapter().cells if "ex5-check" in c.metadata.get("tags", [])]
    assert 'self.heads = {"a": self.a, "b": self.b}' in cell.source
    assert "checks.kept_handle(raises, forward, TwoHeads)" in cell.source
    assert "raises = ..." in cell.source and 'def forward(self, x, head="a"):\n    ...' in cell.source
    x = torch.randn(4, 3)
    original = TwoHeads()
    replicas = dpteach.replicate(original, ["cpu", "meta"])
    assert replicas[1].heads is original.heads  # the shallow copy shares the dict ...
    assert replicas[1].a is not original.a  # ... while the registered name holds slot 1's replica
    with pytest.raises(RuntimeError, match="not on the expected device meta"):
        dpteach.parallel_apply(
            replicas, [(p,) for p in dpteach.scatter(x, ["cpu", "meta"])], devices=["cpu", "meta"]
        )
    fixed = type("TwoHeads", (TwoHeads,), {"forward": _by_name})()
    out = dpteach.parallel_apply(
        dpteach.replicate(fixed, ["cpu", "meta"]),
        [(p,) for p in dpteach.scatter(x, ["cpu", "meta"])],
        devices=["cpu", "meta"],
    )
    assert out[1].device.type == "meta"


@pytest.mark.parametrize("forward", [_by_name, _through_modules])
def test_exercise_5_check_accepts_the_worked_answer(forward):
    checks.reset()
    verdict = checks.kept_handle(True, forward, TwoHeads)
    assert verdict.ok and verdict.message.startswith("Correct!")


def test_exercise_5_grades_the_prediction_first_and_asks_for_a_bool_at_no_cost():
    checks.reset()
    assert checks.kept_handle(..., _stub, TwoHeads).message.startswith("Set `raises`")
    assert "True or False (no quotes)" in checks.kept_handle("True", _stub, TwoHeads).message
    wrong = checks.kept_handle(False, _by_name, TwoHeads)  # a right forward cannot rescue the prediction
    assert not wrong.ok and wrong.problem == "predicted" and "Change `raises`" in wrong.message
    assert "Hint 1 of 2" in wrong.message and "raises = True" not in wrong.message  # no answer yet
    checks.kept_handle(False, _by_name, TwoHeads)
    third = checks.kept_handle(False, _by_name, TwoHeads)
    assert "The answer: raises = True" in third.message


def test_exercise_5_right_prediction_with_the_stub_asks_for_forward_at_no_cost():
    checks.reset()
    verdict = checks.kept_handle(True, _stub, TwoHeads)
    assert not verdict.ok and "Your prediction is right" in verdict.message and "Hint" not in verdict.message
    assert "not on the expected device meta" in verdict.message  # what slot 1 raised, read live


@pytest.mark.parametrize(
    "forward, problem, says",
    [
        (TwoHeads.forward, "kept handle", "instead of through self.heads"),
        (_moved, "not the copies", "no BroadcastBackward node"),
        (_always_a, "forward", "does not compute what TwoHeads.forward does, for every head"),
        (_no_head, "forward raised", 'Keep the signature forward(self, x, head="a")'),
        (_registry, "registry read", "a replica's `_parameters` is empty"),
    ],
)
def test_exercise_5_check_says_what_to_change(forward, problem, says):
    checks.reset()
    verdict = checks.kept_handle(True, forward, TwoHeads)
    assert not verdict.ok and verdict.problem == problem and says in verdict.message.split("Hint")[0]
    assert "Hint 1 of 2" in verdict.message
    assert "each wrong try of the same kind brings the next step" in verdict.message


def test_exercise_5_a_wrong_function_gets_hints_about_the_function_not_the_handles():
    checks.reset()
    verdict = checks.kept_handle(True, _always_a, TwoHeads)
    hint = verdict.message.split("Hint 1 of 2: ")[1]
    assert "the head named `head` applied to x" in hint and "handle" not in hint


def test_exercise_5_a_missing_name_costs_no_hint():
    checks.reset()
    verdict = checks.kept_handle(True, _unimported, TwoHeads)
    assert (
        not verdict.ok
        and "NameError: scale is not defined" in verdict.message
        and "Hint" not in verdict.message
    )


# --- exercise 1: a wrong `shared` gets hints about storage --------------------------------------


def test_exercise_1_a_wrong_shared_gets_hints_about_views_not_layout():
    checks.reset()
    first = checks.broadcast_layout(9, {0})
    second = checks.broadcast_layout(9, {0})
    assert "Hint 1 of 2: A Function that returns one of its inputs unmodified" in first.message
    assert "Hint 2 of 2: Slot 0 is the model's own device" in second.message
    assert "device-major" not in first.message + second.message  # the layout hints are for `index`
    assert checks.broadcast_layout(9, {0, 1, 2, 3}).ok


def test_meta_catches_a_cpu_tensor_only_where_an_op_checks_devices():
    """What the rule says of a ``meta`` slot: a bias add checks devices (the meta function of addmm's
    decomposition), a bare matmul with a CPU weight runs without a word."""
    x, w, b = torch.randn(4, 3, device="meta"), torch.randn(2, 3), torch.randn(2)
    assert (x @ w.t()).device.type == "meta" and F.linear(x, w).device.type == "meta"
    with pytest.raises(RuntimeError, match="not on the expected device meta"):
        F.linear(x, w, b)
