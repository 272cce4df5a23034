"""The library under learners' real code: meters that nest, compiled and scripted modules,
rare inputs, and the places where dpteach deliberately differs from torch.nn.parallel.

The reference is always the same model on one device, or torch's own code where it runs on CPU.
"""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn
from torch.testing import assert_close

import dpteach
from dpteach import comm

SLOTS = ["cpu", "cpu"]


def small_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def one_step(model: nn.Module, x: torch.Tensor, devices=SLOTS, strategy="broadcast"):
    out = dpteach.DataParallel(model, devices, strategy=strategy)(x)
    out.pow(2).sum().backward()
    return out


# ------------------------------------------------------------------------------------------------
# 1. traffic() meters nest, close out of order, and never stay registered
# ------------------------------------------------------------------------------------------------


def test_nested_meters_each_see_their_own_copies():
    model, x = small_model(), torch.randn(8, 4)
    with comm.traffic() as outer:
        one_step(model, x)
        with comm.traffic() as inner:
            one_step(model, x)
        after_inner = outer.bytes
        one_step(model, x)
    assert comm._meters == []  # nothing left registered
    assert inner.bytes > 0
    assert after_inner == 2 * inner.bytes  # the outer block saw both steps so far ...
    assert outer.bytes == 3 * inner.bytes  # ... and the one after the inner block closed


def test_equal_meters_close_without_error():
    # two meters that saw the same copies are equal dataclasses: closing one must not remove the other
    with comm.traffic() as outer:
        with comm.traffic() as inner:
            comm.broadcast(torch.ones(4), SLOTS)
        assert inner == outer  # equal by value, distinct objects
        comm.broadcast(torch.ones(4), SLOTS)
    assert comm._meters == []
    assert outer.bytes == 2 * inner.bytes


def test_meters_closed_out_of_order_from_two_threads():
    opened = threading.Barrier(2)
    a_copied, b_closed = threading.Event(), threading.Event()
    meters, errors = {}, []

    def run_a():  # opens first, closes last
        try:
            with comm.traffic() as meters["a"]:
                opened.wait(timeout=10)
                comm.broadcast(torch.ones(4), SLOTS)
                a_copied.set()
                b_closed.wait(timeout=10)
                comm.broadcast(torch.ones(4), SLOTS)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def run_b():
        try:
            with comm.traffic() as meters["b"]:
                opened.wait(timeout=10)
                a_copied.wait(timeout=10)
                comm.broadcast(torch.ones(4), SLOTS)
            b_closed.set()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run_a), threading.Thread(target=run_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert errors == []
    assert comm._meters == []
    one = comm.nbytes(torch.ones(4))  # one broadcast to the second slot copies 16 bytes
    assert meters["b"].bytes == 2 * one  # a's copy and its own: traffic() counts every thread's copies
    assert meters["a"].bytes == 3 * one


def test_meter_unregistered_after_an_exception():
    with pytest.raises(ZeroDivisionError):
        with comm.traffic():
            with comm.traffic():
                1 / 0  # noqa: B018
    assert comm._meters == []


def test_profile_step_inside_an_open_meter():
    # chapter 08's exercise: profile with traffic() open; profile_step opens a meter of its own
    from dpteach.measure.profile import profile_step

    model, x = small_model(), torch.randn(8, 4)
    with comm.traffic() as outer:
        profile = profile_step(model, x, SLOTS, repeats=2, warmup=1)
    assert comm._meters == []
    per_step = sum(profile.bytes_by_op.values())
    assert per_step > 0
    assert outer.bytes == 3 * per_step  # warmup + repeats steps, all seen by the outer meter


def test_memory_flat_over_many_metered_steps():
    model, x = small_model(), torch.randn(8, 4)
    with comm.traffic() as outer:
        for _ in range(200):
            with comm.traffic():
                with comm.traffic():
                    one_step(model, x)
            assert len(comm._meters) == 1  # only the outer block is open between steps
        copies_per_step = len(outer.copies) // 200
    assert comm._meters == []
    with comm.traffic() as after:  # a new meter starts empty: nothing piled up anywhere
        one_step(model, x)
    assert len(after.copies) == copies_per_step


# ------------------------------------------------------------------------------------------------
# 2. torch.compile: refused before anything is touched; compiling the wrapper works
# ------------------------------------------------------------------------------------------------


def _snapshot(model):
    return {k: v.clone() for k, v in model.state_dict().items()}, [id(p) for p in model.parameters()]


@pytest.mark.parametrize("strategy", ["broadcast", "rewire", "clone"])
def test_compiled_module_is_refused_and_left_intact(strategy):
    model = small_model()
    compiled = torch.compile(model)
    state, ids = _snapshot(model)
    with pytest.raises(TypeError, match=r"torch\.compile.*torch\.compile\(DataParallel\(model"):
        dpteach.DataParallel(compiled, SLOTS, strategy=strategy)
    with pytest.raises(TypeError, match=r"torch\.compile"):
        dpteach.replicate(compiled, SLOTS, strategy=strategy)
    with pytest.raises(TypeError, match=r"torch\.compile"):
        dpteach.data_parallel(compiled, torch.randn(4, 4), SLOTS, strategy=strategy)
    # the learner's model: same parameter objects, same values, its children still its own
    assert [id(p) for p in model.parameters()] == ids
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert [type(m).__name__ for m in model.children()] == ["Linear", "ReLU", "Linear"]
    x = torch.randn(5, 4)
    assert_close(compiled._orig_mod(x), model(x))


def test_compiled_submodule_is_refused_with_its_name():
    model = small_model()
    model[0] = torch.compile(model[0])
    with pytest.raises(TypeError, match=r"submodule '0'.*model\.0 = model\.0\._orig_mod"):
        dpteach.DataParallel(model, SLOTS)


def test_one_slot_runs_the_compiled_module_itself():
    # with one slot nothing is replicated (the module itself runs), so a compiled module is fine there
    model = small_model()
    dp = dpteach.DataParallel(torch.compile(model, backend="eager"), ["cpu"])
    x = torch.randn(6, 4)
    assert_close(dp(x), model(x))


COMPILED_WRAPPER = """
import torch, dpteach
from torch import nn
def small_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
model, reference, x = small_model(), small_model(), torch.randn(8, 4)
reference(x).pow(2).sum().backward()
dp = torch.compile(dpteach.DataParallel(model, ["cpu", "cpu"]), backend="eager")  # the fix the message names
out = dp(x)
out.pow(2).sum().backward()
torch.testing.assert_close(out, reference(x))  # forward went well
for p, q in zip(model.parameters(), reference.parameters()):
    torch.testing.assert_close(p.grad, q.grad)  # backward went well: the original learned
print("compiled wrapper trains")
"""


def test_compiling_the_wrapper_trains_like_one_device():
    # in a process of its own: dynamo's caches would otherwise outlive the test (and its garbage, later tests' counts)
    import os
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", COMPILED_WRAPPER],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "compiled wrapper trains" in done.stdout


# ------------------------------------------------------------------------------------------------
# 3. ScriptModules replicate under every strategy, as torch.nn.parallel.replicate does
# ------------------------------------------------------------------------------------------------


def scripted_bn(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 2))


