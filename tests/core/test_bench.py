"""The benchmark and the profiler run and report what they measured (sizes shrunk; no timing is asserted)."""

from __future__ import annotations

import json

import torch
from torch import nn

from dpteach import comm
from dpteach.measure import bench, published
from dpteach.measure.profile import PHASES, profile_step


def test_quick_bench_writes_json_and_plot(tmp_path):
    results = bench.run(
        tmp_path, quick=True, repeats=2, page_faults=True
    )  # leave this process's allocator alone
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved["env"]["statistic"] == "median" and "page faults" in saved["env"]["allocator"]
    assert (tmp_path / "bench.png").stat().st_size > 10_000  # a real picture
    r = saved["replicate_vs_copy"]
    assert r["model_bytes"] == sum(comm.nbytes(p) for p in bench.big_model(8, "cpu").parameters())
    assert all(r[s]["replicate_s"] > 0 for s in ("broadcast", "rewire", "clone"))
    assert set(saved["step_vs_plain"]["phases_median_s"]) == set(PHASES)
    assert "DataParallel step vs plain" in bench.summary(results)
    assert saved["scaling"]["workload"]["flops_fwd"] == 2 * 64 * (
        1024 * 512 + 512 * 1024
    )  # two Linear layers
    assert saved["scaling"]["workload"]["param_bytes"] == 4 * bench.n_params(bench.mlp(512, "cpu"))
    assert published.load(tmp_path / "bench.json") == []  # CPU slots: nothing the GPU model predicts
    assert (tmp_path / "scaling.png").stat().st_size > 10_000


def test_profile_counts_the_bytes_each_strategy_copies():
    model = nn.Linear(64, 32)
    x = torch.randn(16, 64)
    nbytes = sum(comm.nbytes(p) for p in model.parameters())
    broadcast = profile_step(model, x, ["cpu", "cpu"], "broadcast", repeats=1, warmup=0)
    clone = profile_step(model, x, ["cpu", "cpu"], "clone", repeats=1, warmup=0)
    assert broadcast.bytes_by_op["broadcast"] == nbytes  # slot 0 aliases: one copy of the model
    assert clone.bytes_by_op["clone"] == 2 * nbytes  # C++ clone() copies the model for every slot
    assert all(v >= 0 for v in broadcast.medians.values()) and broadcast.total > 0
    assert "replicate" in broadcast.table()
