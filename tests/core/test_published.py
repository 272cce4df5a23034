"""The loader of measured step times (published ones and ours) and the model's prediction beside them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpteach.measure import costmodel, published

FIXTURE = Path(__file__).parent / "fixtures" / "bench_fictional_gpus.json"


RESNETS = ["ddp-benchmark-resnet50", "ddp-benchmark-resnet101"]
PAIR = ["hf-gpt2-dataparallel", "hf-gpt2-ddp"]


def test_the_published_file_loads_with_citations_and_workloads():
    shipped = published.shipped()
    assert [m.id for m in shipped if not m.ours] == RESNETS + PAIR
    for m in shipped:
        assert m.citation and m.hardware and m.gpu in costmodel.GPUS and m.workload is not None
    assert [m.id for m in published.curves(shipped)] == RESNETS
    for m in published.curves(shipped):
        assert [n for n, _ in m.points] == [1, 2, 4, 8]
    raw = json.loads(published.PUBLISHED.read_text())["measurements"][0]
    assert raw["points"][0] == {"n": 1, "seconds": 0.097}  # the README's '1 GPUs -- no ddp' p50


# the README's nvidia-smi topo -m, GPU rows and columns (benchmarks/distributed/ddp/README.md)
TOPOLOGY = """
X   NV1 NV1 NV2 NV2 SYS SYS SYS
NV1 X   NV2 NV1 SYS NV2 SYS SYS
NV1 NV2 X   NV2 SYS SYS NV1 SYS
NV2 NV1 NV2 X   SYS SYS SYS NV1
NV2 SYS SYS SYS X   NV1 NV1 NV2
SYS NV2 SYS SYS NV1 X   NV2 NV1
SYS SYS NV1 SYS NV1 NV2 X   NV2
SYS SYS SYS NV1 NV2 NV1 NV2 X
"""


def best_ring(n: int) -> int:
    """The most NVLinks the slowest hop of any ring through GPUs 0 to n - 1 can have (0: a hop off NVLink)."""
    from itertools import permutations

    links = [
        [int(c[2:]) if c.startswith("NV") else 0 for c in row.split()] for row in TOPOLOGY.split("\n") if row
    ]
    if n == 2:
        return links[0][1]
    return max(min(links[a][b] for a, b in zip((0, *rest), (*rest, 0))) for rest in permutations(range(1, n)))


def test_each_ring_gets_the_links_the_readmes_topology_gives_it():
    by_id = {m.id: m for m in published.shipped()}
    for name in RESNETS:
        m = by_id[name]
        assert dict(m.ring_links) == {n: best_ring(n) for n in (2, 4, 8)} == {2: 1, 4: 1, 8: 2}
        assert m.profile_at(2).link_bw == 25e9 and m.profile_at(8).link_bw == 50e9  # NVLink 2: 25 GB/s a link
        assert m.profile_at(1).link_bw == costmodel.GPUS["V100-SXM2"].link_bw == 6 * 25e9  # all six links
        assert "1, 1, 2 NVLinks (25, 25, 50 GB/s one way)" in published.table(m)
        assert "V100s as inferred" in m.hardware


def test_the_pair_is_the_guides_train_runtime_over_its_steps_beside_the_model():
    raw = {m["id"]: m for m in json.loads(published.PUBLISHED.read_text())["measurements"]}
    # the guide's printed train_runtime, over --max_steps 200
    assert [raw[i]["train_runtime_s"] for i in PAIR] == [110.5948, 101.9003]
    for i in PAIR:
        assert raw[i]["points"] == [{"n": 2, "seconds": pytest.approx(raw[i]["train_runtime_s"] / 200)}]
    [pair] = published.pairs(published.shipped()).values()
    assert [m.strategy for m in pair] == ["DataParallel", "DDP"]
    assert all(m.gpu == "TITAN RTX" and m.workload == costmodel.large_workload("gpt2-small") for m in pair)
    assert costmodel.GPUS["TITAN RTX"].link_bw == 2 * 25e9  # NV2: two NVLink 2 links
    assert pair[0].work_at(2).batch == 8  # 4 sequences per GPU
    measured, modelled = published.pair_ratio(pair)
    assert measured == pytest.approx(110.5948 / 101.9003)
    text = published.pair_table(pair)
    assert f"measured {measured:.3f}, modelled {modelled:.3f}" in text and "one run of each" in text
    [head] = [line for line in text.splitlines() if "measured/modelled" in line]
    assert head.rstrip().endswith("measured/modelled")  # every column heads numbers under it
    assert "  seconds per step on 2 GPUs:" in text.splitlines()
    for m in pair:
        [r] = published.compare(m)
        assert f"{r.measured_s:>11.3f}{r.modelled_s:>12.3f}{r.ratio:>18.2f}x" in text
    # the model's ratio, under any thread start and efficiency tried, puts DataParallel behind DDP
    grid = [
        published.pair_ratio(pair, thread_s=t, efficiency=e)[1]
        for t in (0.0, 100e-6, 1e-3)
        for e in (0.3, 0.5, 0.7)
    ]
    assert "assumed pairs" not in text
    assert 1 < min(grid) <= modelled <= max(grid)
    # DataParallel gathers the whole ModelOutput (logits and keys and values with the loss), DDP nothing:
    # half of the modelled gap between the two steps is that gather
    dp, ddp = (costmodel.predict(m.work_at(2), m.profile_at(2), 2, m.strategy) for m in pair)
    assert dp.seconds("gather") > 0.5 * (dp.total_s - ddp.total_s)
    assert not any(p.name == "gather" for p in ddp.parts)
    [scatter_grad] = [p for p in dp.parts if p.name == "scatter grad"]
    assert scatter_grad.seconds < 1e-6  # only the loss's gradient goes back


def test_weak_scaling_gives_each_gpu_its_batch(monkeypatch):
    m = published.load(published.PUBLISHED)[0]
    assert m.work_at(8).batch == 32 * 8 and m.work_at(8).flops_fwd == pytest.approx(
        8 * m.work_at(1).flops_fwd
    )
    # n = 1 by hand: 32 images of (fwd + bwd) FLOPs at EFFICIENCY of V100's fp32 peak
    monkeypatch.setattr(costmodel, "EFFICIENCY", 0.5)
    row = published.compare(m)[0]
    by_hand = 32 * (m.workload.flops_fwd + m.workload.flops_bwd) / (15.7e12 * 0.5)
    assert row.modelled_s == pytest.approx(by_hand)
    assert row.ratio == pytest.approx(0.097 / by_hand)


def test_the_table_prints_measured_modelled_and_their_ratio():
    m = published.load(published.PUBLISHED)[0]
    text = published.table(m)
    assert "published" in text and "measured/modelled" in text
    # provenance in one line that names where the whole citation is; the data file keeps it
    assert f"{m.in_short} (the full citation: published.json, {m.id})" in text
    assert m.citation not in text and m.hardware not in text and "#35198" in m.citation
    ratios = [r.ratio for r in published.compare(m)]
    assert all(0.5 < r < 2 for r in ratios)  # the model is within a factor of 2 of every point
    assert text.splitlines()[-2].strip().endswith(f"{ratios[-1]:.2f}x")  # the last n, before DDP on 1 GPU


def test_our_bench_json_loads_as_ours(tmp_path):
    data = json.loads(FIXTURE.read_text())
    [m] = published.load(FIXTURE)  # a fictional GPU: no profile, so nothing modelled
    assert m.ours and m.strategy == "DataParallel" and m.points[0] == (1, data["scaling"]["dpteach_s"][0])
    assert all(r.modelled_s is None for r in published.compare(m))
    assert published.table(m).splitlines()[-1].split()[-2:] == ["-", "-"]
    data["env"]["device"] = "NVIDIA A100-SXM4-80GB"
    data["scaling"]["workload"] = {
        "flops_fwd": 1e12, "flops_bwd": 2e12, "param_bytes": 10**8, "param_tensors": 4,
        "input_bytes": 10**6, "output_bytes": 10**6, "batch": data["scaling"]["batch"],
    }  # fmt: skip
    (tmp_path / "a100.json").write_text(json.dumps(data))
    [m] = published.load(tmp_path / "a100.json")
    assert m.gpu == "A100-SXM" and all(r.modelled_s > 0 for r in published.compare(m))
    data["scaling"]["kind"] = "one gpu"
    (tmp_path / "one.json").write_text(json.dumps(data))
    assert published.load(tmp_path / "one.json") == []  # slots sharing a card: the model says nothing


def test_other_files_are_refused(tmp_path):
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(ValueError, match="neither"):
        published.load(tmp_path / "x.json")
    data = json.loads(published.PUBLISHED.read_text())
    data["measurements"][0]["gpu"] = "GTX 480"
    (tmp_path / "p.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="no profile"):
        published.load(tmp_path / "p.json")


def test_the_ddp_benchmark_keeps_ddp_on_one_gpu_apart_from_the_plain_step():
    # the README's '1 GPUs -- 1M/1G' rows: DDP's overhead at n = 1, apart from its growth from 2 to 8
    by_id = {m.id: m for m in published.shipped()}
    assert by_id["ddp-benchmark-resnet50"].ddp_one_gpu_s == 0.100
    assert by_id["ddp-benchmark-resnet101"].ddp_one_gpu_s == 0.171
    assert "DDP on 1 GPU: 100.0 ms measured, +3.1% over the plain step" in published.table(
        by_id["ddp-benchmark-resnet50"]
    )
    resnets = [by_id[i] for i in RESNETS]
    assert all("DGX" not in m.hardware and "#35198" in m.citation for m in resnets)


def test_the_plain_step_at_one_gpu_is_labelled_no_ddp_in_the_table_and_the_figure():
    import matplotlib

    matplotlib.use("Agg")
    by_id = {m.id: m for m in published.shipped()}
    m = by_id["ddp-benchmark-resnet50"]
    rows = published.table(m).splitlines()
    n_column = [line.split()[0] for line in rows if line.strip()[:1].isdigit()]
    first = next(i for i, line in enumerate(rows) if "measured ms" in line) + 1
    assert n_column[0] == "1" and "1 (no DDP)" in rows[first] and n_column[1:] == ["2", "4", "8"]
    ax = published.draw([m])
    assert "measured at 1 (no DDP): the plain step" in [line.get_label() for line in ax.get_lines()]
    assert [t.get_text() for t in ax.get_xticklabels()][0] == "1\n(no DDP)"
    measured = ax.get_lines()[0]  # the filled points: DDP's, from n = 2 on
    assert list(measured.get_xdata()) == [2, 4, 8]
    # a measurement whose n = 1 is DDP itself keeps its plain "1"
    ddp_at_one = published.Measurement(**{**m.__dict__, "ddp_one_gpu_s": None})
    assert not ddp_at_one.plain_at_one and ddp_at_one.n_label(1) == "1"


def test_unexplained_is_the_measured_minus_modelled_overhead_gap_table_prints():
    shipped = published.shipped()
    gaps = published.unexplained(shipped)
    ddp = [m for m in shipped if m.strategy == "DDP" and m.workload is not None and m.scaling == "weak"]
    assert published.overhead(next(m for m in ddp if m.pair)) == []  # the pair has no plain step
    want = sorted(got - mod for m in ddp for _, got, mod in published.overhead(m))
    assert gaps == pytest.approx(want) and len(gaps) == 6  # ResNet-50 and -101 at n = 2, 4 and 8
    table = published.gap_table(shipped)
    for m in ddp:
        for _, got, mod in published.overhead(m):
            assert f"{got * 1e3:>10.1f}{mod * 1e3:>10.2f}" in table
    assert 4e-3 < gaps[0] < gaps[-1] < 20e-3  # ms, not the model's fraction of a millisecond


def test_measured_prints_the_published_points_and_no_model():
    shipped = [m for m in published.shipped() if not m.ours]
    text = published.measured(shipped)
    r50 = dict(next(m for m in shipped if m.id == "ddp-benchmark-resnet50").points)
    assert f"resnet50, DDP, batch 32 per GPU: {r50[1] * 1e3:.0f} ms at n = 1 (no DDP), " in text
    assert f"{8 * r50[1] / r50[8]:.1f}x the samples per second of one" in text  # weak scaling: 8 batches
    [(dp, ddp)] = published.pairs(shipped).values()
    ratio = dp.points[0][1] / ddp.points[0][1]
    assert f"DataParallel's step {100 * (ratio - 1):.1f}% longer (one run of each)" in text
    assert "modelled" not in text and "8.5% longer" in text  # the guide's 110.6 s against 101.9 s


def test_ratios_prints_every_measured_step_with_its_ratio_and_what_ddp_adds():
    """One compact table: a row per run with each point's measured / modelled ratio, a row under each DDP
    curve of what DDP adds over the plain step, measured / modelled; and each pair's DataParallel step
    over DDP's."""
    shipped = published.shipped()
    text = published.ratios(shipped, latency=True)
    assert "NCCL's latency per message in" in text
    for m in shipped:
        [row] = [line for line in text.splitlines() if line.startswith(f"  {m.model.split(',')[0].split(' (')[0].removeprefix('torchvision ')}")
                 and f", {m.strategy}, " in line]  # fmt: skip
        assert all(f"{r.ratio:.2f}x" in row for r in published.compare(m, latency=True))
        for _, got, mod in published.overhead(m, latency=True):
            assert f"{got * 1e3:.1f}/{mod * 1e3:.2f}" in text
    assert "DDP adds (ms): measured/modelled" in text  # its unit, which is which
    [pair] = published.pairs(shipped).values()
    measured, modelled = published.pair_ratio(pair, latency=True)
    assert f"measured {measured:.3f}, modelled {modelled:.3f}" in text
    adds = sum(1 for m in shipped if m.plain_at_one)  # a "DDP adds" row under each such curve
    assert len(text.splitlines()) == 2 + len(shipped) + adds + len(published.pairs(shipped))  # compact
    assert max(len(line) for line in text.splitlines()) <= 80  # readable in a notebook's output


def test_one_figure_draws_every_run_beside_the_model_with_one_legend_below():
    import matplotlib

    matplotlib.use("Agg")
    shipped = published.shipped()
    fig = published.figure(shipped, latency=True)
    assert len(fig.axes) == len(published.curves(shipped)) + len(published.pairs(shipped))
    assert len(fig.legends) == 1 and all(ax.get_legend() is None for ax in fig.axes)


def test_each_strategy_has_one_colour_in_the_published_figures():
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.colors import to_hex

    from dpteach.measure.costmodel import STRATEGY_COLOURS

    shipped = published.shipped()
    ax = published.draw(published.curves(shipped))
    measured = [line for line in ax.get_lines() if line.get_label().startswith("measured (published)")]
    assert measured and {to_hex(line.get_color()) for line in measured} == {STRATEGY_COLOURS["DDP"]}
    [pair] = published.pairs(shipped).values()
    bars = published.draw_pair(pair).patches
    solid = [to_hex(b.get_facecolor()) for b in bars[::2]]  # measured bars: DataParallel, then DDP
    assert solid == [STRATEGY_COLOURS["DataParallel"], STRATEGY_COLOURS["DDP"]]
