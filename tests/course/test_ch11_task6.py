"""Task 6 (PR #20995, one copy instead of two) runs on CPU in chapter 11, and its check names each mistake.

``tests/exercises/test_exercises.py`` checks the stub and the worked answer like every task's; here, the
double copy the task fixes (counted as chapter 08 once printed it, with a ``"meta"`` slot standing in for a
second GPU), where the task lives, and the wrong answers a learner most likely writes.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import nbformat
import pytest
import torch
from torch import nn

import dpteach
from dpteach import exercises

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = nbformat.read(ROOT / "notebooks" / "11_exercises.ipynb", as_version=4)


def copies(model, slots):
    """The copies replicate(model, slots, strategy="clone") makes, counted by op and destination."""
    with dpteach.comm.traffic() as t:
        dpteach.replicate(model, slots, strategy="clone")
    return Counter((c.op, str(c.dst)) for c in t.copies)


def test_clone_then_to_copies_each_tensor_twice_onto_a_meta_slot():
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))  # 4 parameters and 3 buffers: 7 tensors
    slot0 = copies(model, [torch.device("cpu")])
    assert slot0 == Counter({("clone", "cpu"): 7})  # slot 0: one clone each
    assert copies(model, [torch.device("cpu"), "meta"]) - slot0 == Counter(
        {("clone", "cpu"): 7, ("to", "meta"): 7}
    )


def test_on_its_own_device_a_slot_gets_one_clone():
    """A model on "meta" with slot 0 on "meta" stands in for a model on cuda:0: no .to, one clone."""
    model = nn.Linear(4, 3).to("meta")
    slot0 = copies(model, [torch.device("meta")])
    assert slot0 == Counter({("clone", "meta"): 2})
    assert copies(model, [torch.device("meta"), "meta"]) - slot0 == Counter({("clone", "meta"): 2})


def test_chapter_11_holds_task_6_and_chapter_08_no_copy_of_it():
    roles = {c.metadata.get("dpteach", {}).get("role"): c.source for c in NOTEBOOK.cells
             if c.metadata.get("dpteach", {}).get("exercise") == "one_copy"}  # fmt: skip
    assert roles["stub"] == exercises.stub_source("one_copy")
    assert roles["check"] == exercises.check_source("one_copy") == "exercises.check_copy_once(copy_once)"
    assert exercises.TASKS["one_copy"].chapter == "11"
    ch08 = nbformat.read(ROOT / "notebooks" / "08_real_gpus.ipynb", as_version=4)
    assert not [c for c in ch08.cells if "one_copy" in c.source or "copy_once" in c.source]


@pytest.mark.parametrize(
    "answer, phrase",
    [
        (
            lambda t, d: t.detach().clone().to(d),
            "from cpu to meta: 2 copies (clone, _to_copy)",
        ),  # before #20995
        (lambda t, d: t.detach().to(d), "from cpu to cpu: no copy was made"),  # .to onto its own device
        (lambda t, d: t.detach().clone(), "from cpu to meta: the copy is on cpu"),
        (  # the fix, comparing a device with a string: torch.device("cpu") != "cpu"
            lambda t, d: t.detach().to(d) if t.device != d else t.detach().clone(),
            "from cpu to cpu (given as the string 'cpu'): no copy was made",
        ),
    ],
    ids=["clone-then-to", "to-alone", "clone-alone", "device-against-string"],
)
def test_each_wrong_answer_gets_its_sentence(answer, phrase):
    result = exercises.check_copy_once(answer)
    assert not result.passed and phrase in str(result), str(result)


def test_a_clone_before_or_after_to_is_told_what_to_drop():
    """`.to(d).clone()` copies twice onto another device, as `.clone().to(d)` does, but its clone comes
    second: the hint must say what to change in either order, not "do not `clone()` first", in words."""
    from dpteach.exercises import _feedback

    for answer, listed in (
        (lambda t, d: t.detach().to(d).clone(), "_to_copy, clone"),
        (lambda t, d: t.detach().clone().to(d), "clone, _to_copy"),
    ):
        _feedback.forget_failures()
        first, second = (str(exercises.check_copy_once(answer)) for _ in range(2))
        _feedback.forget_failures()
        assert (
            f"from cpu to meta: 2 copies ({listed}) where one does; `_to_copy` is the copy `.to` makes"
            in first
        )
        assert "(step 1 of 2) one copy is enough" in first
        assert "so a `clone()` there is a second copy" in first  # either order
        assert "where they differ, `.to(device)` alone" in second and "`clone()` alone" in second
        assert (
            "first" not in second.split("Hint:")[1] and "copy=True" not in second
        )  # no code: the worked answer has it


def test_the_string_hint_only_when_the_device_case_held():
    """`.to(d)` alone makes no copy on the tensor's own device, given a torch.device or a string: that is
    the "shared" mistake, not a string comparison, so the string hint must not be shown; the hint belongs
    to an answer that copies for torch.device("cpu") but not for "cpu"."""
    to_alone = str(exercises.check_copy_once(lambda t, d: t.to(d)))
    assert "hands back the tensor itself" in to_alone
    assert "torch.device(device)" not in to_alone, to_alone
    compares_string = str(exercises.check_copy_once(lambda t, d: t.to(d) if t.device != d else t.clone()))
    assert "torch.device(device)" in compares_string
    assert "hands back the tensor itself" not in compares_string, compares_string


def test_a_copy_that_keeps_its_edge_answers_task_1_not_task_6():
    """`.to(device, copy=True)` is one copy autograd records: Task 1's answer (an edge back), while Task 6's
    copy is plain data, as the BEFORE line's; so neither task's answer passes the other."""
    exercises.forget_failures()  # the first step of the hint, whatever ran before
    kept = exercises.check_copy_once(lambda t, d: t.to(d, copy=True))
    assert not kept.passed and "history" in kept.kinds, str(kept)
    assert "carries autograd history" in str(kept) and "Task 1's job" in str(kept)
    assert exercises.check_copy_once(lambda t, d: t.detach().to(d, copy=True)).passed
    assert exercises.check_clone_bug(_replicas_from(lambda p, d: p.to(d, copy=True))).passed
    assert not exercises.check_clone_bug(_replicas_from(lambda p, d: p.detach().to(d, copy=True))).passed
    exercises.forget_failures()


def _replicas_from(copy):
    """Task 1's stub with ``copy(param, device)`` as its one line."""
    from copy import deepcopy

    def replicate_by_clone(network, devices, detach=False):
        replicas = []
        for device in devices:
            replica = deepcopy(network).to(device)
            for original, twin in zip(network.modules(), replica.modules()):
                for key, param in original._parameters.items():
                    if param is not None:
                        twin._parameters.pop(key)
                        setattr(twin, key, copy(param, device))
            replicas.append(replica)
        return replicas

    return replicate_by_clone
