"""The course's running example tells the same story wherever it is used (chapters 01, 03, the tour)."""

import re
import shutil

import pytest
from torch.testing import assert_close

from dpteach.course import story
from dpteach.replicate import FIXED


def test_one_device_learns_and_clone_does_not():
    reference = story.train(None, steps=30)
    broken = story.train("clone", ["cpu", "cpu"], steps=30)
    assert reference.learned  # the loss falls by more than a quarter
    assert not broken.learned and len(set(broken.losses)) == 1  # the clone loss never moves at all (#19540)
    # same model, same data, same first loss (on a GPU, half-batch kernels may round the last digit)
    assert_close(broken.losses[0], reference.losses[0], rtol=1e-6, atol=0)


def test_fixed_strategies_follow_the_reference_step_by_step():
    reference = story.train(None, steps=20)
    for strategy in FIXED:
        run = story.train(strategy, ["cpu", "cpu"], steps=20)
        assert_close(run.losses, reference.losses, rtol=1e-5, atol=1e-6)  # the same curve as one device


def test_one_step_reports():
    clone = story.one_step("clone")
    assert not clone.matches and clone.missing == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert all(g is not None for r in clone.replica_grads for g in r.values())  # replicas hold the gradients
    assert "nobody reads" in clone.summary()
    assert story.one_step("rewire").matches and story.one_step("broadcast").matches


def test_sgd_step_skips_parameters_without_gradient():
    model = story.make_model()
    before = [p.detach().clone() for p in model.parameters()]
    story.sgd_step(model, 0.1)  # no backward yet: every .grad is None
    assert all((a == b).all() for a, b in zip(before, model.parameters()))


def test_four_moves_picture_ends_at_the_loss():
    picture = story.four_moves_picture()
    text = picture if isinstance(picture, str) else picture.source
    assert "loss" in text and text.index("gather") < text.rindex("loss")  # the loss comes after gather
    assert ("output", "loss") in story.FOUR_MOVES_STEPS


def test_four_moves_picture_fits_a_notebook_column():
    picture = story.four_moves_picture()
    if isinstance(picture, str) or not shutil.which("dot"):
        pytest.skip("needs graphviz's dot to lay the picture out")
    svg = picture.pipe(format="svg").decode()
    width_pt = float(re.search(r'<svg width="([\d.]+)pt"', svg).group(1))
    assert width_pt * 96 / 72 <= 900  # shown at full size in a ~900 px column, so its labels stay readable


def test_four_moves_picture_draws_one_lane_per_slot():
    lanes = story.four_moves_lanes(slots=3)
    assert [b for a, b in lanes if a == "replicate"] == ["replica 0", "replica 1", "replica 2"]
    assert ("replica 2", "parallel_apply 2") in lanes and ("output 2", "gather") in lanes
    picture = story.four_moves_picture()
    if isinstance(picture, str):
        assert "replica 1 -> model" in picture  # the text form names the missing edge of every replica
        assert story.FORWARD_EDGE.replace("\n", " ") in picture  # and says what a solid arrow carries back
        return
    assert "cluster_slot0" in picture.source and "cluster_slot1" in picture.source  # a lane per slot
    assert picture.source.count("style=dashed") == 3  # one dashed edge per replica, and its legend entry
    assert "dash_from -> dash_to" in picture.source  # the legend explains the dashed arrow
    # and the solid one: a gradient edge runs back along it, so gather's arrows carry one too
    assert "solid_from -> solid_to" in picture.source and "gradient edge" in story.FORWARD_EDGE


def test_four_moves_picture_draws_an_edge_back_only_where_a_step_records_one():
    import torch.nn.functional as F

    import dpteach

    devices = ["cpu", "cpu"]
    x, y = story.make_data()  # as chapter 00's step: x requires no grad
    for strategy in ("broadcast", "clone"):  # the picture's replicate is the one before the fix
        model = story.make_model()
        pieces = dpteach.scatter(x, devices)
        assert all(p.grad_fn is None and not p.requires_grad for p in pieces)  # the batch's way: no edge
        outputs = [r(p) for r, p in zip(dpteach.replicate(model, devices, strategy=strategy), pieces)]
        assert all(o.grad_fn is not None for o in outputs)  # from the replicas on, every arrow has one
        assert F.mse_loss(dpteach.gather(outputs, devices[0]), y).grad_fn is not None
    lanes = story.four_moves_lanes(2)
    blue = {(a, b) for a, b in lanes if story._look(a, b) is story.BATCH_LOOK}
    assert blue == {("x", "scatter")} | {(a, b) for a, b in lanes if "piece" in a + b}  # x's and its pieces'
    black = [(a, b) for a, b in lanes if not story._look(a, b)]
    assert ("replica 1", "parallel_apply 1") in black and ("gather", "output") in black
    assert "no grad" in story.BATCH_EDGE and "before the" in story.COPY_EDGE
    picture = story.four_moves_picture()
    if isinstance(picture, str):
        assert (
            f"x -> scatter   ({story.BATCH_EDGE.replace(chr(10), ' ')})" in picture
        )  # the text form says it
        return
    assert "blue_from -> blue_to" in picture.source  # the legend explains the blue arrow