@pytest.mark.parametrize(
    "make", [torch.jit.script, lambda m: torch.jit.trace(m, torch.randn(4, 4))], ids=["script", "trace"]
)
@pytest.mark.parametrize("strategy", ["broadcast", "rewire"])
def test_script_module_trains_like_one_device(make, strategy):
    x = torch.randn(8, 4)
    model = make(scripted_bn())
    out = dpteach.DataParallel(model, SLOTS, strategy=strategy)(x)
    out.pow(2).sum().backward()
    # each slot normalises its own half, so compare with the plain model run on the halves
    halves = torch.cat([scripted_bn()(h) for h in x.chunk(2)])
    assert_close(out, halves)
    ref = scripted_bn()
    torch.cat([ref(h) for h in x.chunk(2)]).pow(2).sum().backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert p.grad is not None, f"{name}: the original ScriptModule's parameter got no gradient"
        assert_close(p.grad, q.grad)


def test_script_replicas_keep_their_children_findable():
    model = torch.jit.script(scripted_bn())
    replicas = dpteach.replicate(model, SLOTS)
    for slot, replica in enumerate(replicas):
        children = dict(replica.named_modules())
        assert list(children) == ["", "0", "1", "2", "3"]
        weight = children["0"].weight
        assert (weight.data_ptr() == model[0].weight.data_ptr()) == (slot == 0)  # slot 0 shares, others copy
        assert not weight.is_leaf  # an output of Broadcast: its gradient goes back to the original


# ------------------------------------------------------------------------------------------------
# 5. rarer inputs: torch's behaviour or an error that names the problem and the fix
# ------------------------------------------------------------------------------------------------


