"""Chapter 06: the bytes each strategy copies, counted by dpteach.comm.traffic(); the costs helpers.

Expected byte counts are derived from the model (parameter and buffer bytes times copies), never
copied from a run. Timings are measured but never asserted.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.testing import assert_close

import dpteach
from dpteach.measure import costs, timer

ROOT = Path(__file__).resolve().parents[2]


def make_model():
    return nn.Sequential(
        nn.Linear(64, 256), nn.BatchNorm1d(256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)
    )


def sizes(model):
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    return params, buffers


def test_state_nbytes_counts_each_tensor_once():
    model = make_model()
    assert costs.state_nbytes(model) == dict(zip(["parameters", "buffers"], sizes(model)))
    a = nn.Linear(8, 8)
    tied = nn.Sequential(a, nn.Linear(8, 8))
    tied[1].weight = a.weight
    expected = (8 * 8 + 8 + 8) * 4  # one shared weight, two biases
    assert costs.state_nbytes(tied)["parameters"] == expected  # a tied weight is one tensor


@pytest.mark.parametrize("n", [2, 3, 4])
def test_step_bytes_per_strategy_on_one_device(n):
    model = make_model()
    P, B = sizes(model)
    x = torch.randn(32, 64)
    out_bytes = 32 * 10 * 4  # the gathered output
    devices = ["cpu"] * n
    broadcast = costs.step_traffic(model, x, devices, "broadcast")
    assert broadcast.by_op() == {
        "broadcast": (n - 1) * (P + B),
        "gather": out_bytes,
    }  # slot 0 aliases: N - 1 copies
    for strategy in ["clone", "rewire"]:
        model.zero_grad()
        t = costs.step_traffic(model, x, devices, strategy)
        assert t.by_op() == {"clone": n * (P + B), "gather": out_bytes}  # slot 0 deep-copied too: N copies
    assert broadcast.cross_device_bytes == 0  # nothing crossed devices: no "to", no "reduce_add"


def test_every_step_pays_again():
    model = make_model()
    x = torch.randn(32, 64)
    first = costs.step_traffic(model, x, ["cpu"] * 2)
    second = costs.step_traffic(model, x, ["cpu"] * 2)
    assert first.by_op() == second.by_op() and first.bytes > 0  # replicas are rebuilt on every forward


def test_one_slot_copies_nothing():
    model = make_model()
    for strategy in dpteach.STRATEGIES:
        t = costs.step_traffic(model, torch.randn(32, 64), ["cpu"], strategy)
        assert t.bytes == 0  # DataParallel on one slot calls the module itself
        model.zero_grad()


@pytest.mark.parametrize("n", range(1, 9))
def test_replicate_bytes_grow_with_the_slots(n):
    model = make_model()
    P, B = sizes(model)
    expected = {"clone": n * (P + B), "rewire": n * (P + B), "broadcast": (n - 1) * (P + B)}
    for strategy, want in expected.items():
        with dpteach.comm.traffic() as t:
            dpteach.replicate(model, ["cpu"] * n, strategy=strategy)
        assert t.bytes == want  # the plot's lines: N copies, or N - 1


def test_step_traffic_leaves_gradients_and_uses_the_loss():
    model = make_model()
    costs.step_traffic(model, torch.randn(32, 64), ["cpu"] * 2, loss_fn=lambda out: out.sum())
    assert all(p.grad is not None for p in model.parameters())  # backward ran, gradients reached the model


def test_clone_then_to_copies_twice_to_device_once():
    tensor = torch.randn(1024, 1024)
    with dpteach.comm.traffic() as before:
        a = costs.clone_then_to(tensor, "cpu")
    with dpteach.comm.traffic() as after:
        b = costs.to_device(tensor, "cpu")
    nbytes = tensor.numel() * 4
    assert [c.op for c in before.copies] == [
        "clone",
        "to",
    ] and before.bytes == 2 * nbytes  # pre-#20995: two copies
    assert [c.op for c in after.copies] == ["to"] and after.bytes == nbytes  # #20995: one
    assert torch.equal(a, tensor) and torch.equal(b, tensor)  # the same result
    assert (
        a.data_ptr() != tensor.data_ptr() and b.data_ptr() != tensor.data_ptr()
    )  # real copies, even on one device


@pytest.mark.parametrize("count, bucket", [(1024, 10 * 1024 * 1024), (1024, 64 * 1024), (7, 3000)])
def test_coalesced_copies_one_per_bucket(count, bucket):
    tensors = [torch.randn(256) for _ in range(count)]  # 1 kB each
    with dpteach.comm.traffic() as per:
        one_by_one = costs.copy_per_tensor(tensors, "cpu")
    with dpteach.comm.traffic() as co:
        coalesced = costs.copy_coalesced(tensors, "cpu", buffer_size=bucket)
    per_bucket = max(1, bucket // 1024)  # whole tensors that fit in one bucket
    assert len(per.copies) == count  # one copy per tensor
    buckets = math.ceil(count / per_bucket)
    alone = 1 if count % per_bucket == 1 else 0  # a last bucket of one tensor: torch flattens it into a view
    assert len(co.transfers) == buckets  # one copy sent per bucket ...
    # ... each bucket of several tensors packed first, locally
    assert [c.op for c in co.copies] == ["pack", "coalesced"] * (buckets - alone) + ["coalesced"] * alone
    assert per.bytes == co.by_op()["coalesced"] == count * 1024  # every byte sent once
    assert co.by_op()["pack"] == (count - alone) * 1024  # and packed once, but for a bucket of one
    assert co.bytes == 2 * per.bytes - alone * 1024  # coalescing saves calls, not bytes
    for t, a, b in zip(tensors, one_by_one, coalesced):
        assert torch.equal(a, t) and torch.equal(b, t)  # the same values, in the same order


def test_coalesced_keeps_order_across_dtypes():
    tensors = [torch.arange(3.0), torch.arange(4), torch.arange(5.0)]
    out = costs.copy_coalesced(tensors, "cpu")
    assert all(
        torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(out, tensors)
    )  # buckets group by dtype


def test_coalesced_pieces_have_their_own_version_counters():
    out = costs.copy_coalesced([torch.zeros(3), torch.zeros(3)], "cpu")
    out[0].add_(1)
    assert (
        out[0]._version == 1 and out[1]._version == 0
    )  # an in-place update of one piece leaves the other alone


@pytest.mark.cuda
def test_step_bytes_across_two_distinct_devices():
    """The chapter's table for two devices, counted on a GPU and the CPU."""
    pair = [torch.device("cuda", 0), torch.device("cpu")]
    model = make_model().to(pair[0])
    P, B = sizes(model)
    x = torch.randn(32, 64, device=pair[0])
    x1 = x.chunk(2)[1].numel() * 4  # slot 1's piece of the input, and later of the output's gradient
    g1 = 16 * 10 * 4  # slot 1's piece of the output gradient
    out_bytes = 32 * 10 * 4
    expected = {
        "clone": {"clone": 2 * (P + B), "to": P + B, "scatter": x1 + g1, "gather": out_bytes},
        "rewire": {
            "clone": 2 * (P + B),
            "to": P + B,
            "reduce_add": P,
            "scatter": x1 + g1,
            "gather": out_bytes,
        },
        "broadcast": {"broadcast": P + B, "reduce_add": P, "scatter": x1 + g1, "gather": out_bytes},
    }
    # Between distinct devices "broadcast" packs its buckets first, a local pass counted apart: the
    # float tensors share one bucket, the int64 step counter travels alone (a lone tensor is not
    # packed), and backward packs the gradients once on each of the two devices.
    floats = P + sum(b.numel() * b.element_size() for b in model.buffers() if b.is_floating_point())
    expected["broadcast"]["pack"] = floats + 2 * P
    for strategy, want in expected.items():
        model.zero_grad()
        assert costs.step_traffic(model, x, pair, strategy).by_op() == want  # forward copies, backward reduce


