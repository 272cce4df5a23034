"""Chapter 11's ``try_it`` for Tasks 4 and 5 computes against the reference: a wrong answer that runs
is told "Not yet", never "Tried it"; the worked answers are told "Tried it"."""

from __future__ import annotations

import pytest
import torch

import dpteach
from dpteach import exercises
from dpteach.exercises import solutions
from dpteach.functions import Gather


def said(capsys, key, *answer) -> str:
    exercises.try_it(key, *answer)
    return capsys.readouterr().out


def pieces_reversed(inputs, devices, dim=0):
    """The worked scatter with its pieces in the wrong order."""
    return solutions.scatter(inputs, devices, dim)[::-1]


def pieces_sized_wrong(inputs, devices, dim=0):
    """Tensors cut into pieces of len // n rows (``split``, not ``chunk``): 5, 5, 5, 1 over 3 slots."""
    if isinstance(inputs, torch.Tensor):
        return list(inputs.split(inputs.shape[dim] // len(devices), dim))
    x, extra = inputs
    return [(p, extra) for p in pieces_sized_wrong(x, devices, dim)]


def pieces_detached(inputs, devices, dim=0):
    return solutions.scatter(
        type(inputs)(t.detach() if isinstance(t, torch.Tensor) else t for t in inputs), devices, dim
    )


def dict_copied(inputs, devices, dim=0):
    """A dict rebuilt as a plain copy on every slot: its non-tensor value is shared, but the type is kept."""
    return [(x, {"n": 3, "extra": None}) for x, _ in solutions.scatter(inputs, devices, dim)]


def gather_reversed(outputs, target_device, dim=0):
    return Gather.apply(target_device, dim, *outputs[::-1])


@pytest.mark.parametrize("wrong", [pieces_reversed, pieces_sized_wrong, pieces_detached, dict_copied])
def test_a_wrong_scatter_that_runs_is_not_approved(capsys, wrong):
    out = said(capsys, "scatter_gather", wrong, solutions.gather)
    assert out.startswith("Not yet: ") and "Tried it" not in out, out
    assert "pieces" in out  # it names where the first difference is


def test_a_wrong_gather_is_not_approved_even_after_a_right_scatter(capsys):
    out = said(capsys, "scatter_gather", solutions.scatter, gather_reversed)
    assert out.startswith("Not yet: ") and "joined" in out and "wrong values" in out, out


def test_scatter_on_every_slot_but_one_is_not_approved(capsys):
    def one_piece_short(inputs, devices, dim=0):
        return solutions.scatter(inputs, devices[:-1], dim)

    out = said(capsys, "scatter_gather", one_piece_short, solutions.gather)
    assert out.startswith("Not yet: ") and "entries, expected 3" in out, out


def test_the_worked_scatter_and_gather_are_tried(capsys):
    out = said(capsys, "scatter_gather", solutions.scatter, solutions.gather)
    assert out.startswith("Tried it: scatter gave 3 pieces like dpteach's"), out


def _rewire(network, devices, detach=False):
    return dpteach.replicate(network, devices, detach, strategy="rewire")


def slot0_copies(network, devices, detach=False):
    """Slot 0 gets fresh copies of the buffers, not the original's: the statistics are lost."""
    replicas = _rewire(network, devices, detach)
    for name, buffer in network.named_buffers():
        owner, _, key = name.rpartition(".")
        setattr(replicas[0].get_submodule(owner), key, buffer.clone())
    return replicas


def every_slot_shares(network, devices, detach=False):
    """Every slot gets the original's buffers: every replica updates them, not only slot 0's."""
    replicas = _rewire(network, devices, detach)
    for replica in replicas:
        for name, buffer in network.named_buffers():
            owner, _, key = name.rpartition(".")
            setattr(replica.get_submodule(owner), key, buffer)
    return replicas


def last_slot_shares(network, devices, detach=False):
    """The original's buffers on the last slot instead of slot 0."""
    replicas = _rewire(network, devices, detach)
    for name, buffer in network.named_buffers():
        owner, _, key = name.rpartition(".")
        setattr(replicas[-1].get_submodule(owner), key, buffer)
    return replicas


def top_level_dotted(network, devices, detach=False):
    """The original's buffers registered on slot 0's top module under their dotted names: forward never reads them."""
    replicas = _rewire(network, devices, detach)
    for name, buffer in network.named_buffers():
        replicas[0]._buffers[name] = buffer
    return replicas


@pytest.mark.parametrize(
    "wrong", [slot0_copies, every_slot_shares, last_slot_shares, top_level_dotted, _rewire]
)
def test_a_wrong_buffer_copy_that_runs_is_not_approved(capsys, wrong):
    out = said(capsys, "batchnorm", wrong)
    assert out.startswith("Not yet: ") and "Tried it" not in out, out
    assert "running_mean" in out and "slot 0's piece" in out, out


def test_the_worked_answer_is_tried_and_uses_the_public_api(capsys):
    out = said(capsys, "batchnorm", solutions.keep_bn_statistics)
    assert out.startswith("Tried it:") and "running_mean" in out, out
    assert "._buffers" not in exercises.solution_source("batchnorm")  # named_buffers and setattr only


def test_the_public_api_answer_keeps_the_buffers_registered():
    model = torch.nn.Sequential(torch.nn.BatchNorm1d(3))
    model[0].register_buffer("scratch", torch.zeros(1), persistent=False)
    slot0 = solutions.keep_bn_statistics(model, ["cpu", "cpu"])[0]
    for name, buffer in model.named_buffers():
        assert dict(slot0.named_buffers())[name] is buffer  # the original's own, still registered
    assert "0.scratch" not in slot0.state_dict()  # assigning kept it non-persistent, as register_buffer would
