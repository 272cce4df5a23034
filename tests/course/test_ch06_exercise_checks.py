"""Chapter 06's checks for Exercises 3-5: ``checks.slot0_memory``, ``checks.bytes_onto_slot_1`` and
``checks.bucket_copies``. Each wrong answer is matched to the mistake that gives it; what is asserted is
the mistake found (``Verdict.problem``) and that the message says what to change, not its wording. The
truths are derived from the model and the tensors, never copied from a run.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpteach.course import checks
from dpteach.measure import costs

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _fresh():
    checks.reset()
    yield
    checks.reset()


def make_model():
    return nn.Sequential(
        nn.Linear(64, 256), nn.BatchNorm1d(256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)
    )


# ---------------------------------------------------------------- Exercise 3: slot 0's memory


def test_slot0_memory_passes_the_data_ptr_answer():
    model = make_model()
    right = {"broadcast": True, "clone": False}  # broadcast's slot 0 is the model; a clone has its own memory
    assert checks.slot0_memory(right, "model", model, CPU).ok
    assert checks.slot0_memory({**right, "rewire": False}, "model", model, CPU).ok  # rewire clones too


@pytest.mark.parametrize(
    "shared, lands_in, problem",
    [
        ({"broadcast": torch.tensor(True), "clone": torch.tensor(True)}, "model", "values"),  # == on tensors
        ({"broadcast": False, "clone": True}, "model", "swapped"),
        ({"broadcast": False, "clone": False}, "model", "broadcast"),
        ({"broadcast": True, "clone": True}, "model", "clone"),
        ({"broadcast": True, "clone": False}, "replica", "lands in"),
    ],
)
def test_slot0_memory_names_the_mistake(shared, lands_in, problem):
    verdict = checks.slot0_memory(shared, lands_in, make_model(), CPU)
    assert not verdict.ok and verdict.problem == problem and verdict.message.startswith("Not yet: ")


def test_slot0_memory_asks_for_what_is_missing_and_gives_the_answer_last():
    model = make_model()
    assert "Set shared" in checks.slot0_memory({"broadcast": ...}, ..., model, CPU).message
    assert not checks.slot0_memory({"broadcast": True, "clone": False}, "slot 0", model, CPU).ok
    tries = [checks.slot0_memory({"broadcast": False, "clone": True}, "model", model, CPU) for _ in range(3)]
    assert [("The answer" in v.message) for v in tries] == [False, False, True]  # hints first, answer third
    assert "lands_in = 'model'" in tries[-1].message


# ---------------------------------------------------------------- Exercise 4: bytes onto slot 1


@pytest.mark.parametrize("strategy", ["broadcast", "clone"])
def test_bytes_onto_slot_1_is_one_model_copy(strategy):
    model = make_model()
    P, B = costs.state_nbytes(model).values()
    assert checks.bytes_onto_slot_1(P + B, model, CPU, strategy).ok  # (N - 1)·(P + B) with N = 2


def test_bytes_onto_slot_1_names_the_mistake():
    import dpteach

    model, meta = make_model(), torch.device("meta")
    P, B = costs.state_nbytes(model).values()
    with dpteach.comm.traffic() as t:
        dpteach.replicate(model, [CPU, meta], strategy="broadcast")
    onto = [c for c in t.copies if c.dst == meta]
    said = {
        0: "string",  # c.dst == "meta": a device never equals a string
        t.bytes: "every copy",  # the packs on devices[0] added in
        t.bytes - (P + B): "slot 0",  # only the copies that stay on devices[0]
        len(onto): "copies",  # how many, not how many bytes
        P: "buffers",  # the parameters alone
        12_345: "",  # nothing explains it
    }
    for guess, problem in said.items():
        verdict = checks.bytes_onto_slot_1(guess, model, CPU)
        assert not verdict.ok and verdict.problem == problem, (guess, verdict.problem)
    assert "Set onto_slot_1" in checks.bytes_onto_slot_1(..., model, CPU).message


# ---------------------------------------------------------------- Exercise 5: buckets


def tensors():
    return [torch.randn(256) for _ in range(1024)]  # 1,024 tensors of 1 KiB, as in the chapter


@pytest.mark.parametrize("bucket", [4096, 1000, 3072])
def test_bucket_copies_passes_the_counted_answer(bucket):
    ts, per = tensors(), 1024
    fit = max(1, bucket // per)  # whole tensors per bucket, and at least one
    buckets = -(-len(ts) // fit)
    packed = [fit * per] * (len(ts) // fit) if fit > 1 else []  # every full bucket of two or more is packed
    if fit > 1 and len(ts) % fit > 1:
        packed.append(len(ts) % fit * per)
    sent = len(ts) * per
    verdict = checks.bucket_copies((buckets, buckets + len(packed), sent + sum(packed)), ts, CPU, bucket)
    assert verdict.ok, verdict.message


@pytest.mark.parametrize(
    "bucket, guess, problem",
    [
        (4096, (1024, 1024, 1024 * 1024), "per tensor + no pack"),  # copy_per_tensor's counts
        (4096, (256, 256, 1024 * 1024), "no pack"),  # the packs left out of the copies and the bytes
        (1000, (1049, 1049, 1024 * 1024), "split"),  # tensors cut to fill 1000-byte buckets
        (3072, (342, 684, 2 * 1024 * 1024), "one-tensor pack"),  # the last bucket, one tensor, packed too
        (4096, (7, 8, 9), "sent + copies + bytes"),
    ],
)
def test_bucket_copies_names_the_mistake(bucket, guess, problem):
    verdict = checks.bucket_copies(guess, tensors(), CPU, bucket)
    assert not verdict.ok and verdict.problem == problem and verdict.message.startswith("Not yet: ")


def test_bucket_copies_asks_for_three_whole_numbers():
    assert "Write your prediction" in checks.bucket_copies(..., tensors(), CPU, 4096).message
    assert "three whole numbers" in checks.bucket_copies((1, 2), tensors(), CPU, 4096).message
