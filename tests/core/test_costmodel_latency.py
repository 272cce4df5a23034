"""The cost model's latency per message (NCCL's model) and a given thread start, by hand."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from dpteach.measure import costmodel as cm
from dpteach.measure import published

# round numbers, so every expected value is worked out by hand: 1e12 FLOP/s at EFFICIENCY 0.5
ROUND = cm.GPU("round", {"fp32": 2e12}, mem_bw=1e12, link_bw=1e9, link="test link", source="test")
INFINITE = dataclasses.replace(ROUND, mem_bw=math.inf, link_bw=math.inf)
# 10 ms per message, 1 ms per ring step
SLOW = dataclasses.replace(INFINITE, base_latency_s=0.01, step_latency_s=0.001)
WORK = cm.Workload(
    flops_fwd=1e12, flops_bwd=2e12, param_bytes=100_000_000, param_tensors=10,
    input_bytes=8_000_000, output_bytes=4_000_000, batch=64,
)  # fmt: skip


@pytest.fixture(autouse=True)
def half_of_peak(monkeypatch):
    monkeypatch.setattr(cm, "EFFICIENCY", 0.5)


def test_each_ddp_bucket_pays_a_base_and_two_n_minus_one_steps():
    # 100 MB in 40 MB buckets (40, 40, 20), ready at 40%, 80% and 100% of backward on 4 GPUs:
    # forward 0.25 s, backward 0.5 s, so ready at 0.45, 0.65 and 0.75 s; bytes cost nothing here
    pred = cm.predict(
        WORK, SLOW, 4, "DDP", bucket_bytes=40_000_000, first_bucket_bytes=40_000_000, latency=True
    )
    reduces = [p for p in pred.parts if p.name == "all-reduce"]
    each = 0.01 + 2 * (4 - 1) * 0.001  # base + 2(n-1) steps = 16 ms
    assert [p.seconds for p in reduces] == pytest.approx([each] * 3)
    assert [p.start for p in reduces] == pytest.approx([0.45, 0.65, 0.75])
    assert pred.total_s == pytest.approx(0.75 + each)  # only the last bucket's latency sticks out


@pytest.mark.parametrize("n", [2, 8])
def test_the_ring_latency_grows_with_its_steps(n):
    pred = cm.predict(WORK, SLOW, n, "DDP", bucket_bytes=10**9, first_bucket_bytes=10**9, latency=True)
    [bucket] = [p for p in pred.parts if p.name == "all-reduce"]  # one bucket of every gradient
    assert bucket.seconds == pytest.approx(0.01 + 2 * (n - 1) * 0.001)
    assert pred.total_s == pytest.approx(3.0 / n + 0.01 + 2 * (n - 1) * 0.001)


def test_each_data_parallel_message_pays_a_base_and_one_step():
    # 2 GPUs: scatter, gather and scatter grad one copy each; 100 MB is ten 10 MiB chunks
    # (nine full ones and 5,628,160 bytes), so ten broadcasts and ten reduces
    assert cm.messages(WORK, 2) == {
        "scatter": 1,
        "replicate": 10,
        "gather": 1,
        "scatter grad": 1,
        "reduce": 10,
    }
    pred = cm.predict(WORK, SLOW, 2, "DataParallel", thread_s=0.0, latency=True)
    one = 0.01 + 0.001
    link = {p.name: p.seconds for p in pred.parts if p.lane == "link"}
    assert link == pytest.approx({"scatter": one, "replicate": 10 * one, "gather": one,
                                  "scatter grad": one, "reduce": 10 * one})  # fmt: skip
    # the messages, forward 0.5 s and backward 1.0 s (each GPU its half), one after another
    assert pred.total_s == pytest.approx(one + 10 * one + 0.5 + one + one + 1.0 + 10 * one)


def test_the_limits_hold_with_latency_left_out_and_with_it_in():
    for n in (2, 4, 8):
        assert cm.predict(WORK, SLOW, n, "DDP").total_s == pytest.approx(3.0 / n)  # latency off: as before
        ddp = cm.predict(WORK, SLOW, n, "DDP", bucket_bytes=10**9, first_bucket_bytes=10**9, latency=True)
        assert ddp.total_s == pytest.approx(
            3.0 / n + 0.01 + 2 * (n - 1) * 0.001
        )  # compute/n + the serial tail
        dp = cm.predict(WORK, SLOW, n, "DataParallel", latency=True).total_s
        serial = n * cm.PYTHON_THREAD_S + (3 * (n - 1) + 2 * 10) * 0.011  # threads and every message
        assert dp == pytest.approx(3.0 / n + serial)
    for strategy in cm.STRATEGIES:  # n = 1 is the plain step, latency or not: nothing is sent
        assert cm.predict(WORK, SLOW, 1, strategy, latency=True).total_s == pytest.approx(3.0)


def test_the_profiles_carry_nccls_numbers_from_the_data_file():
    latency = json.loads(cm.GPUS_FILE.read_text())["latency"]
    assert "src/graph/tuning.cc" in latency["source"] and "assumption" in latency["assumed"]
    assert (latency["base_s"], latency["step_s"]) == (8.4e-6, {"NVLink": 3.4e-6, "PCIe": 5.7e-6})
    assert cm.GPUS["T4"].step_latency_s == 5.7e-6  # PCIe
    assert all(cm.GPUS[g].step_latency_s == 3.4e-6 for g in ("V100-SXM2", "A100-SXM", "H200-SXM"))
    assert all(g.base_latency_s == 8.4e-6 for g in cm.GPUS.values())


def test_a_latency_prediction_says_so_on_its_figure():
    import matplotlib

    matplotlib.use("Agg")
    work = dataclasses.replace(WORK, flops_fwd=1e9, flops_bwd=2e9)
    ax = cm.draw_timeline(cm.predict(work, "A100-SXM", 2, "DDP", latency=True))
    assert cm.LEFT_OUT_WITH_LATENCY in ax.get_xlabel() and "modelled" in ax.get_xlabel()
    ax = cm.draw_timeline(cm.predict(work, "A100-SXM", 2, "DDP"))
    assert cm.LEFT_OUT in ax.get_xlabel()


def test_a_given_thread_start_is_fed_to_the_model_and_named_given():
    fed = cm.predict(WORK, INFINITE, 4, "DataParallel", thread_s=0.002).total_s
    assert fed == pytest.approx(3.0 / 4 + 4 * 0.002)
    assert "thread start 2000 µs, given" in cm.table(WORK, ("A100-SXM",), (1, 2), thread_s=0.002)
    assert "thread start 100 µs, assumed" in cm.table(WORK, ("A100-SXM",), (1, 2))


def test_the_overhead_rows_are_the_step_over_the_plain_step():
    [m] = [m for m in published.shipped() if m.id == "ddp-benchmark-resnet50"]
    rows = published.compare(m)
    for (_, got, modelled), r in zip(published.overhead(m), rows[1:]):
        assert got == pytest.approx(r.measured_s - rows[0].measured_s)
        assert modelled == pytest.approx(r.modelled_s - rows[0].modelled_s)
    with_latency = published.overhead(m, latency=True)
    assert all(a[2] > b[2] for a, b in zip(with_latency, published.overhead(m)))  # latency only adds
    assert "6x ->   6x" in published.gap_table([m])  # n = 2: one NVLink, 0.94 ms modelled of 6 ms


def test_the_copies_charged_nccls_latency_are_hatched_and_the_legend_says_it_is_assumed():
    """DataParallel's scatter, gather and scatter grad are plain copies between GPUs, not NCCL calls:
    with NCCL's latency in, their bars are hatched and the legend says that latency is assumed. NCCL's
    own calls (replicate's broadcast, the reduce, DDP's all-reduces) and a model without latency stay plain."""
    import matplotlib

    matplotlib.use("Agg")
    work = dataclasses.replace(WORK, flops_fwd=1e9, flops_bwd=2e9)

    def hatched(pred):
        ax = cm.draw_timeline(pred)
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        names = [p.name for p in pred.parts]
        assert len(ax.patches) == len(names)  # one bar per part, drawn in order
        return {n for n, b in zip(names, ax.patches) if b.get_hatch()}, [t for t in legend if "NCCL" in t]

    parts, note = hatched(cm.predict(work, "A100-SXM", 4, "DataParallel", latency=True))
    assert parts == set(cm.PEER_COPIES) and len(note) == 1 and "NCCL's latency (assumed)" in note[0]
    assert hatched(cm.predict(work, "A100-SXM", 4, "DataParallel")) == (set(), [])
    assert hatched(cm.predict(work, "A100-SXM", 4, "DDP", latency=True)) == (set(), [])