@pytest.mark.cuda
def test_clone_then_to_across_devices():
    tensor = torch.randn(1000, device="cuda")
    with dpteach.comm.traffic() as t:
        out = costs.clone_then_to(tensor, "cpu")
    assert [(c.op, c.src.type, c.dst.type) for c in t.copies] == [
        ("clone", "cuda", "cuda"),
        ("to", "cuda", "cpu"),
    ]
    assert_close(out, tensor.cpu())


def test_time_in_rounds_pools_the_kept_rounds_and_throws_one_away():
    calls = {"a": 0, "b": 0}

    def count(name):
        calls[name] += 1

    pooled, spread = timer.time_in_rounds(
        {"a": lambda: count("a"), "b": lambda: count("b")}, ["cpu"], repeats=4, rounds=3
    )
    assert all(len(t.samples) == 3 * 4 for t in pooled.values())  # the kept rounds' samples, pooled
    assert calls == {"a": 4 * (4 + 2), "b": 4 * (4 + 2)}  # 3 kept rounds and 1 thrown away, 2 warm-ups each
    assert spread >= 1.0


def test_time_in_rounds_spread_is_the_rounds_largest_ratio(monkeypatch):
    medians = iter([9.0, 1.0, 2.0, 3.0])  # the first round is thrown away
    monkeypatch.setattr(
        timer, "time_in_turns", lambda fns, devices, repeats: {n: timer.Timing([next(medians)]) for n in fns}
    )
    pooled, spread = timer.time_in_rounds({"a": lambda: None}, ["cpu"], repeats=1, rounds=3)
    assert pooled["a"].samples == (1.0, 2.0, 3.0) and spread == 3.0


