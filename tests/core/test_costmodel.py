"""The cost model's arithmetic, on hand-computed cases, and its two limits (n = 1, infinite bandwidth)."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from torch import nn

from dpteach.measure import bench
from dpteach.measure import costmodel as cm

# A made-up profile with round numbers, so every expected value below is worked out by hand.
ROUND = cm.GPU("round", {"fp32": 2e12}, mem_bw=1e12, link_bw=1e9, link="test link", source="test")
# 1e12 FLOPs forward at 1e12 FLOP/s (EFFICIENCY of 2e12 when EFFICIENCY is 0.5), 100 MB of parameters
WORK = cm.Workload(
    flops_fwd=1e12, flops_bwd=2e12, param_bytes=100_000_000, param_tensors=10,
    input_bytes=8_000_000, output_bytes=4_000_000, batch=64,
)  # fmt: skip
INFINITE = dataclasses.replace(ROUND, mem_bw=math.inf, link_bw=math.inf)


@pytest.fixture(autouse=True)
def half_of_peak(monkeypatch):
    monkeypatch.setattr(cm, "EFFICIENCY", 0.5)  # the hand-computed figures assume 1e12 FLOP/s


@pytest.mark.parametrize("strategy", cm.STRATEGIES)
def test_one_gpu_is_the_plain_step(strategy):
    pred = cm.predict(WORK, ROUND, 1, strategy)
    assert pred.total_s == pytest.approx(3.0)  # (1e12 + 2e12) FLOPs at 1e12 FLOP/s
    assert [p.name for p in pred.parts] == ["forward", "backward"]


def test_infinite_bandwidth_leaves_compute_over_n_and_the_python_threads():
    for n in (2, 4, 8):
        ddp = cm.predict(WORK, INFINITE, n, "DDP").total_s
        dp = cm.predict(WORK, INFINITE, n, "DataParallel").total_s
        assert ddp == pytest.approx(3.0 / n)
        assert dp == pytest.approx(3.0 / n + n * cm.PYTHON_THREAD_S)


def test_data_parallel_on_two_gpus_by_hand():
    pred = cm.predict(WORK, ROUND, 2, "DataParallel")
    link = {p.name: p.seconds for p in pred.parts if p.lane == "link"}
    assert link["scatter"] == pytest.approx(4e6 / 1e9)  # half the batch's 8 MB leaves GPU 0
    assert link["replicate"] == pytest.approx(0.1)  # 100 MB broadcast, pipelined
    # the other half of the 4 MB output over the link, then GPU 0's own half copied in: a read and a write
    assert link["gather"] == pytest.approx(2e6 / 1e9 + 2 * 2e6 / 1e12)
    assert link["reduce"] == pytest.approx(0.1)  # nccl.reduce sums in its kernel: no pass of its own
    flatten = [p for p in pred.parts if p.name == "flatten"]
    assert [p.lane for p in flatten] == ["GPU 0", "GPU 1"]  # each replica flattens its own gradients
    assert [p.seconds for p in flatten] == pytest.approx([2 * 100e6 / 1e12] * 2)  # read + write, side by side
    expected = 0.004 + 0.1 + 2 * cm.PYTHON_THREAD_S + 0.5 + 0.002 + 4e-6 + 0.002 + 1.0 + 2e-4 + 0.1
    assert pred.total_s == pytest.approx(expected)


def test_thread_starts_are_serial_and_the_joins_overlap_the_forwards_by_hand():
    # parallel_apply: start() on each thread in turn (each returns once its thread runs), then join()
    # on each; the joins wait on the forwards, so nothing is charged after the last forward ends
    thread = 0.25
    pred = cm.predict(WORK, ROUND, 2, "DataParallel", thread_s=thread)
    after_replicate = 0.004 + 0.1  # scatter 4 MB, then replicate 100 MB, at 1 GB/s
    starts = [p for p in pred.parts if p.name.startswith("start thread")]
    assert [(p.start, p.seconds) for p in starts] == pytest.approx(
        [(after_replicate, 0.25), (after_replicate + 0.25, 0.25)]
    )
    forwards = [p for p in pred.parts if p.name == "forward"]
    assert [p.start for p in forwards] == pytest.approx([after_replicate + 0.25, after_replicate + 0.5])
    [gather] = [p for p in pred.parts if p.name == "gather"]
    assert gather.start == pytest.approx(after_replicate + 0.5 + 0.5)  # the last forward's end: no join
    assert not [p for p in pred.parts if "join" in p.name]


def test_ddp_buckets_overlap_backward_by_hand():
    # 100 MB in 40 MB buckets: 40, 40, 20 MB, ready at 40%, 80%, 100% of backward on 4 GPUs
    pred = cm.predict(WORK, ROUND, 4, "DDP", bucket_bytes=40_000_000)
    reduces = [p for p in pred.parts if p.name == "all-reduce"]
    fwd, bwd = 0.25, 0.5
    assert [p.seconds for p in reduces] == pytest.approx([1.5 * 0.04, 1.5 * 0.04, 1.5 * 0.02])
    assert reduces[0].start == pytest.approx(fwd + 0.4 * bwd)
    assert reduces[1].start == pytest.approx(fwd + 0.8 * bwd)  # the link is free again by then
    assert reduces[2].start == pytest.approx(fwd + bwd)
    assert pred.total_s == pytest.approx(fwd + bwd + 0.03)  # only the last bucket sticks out
    assert cm.ring_seconds(40e6, 4, 1e9) == pytest.approx(0.06)


def test_buckets_close_one_tensor_past_the_cap_the_first_at_one_mib():
    mib = 2**20
    work = dataclasses.replace(
        WORK, param_bytes=40 * mib, grad_bytes=(mib // 2, 4 * mib, 10 * mib, 20 * mib, 5 * mib + mib // 2)
    )
    # the first bucket closes on the 4 MiB tensor that takes it past 1 MiB; the next on the one past 25 MiB
    assert cm.buckets(work) == [mib // 2 + 4 * mib, 30 * mib, 5 * mib + mib // 2]
    assert cm.buckets(work, first_bucket_bytes=25 * mib) == [mib // 2 + 34 * mib, 5 * mib + mib // 2]


def test_ddp_on_a_small_model_overlaps_its_first_bucket_with_backward():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024))  # 8.4 MB, under 25 MiB
    work = cm.workload(model, torch.randn(16, 1024))
    assert work.grad_bytes[:2] == (1024 * 4, 1024 * 1024 * 4)  # the last layer's bias, then its weight
    pred = cm.predict(work, "A100-SXM", 4, "DDP")
    reduces = [p for p in pred.parts if p.name == "all-reduce"]
    backward_end = max(p.end for p in pred.parts if p.name == "backward")
    assert len(reduces) == 2 and reduces[0].start < backward_end  # the last layer's bucket hides
    one = cm.predict(work, "A100-SXM", 4, "DDP", first_bucket_bytes=25 * 2**20)
    assert [p.start for p in one.parts if p.name == "all-reduce"] == [pytest.approx(backward_end)]


def test_slow_link_serialises_the_buckets():
    slow = dataclasses.replace(ROUND, link_bw=5e7)  # 1 s per 50 MB bucket on 2 GPUs
    pred = cm.predict(WORK, slow, 2, "DDP", bucket_bytes=50_000_000)
    first, second = [p for p in pred.parts if p.name == "all-reduce"]
    assert second.start == pytest.approx(first.end)  # waits for the link, not for backward
    assert second.start > 0.5 + 1.0  # backward had it ready at 1.5 s
    assert pred.total_s == pytest.approx(1.0 + 2 * 1.0)  # first ready at 1.0 s, then two on the link


def test_workload_counts_a_linear_layer():
    torch.manual_seed(0)
    layer = nn.Linear(8, 4)
    before = layer.weight.grad
    work = cm.workload(layer, torch.randn(16, 8))
    assert work.flops_fwd == 2 * 16 * 8 * 4
    assert work.flops_bwd == 2 * 16 * 8 * 4  # the weight's gradient only: the input needs none
    assert (work.param_bytes, work.param_tensors) == ((8 * 4 + 4) * 4, 2)
    assert (work.input_bytes, work.output_bytes, work.batch) == (16 * 8 * 4, 16 * 4 * 4, 16)
    assert layer.weight.grad is before  # put back as it was
    assert work.scaled(32).flops_fwd == 2 * work.flops_fwd and work.scaled(32).param_bytes == work.param_bytes


@pytest.mark.parametrize("wrong", [0.1, 0, -16, 32.0, True, "32"])
def test_scaled_refuses_what_is_not_a_whole_number_of_rows_and_says_what_it_takes(wrong):
    work = cm.workload(nn.Linear(8, 4), torch.randn(16, 8))
    with pytest.raises(ValueError, match=r"number of rows, a positive whole number") as raised:
        work.scaled(wrong)
    assert "work.scaled(work.batch // 10)" in str(raised.value)  # what to write instead of a factor


def test_the_table_labels_its_speed_ups_and_prints_a_small_one_with_two_decimals():
    work = cm.workload(bench.mlp(1024, "cpu"), torch.zeros(16, 1024)).scaled(256)
    small = cm.table(work.scaled(25), ("A100-SXM",), latency=True)
    assert "in brackets: the speed-up, that GPU's plain step (n=1) over this step" in small
    dp = next(line for line in small.splitlines() if "DataParallel" in line)
    up = (
        cm.predict(work.scaled(25), "A100-SXM", 1).total_s
        / cm.predict(work.scaled(25), "A100-SXM", 4, "DataParallel", latency=True).total_s
    )
    assert up < 0.095 and f"({up:.2f}x)" in dp and "(0.0x)" not in small


def test_profiles_are_loaded_with_their_sources():
    data = json.loads(cm.GPUS_FILE.read_text())["gpus"]
    assert {"T4", "A100-SXM", "H200-SXM"} <= set(cm.GPUS)
    assert cm.GPUS["T4"].link.startswith("PCIe") and cm.GPUS["A100-SXM"].link.startswith("NVLink")
    for name, gpu in cm.GPUS.items():
        assert gpu.flops["fp32"] > 1e12 and gpu.mem_bw > gpu.link_bw > 1e9
        assert all(entry["read"] for entry in data[name]["numbers"].values())
        assert data[name]["datasheet"] in gpu.source


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="no GPU profile"):
        cm.predict(WORK, "GTX 480", 2)
    with pytest.raises(ValueError, match="strategy"):
        cm.predict(WORK, ROUND, 2, "Horovod")
    with pytest.raises(ValueError, match="bf16"):
        cm.predict(WORK, "T4", 2, dtype="bf16")


def test_timeline_says_modelled_and_names_the_profile():
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    pred = cm.predict(WORK, "A100-SXM", 2, "DataParallel")
    ax = cm.draw_timeline(pred)
    assert "modelled, A100-SXM" in ax.get_title()
    rows = ["GPU 0", "GPU 1", "to and from GPU 0\n(over the links)", "host (Python)"]
    assert [t.get_text() for t in ax.get_yticklabels()] == rows  # the shared rows say where the bytes go
    fig = cm.draw_over_n(WORK)
    assert all("modelled" in a.get_title() for a in fig.axes)
    # what the model leaves out is said once, under the panels, not in three overlapping labels
    [caption] = [t.get_text() for t in fig.texts]
    # what is left out, and so what the curves can show: a step this short is mostly what they leave out
    assert caption.startswith(f"modelled; {cm.LEFT_OUT}, no Python overhead") and "not the heights" in caption
    with_latency = cm.draw_over_n(WORK, latency=True)
    [caption] = [t.get_text() for t in with_latency.texts]
    assert caption.startswith(f"modelled; {cm.LEFT_OUT_WITH_LATENCY}, no Python overhead")
    # the one-GPU line: below it the modelled step is slower than the plain one
    assert all(any(line.get_ydata()[0] == 1 and "one GPU" in line.get_label() for line in a.get_lines())
               for a in fig.axes)  # fmt: skip


def test_timeline_labels_each_bucket_and_names_the_bars_too_thin_to_see():
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    mib = 2**20
    work = dataclasses.replace(WORK, param_bytes=60 * mib, grad_bytes=(mib, 29 * mib, 30 * mib))
    ddp = cm.predict(work, ROUND, 2, "DDP")
    ax = cm.draw_timeline(ddp)
    buckets = [p for p in ddp.parts if p.name == "all-reduce"]
    assert len(buckets) == 3  # 1 MiB, then 25 MiB caps: bucket 2 closes on its 29 MiB tensor
    assert [t.get_text() for t in ax.texts] == ["bucket 1", "bucket 2", "bucket 3"]
    assert [t.get_position()[0] for t in ax.texts] == pytest.approx([p.start * 1e3 for p in buckets])
    dp = cm.predict(WORK, ROUND, 2, "DataParallel")
    legend = [t.get_text() for t in cm.draw_timeline(dp).get_legend().get_texts()]
    thin = {p.name for p in dp.parts if p.seconds < cm.THIN * dp.total_s and p.lane != "python"}
    assert thin and all(f"{n} (too thin to see)" in legend for n in thin)
    assert "forward" in legend  # a wide bar keeps its plain name


def test_flatten_copies_only_chunks_of_several_tensors():
    mib = 2**20
    # parameter order 4 MiB, 4 KiB | 12 MiB alone | 1 KiB, 1 KiB (10 MiB chunks, as _take_tensors cuts them)
    sizes = (4 * mib, 4 * 1024, 12 * mib, 1024, 1024)
    work = dataclasses.replace(WORK, param_bytes=sum(sizes), grad_bytes=tuple(reversed(sizes)))
    assert cm.packed_bytes(work) == 4 * mib + 4 * 1024 + 2 * 1024  # the lone 12 MiB is flattened as a view
    flatten = [p for p in cm.predict(work, ROUND, 2, "DataParallel").parts if p.name == "flatten"]
    assert [p.seconds for p in flatten] == pytest.approx([2 * cm.packed_bytes(work) / 1e12] * 2)
    assert cm.packed_bytes(WORK) == WORK.param_bytes  # no per-tensor sizes: every byte, an upper bound


def test_the_assumed_constants_can_be_replaced_per_prediction():
    # half the rate, twice the time
    assert cm.predict(WORK, ROUND, 1, efficiency=0.25).total_s == pytest.approx(6.0)
    for n in (2, 4):
        dp = cm.predict(WORK, INFINITE, n, "DataParallel", thread_s=0.0).total_s
        assert dp == pytest.approx(3.0 / n)  # no thread cost, no byte cost: compute over n, as DDP
        slow = cm.predict(WORK, INFINITE, n, "DataParallel", thread_s=0.01).total_s
        assert slow == pytest.approx(3.0 / n + n * 0.01)
        ddp = cm.predict(WORK, ROUND, n, "DDP", thread_s=1.0).total_s
        assert ddp == cm.predict(WORK, ROUND, n, "DDP").total_s  # DDP starts no thread per replica
    assert cm.EFFICIENCY == 0.5 and cm.PYTHON_THREAD_S == 100e-6  # the module's assumptions untouched


def test_the_profiles_label_the_link_as_the_models_input_not_a_measurement():
    text = cm.profiles(("T4", "A100-SXM"))
    head, t4, a100 = text.splitlines()
    assert "link (modelled: spec-sheet peak, one way)" in head and "measured" not in text
    assert t4.startswith("T4") and "16 GB/s, PCIe 3.0 x16" in t4  # 15.75 GB/s, rounded
    assert a100.startswith("A100-SXM") and "300 GB/s, NVLink 3" in a100 and "19.5 TFLOP/s" in a100
    assert t4.index("GB/s,") == a100.index("GB/s,")  # one column
    assert "links at their spec-sheet peak" in cm.table(WORK, ("T4",), (1, 2))


def test_a_profile_with_fewer_links_between_two_gpus_carries_what_they_carry():
    v100 = cm.GPUS["V100-SXM2"]
    assert (v100.links, v100.link_bw_per_link, v100.link_bw) == (6, 25e9, 150e9)  # all six at once
    one = v100.with_links(1)
    assert one.link_bw == 25e9 and one.link == "NVLink 2, 1 link" and one.flops == v100.flops
    assert v100.with_links(2).link == "NVLink 2, 2 links"
    with pytest.raises(ValueError, match="counts 6 links"):
        v100.with_links(7)
    with pytest.raises(ValueError, match="counts 0 links"):
        cm.GPUS["A100-SXM"].with_links(1)  # not counted: its link_bw is the only figure
    # a ring on one link of 25 GB/s takes six times as long as on all six
    assert cm.ring_seconds(1e9, 2, one.link_bw) == pytest.approx(6 * cm.ring_seconds(1e9, 2, v100.link_bw))


def test_timelines_drawn_on_one_span_share_the_axis_and_judge_thinness_by_it():
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    dp, ddp = (cm.predict(WORK, "A100-SXM", 4, s) for s in cm.STRATEGIES)
    assert dp.total_s > ddp.total_s
    ax = cm.draw_timeline(ddp, span_s=dp.total_s)
    assert ax.get_xlim()[1] == pytest.approx(dp.total_s * 1e3 * 1.02)
    own = cm.draw_timeline(ddp)
    assert own.get_xlim()[1] == pytest.approx(ddp.total_s * 1e3 * 1.02)


def test_one_gpu_profile_may_be_named_by_a_plain_string():
    """A learner who writes cm.table(work, "A100-SXM") gets that profile, not one per letter."""
    work = cm.workload(nn.Linear(8, 8), torch.zeros(4, 8))
    assert cm.table(work, "A100-SXM") == cm.table(work, ("A100-SXM",))
    assert cm.profiles("T4") == cm.profiles(("T4",))


def test_the_breakdown_adds_up_and_says_in_words_which_way_it_went():
    """``breakdown`` prints, in µs, one GPU's step and DDP's as each GPU's compute plus the all-reduce
    time after it; then, per profile, whether splitting the compute saved more than the all-reduces add."""
    import re

    small = dataclasses.replace(WORK, flops_fwd=1e8, flops_bwd=2e8, param_bytes=8_000_000, grad_bytes=())
    text = cm.breakdown(small, ("A100-SXM", "T4"), 4)
    head, columns, *rows = text.splitlines()
    assert "µs per step" in head and "compute" in columns and "all-reduce" in columns
    numbers, words = rows[:2], rows[2:]
    for name, row, said in zip(("A100-SXM", "T4"), numbers, words):
        plain, compute, after, step = map(int, re.findall(r"\d+", row.split(name)[1])[:4])
        pred = cm.predict(small, name, 4, "DDP")
        assert step == round(pred.total_s * 1e6) and abs(compute + after - step) <= 1  # rounded parts
        saved = int(re.search(rf"^  {name}: splitting the compute saves (\d+) µs", said)[1])
        assert abs(saved - (plain - compute)) <= 1  # the plain step less each GPU's compute, rounded
        assert said.endswith("quicker than one GPU" if plain > step else "slower than one GPU")
        assert f"the {after} µs the all-reduces add" in said
    assert "slower" in words[1]  # the T4's PCIe link: 8 MB of gradients cost more than the compute saved