class SometimesNone(nn.Module):
    """Returns None for a piece whose first value is negative: replicas disagree on the structure."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(2, 2)

    def forward(self, x):
        return None if x[0, 0] < 0 else self.linear(x)


@pytest.mark.parametrize("first_negative", [True, False], ids=["None-then-tensor", "tensor-then-None"])
def test_gather_of_none_beside_a_tensor_is_refused(first_negative):
    x = torch.ones(4, 2)
    x[0 if first_negative else 2, 0] = -1  # the piece of slot 0 or of slot 1 gives None
    with pytest.raises(
        ValueError, match=r"replica 1 returned (None|a tensor) at output where replica 0 returned"
    ):
        dpteach.DataParallel(SometimesNone(), SLOTS)(x)
    with pytest.raises(ValueError, match="same structure"):
        dpteach.gather([None, torch.ones(2)] if first_negative else [torch.ones(2), None], "cpu")


def test_gather_of_none_everywhere_is_none():
    assert dpteach.gather([None, None], "cpu") is None  # as torch


@pytest.mark.parametrize("slots", [["cpu:0", "cpu:0"], ["cpu", "cpu:0"], [torch.device("cpu", 0)] * 3])
def test_cpu_0_slots_are_the_cpu(slots):
    model, x = small_model(), torch.randn(6, 4)
    assert_close(dpteach.DataParallel(model, slots)(x), model(x))
    assert all(r[0].weight.device == torch.device("cpu") for r in dpteach.replicate(model, slots))


class Interrupting(nn.Module):
    def __init__(self, exc):
        super().__init__()
        self.exc = exc
        self.linear = nn.Linear(2, 2)

    def forward(self, x):
        if x[0, 0] > 0:  # only slot 1's piece
            raise self.exc
        return self.linear(x)


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), SystemExit(3)], ids=["KeyboardInterrupt", "SystemExit"])
def test_interrupt_inside_a_replica_reaches_the_caller_as_itself(exc):
    x = torch.cat([-torch.ones(2, 2), torch.ones(2, 2)])
    threads = threading.active_count()
    with pytest.raises(type(exc)) as caught:
        dpteach.DataParallel(Interrupting(exc), SLOTS)(x)
    assert caught.value is exc
    assert threading.active_count() == threads  # no replica thread left behind


def test_empty_batch_fails_at_once_in_words():
    model = small_model()
    with pytest.raises(
        ValueError, match=r"empty batch: inputs\[0\] has size 0 along dim 0.*Skip empty batches"
    ):
        dpteach.DataParallel(model, SLOTS)(torch.randn(0, 4))
    with pytest.raises(ValueError, match=r"empty batch: kwargs\['x'\]"):
        dpteach.data_parallel(model, (), SLOTS, module_kwargs={"x": torch.randn(0, 4)})
    with torch.no_grad():  # inference passes through, as in torch and on one device
        assert dpteach.DataParallel(model, SLOTS)(torch.randn(0, 4)).shape == (0, 3)


@pytest.mark.parametrize(
    "thing", [lambda x: x * 2, "model", None, torch.randn(2)], ids=["function", "str", "None", "tensor"]
)
def test_dataparallel_of_a_non_module_is_refused_at_construction(thing):
    with pytest.raises(
        TypeError, match=r"DataParallel wraps an nn\.Module, got \w+; wrap it in an nn\.Module"
    ):
        dpteach.DataParallel(thing, SLOTS)


# ------------------------------------------------------------------------------------------------
# 6. fidelity against torch.nn.parallel, and the differences kept on purpose (README: "Where dpteach differs")
# ------------------------------------------------------------------------------------------------


def torch_replicate_on_cpu(monkeypatch, model, devices, detach):
    """torch.nn.parallel.replicate itself, with dpteach's device-agnostic comm and Broadcast under it (CPU has no NCCL)."""
    import sys

    import torch.nn.parallel.replicate  # noqa: F401 - the module, not the function the package re-exports

    import dpteach.functions

    tr = sys.modules["torch.nn.parallel.replicate"]
    monkeypatch.setattr(tr, "comm", comm)
    monkeypatch.setattr(tr, "_get_device_index", lambda d, optional=False: torch.device(d))
    monkeypatch.setattr(torch.nn.parallel._functions, "Broadcast", dpteach.functions.Broadcast)
    return tr.replicate(model, devices, detach)


@pytest.mark.parametrize("detach", [True, False])
def test_slot_0_holds_what_torch_gives_it(monkeypatch, detach):
    model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
    ours = dpteach.replicate(model, SLOTS, detach=detach)
    theirs = torch_replicate_on_cpu(monkeypatch, model, SLOTS, detach)
    for name, original in list(model.named_parameters()) + list(model.named_buffers()):
        owner, key = name.rsplit(".", 1)
        mine = [getattr(r.get_submodule(owner), key) for r in ours]
        torch_ = [getattr(r.get_submodule(owner), key) for r in theirs]
        assert (mine[0] is original) == (torch_[0] is original), (
            name
        )  # with detach: the original object itself
        assert type(mine[0]) is type(torch_[0]), name  # a Parameter where torch has one
        assert mine[1] is not original and mine[1].data_ptr() != original.data_ptr()  # slot 1 owns its copy
        assert (mine[1].grad_fn is None) == (torch_[1].grad_fn is None), name
    assert [n for n, _ in ours[0].named_parameters()] == [n for n, _ in theirs[0].named_parameters()]


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(3, 3)
        self.b = nn.Linear(3, 3)
        self.b.weight = self.a.weight  # tied

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