def test_time_in_rounds_times_without_the_garbage_collector_and_restores_it():
    import gc

    seen = []
    timer.time_in_rounds({"a": lambda: seen.append(gc.isenabled())}, ["cpu"], repeats=2, rounds=1)
    assert seen and not any(seen)  # off while timing
    assert gc.isenabled()  # and back on after
    gc.disable()
    try:
        timer.time_in_rounds({"a": lambda: None}, ["cpu"], repeats=1, rounds=1)
        assert not gc.isenabled()  # a collector that was off stays off
    finally:
        gc.enable()


def test_seconds_label_picks_a_unit():
    assert [costs.seconds_label(s) for s in (2e-5, 1.5e-3, 0.5, 2.0)] == ["20 µs", "1.5 ms", "500 ms", "2 s"]


def test_timing_plots_draw_no_mathtext_and_every_glyph_is_in_the_font():
    """matplotlib's own log-axis labels are mathtext (``$10^{-4}$``), and drawing mathtext looks up the
    STIX fonts: where those are not installed, chapter 06's figures printed findfont warnings. The
    timing plots label their ticks in plain text, in characters the default font (DejaVu Sans) has."""
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    from matplotlib import cbook, font_manager, ft2font, text

    timings = {"a": [timer.Timing([2e-5, 3e-5]), timer.Timing([4e-3, 6e-3])]}
    ax = costs.plot_timings([4096, 2**22], timings, xlabel="tensor size", xticklabels=["4 KiB", "4 MiB"])
    ax.figure.canvas.draw()  # tick labels get their text when drawn
    shown = [t.get_text() for t in ax.figure.findobj(text.Text) if t.get_text()]
    assert {"4 KiB", "4 MiB", "20 µs", "5 ms"} <= set(shown)  # ticks at the points, times in units
    assert not [s for s in shown if cbook.is_math_text(s)]
    charmap = ft2font.FT2Font(font_manager.findfont("DejaVu Sans")).get_charmap()
    assert not {c for s in shown for c in s if c != "\n" and ord(c) not in charmap}