@pytest.mark.parametrize("strategy", ["broadcast", "rewire"])
def test_tied_weights_get_one_device_gradients(strategy):
    x = torch.randn(6, 3)
    ref = Tied()
    ref(x).pow(2).sum().backward()
    model = Tied()
    one_step(model, x, strategy=strategy)
    assert_close(
        model.a.weight.grad, ref.a.weight.grad
    )  # both uses of the tied weight summed, as on one device
    replica = dpteach.replicate(model, SLOTS, strategy=strategy)[1]
    # broadcast keeps the weight tied inside each replica (as torch); rewire clones each module, so
    # the replica holds two copies, both outputs of the one ReduceAdd node of the original weight
    assert (replica.a.weight is replica.b.weight) == (strategy == "broadcast")
    if strategy == "rewire":
        assert replica.a.weight.grad_fn is replica.b.weight.grad_fn


@pytest.mark.parametrize("strategy", ["broadcast", "rewire", "clone"])
def test_frozen_parameters_stay_without_gradient(strategy):
    model, x = small_model(), torch.randn(6, 4)
    model[0].requires_grad_(False)
    one_step(model, x, strategy=strategy)
    assert model[0].weight.grad is None and model[0].bias.grad is None  # as on one device
    for replica in dpteach.replicate(model, SLOTS, strategy=strategy):
        assert not replica[0].weight.requires_grad  # a frozen parameter's copies ask for nothing


class Sparse(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(10, 3, sparse=True)
        self.used = nn.Linear(3, 2)
        self.unused = nn.Linear(3, 2)

    def forward(self, i):
        return self.used(self.emb(i))


def test_sparse_gradients_broadcast_sparse_rewire_dense():
    i = torch.tensor([1, 2, 3, 1])
    ref = Sparse()
    ref(i).pow(2).sum().backward()  # one_step's loss
    for strategy, sparse in (("broadcast", True), ("rewire", False)):
        model = Sparse()
        one_step(model, i, strategy=strategy)
        grad = model.emb.weight.grad
        assert (
            grad.is_sparse == sparse
        )  # rewire sums into a dense tensor, as the C++ ReduceAdd (zeros + add_)
        assert_close(grad.to_dense(), ref.emb.weight.grad.to_dense())  # the same numbers either way


# ------------------------------------------------------------------------------------------------
# 7. the surprising parts, pinned down (docstrings and README say them)
# ------------------------------------------------------------------------------------------------


def test_unused_parameters_zero_under_broadcast_none_under_rewire():
    i = torch.tensor([1, 2, 3, 1])
    expected = {"broadcast": torch.zeros(2, 3), "rewire": None, "clone": None}
    for strategy, want in expected.items():
        model = Sparse()
        one_step(model, i, strategy=strategy)
        got = model.unused.weight.grad
        if want is None:
            assert got is None, strategy  # as on one device
        else:
            assert_close(got, want)  # as torch.nn.DataParallel: one Broadcast node reduces every parameter


def test_one_slot_runs_the_module_itself_so_clone_learns():
    model, x = small_model(), torch.randn(6, 4)
    ref = small_model()
    ref(x).pow(2).sum().backward()
    one_step(model, x, devices=["cpu"], strategy="clone")
    for p, q in zip(model.parameters(), ref.parameters()):
        assert_close(p.grad, q.grad)  # nothing is replicated with one slot: the clone bug cannot show
    model = small_model()
    one_step(model, x, devices=SLOTS, strategy="clone")
    assert all(p.grad is None for p in model.parameters())  # with two slots it does


def test_a_slow_answer_stops_at_the_time_limit_with_a_sentence():
    import time

    from dpteach import exercises

    def slow_replicate(network, devices, detach=False):
        time.sleep(60)  # a learner's answer that takes far too long (a sleep: the watchdog must wake it)

    import signal

    before = exercises.time_limit()
    exercises.set_time_limit(1)
    # the watchdog is armed only under Python's own SIGINT handler, as in Jupyter while a cell runs;
    # an earlier test in the same process may have left another handler installed
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        start = time.monotonic()
        result = exercises.check_clone_bug(slow_replicate)
        took = time.monotonic() - start
    finally:
        signal.signal(signal.SIGINT, handler)
        exercises.set_time_limit(before)
    assert not result.passed
    assert any("stopped after 1 seconds with your code still running" in m for m in result.messages), (
        result.messages
    )
    assert any("set_time_limit" in m for m in result.messages)
    assert took < 30  # stopped by the limit, not by the answer finishing
    assert exercises.time_limit() == before


def test_time_limit_refuses_nonsense():
    from dpteach import exercises

    with pytest.raises(ValueError, match="positive number of seconds, or None"):
        exercises.set_time_limit(0)
