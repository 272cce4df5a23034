"""Chapter 08's scaling: the slot lists per machine, the data a run returns, its table and its drawing.

No timing is asserted. ``fixtures/bench_fictional_gpus.json`` is an invented ``bench.json`` (marked
as such inside) that stands for what ``scripts/gpu_check.sh`` would write on a four-GPU machine; it
lives under tests/ and is never shipped.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, from PyPI
    import tomli as tomllib
import torch
from torch import nn

from dpteach.measure import scaling

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).parent / "fixtures" / "bench_fictional_gpus.json"
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU branch of slot_lists")


@cpu_only
def test_cpu_slot_lists_grow_one_slot_at_a_time_up_to_the_cores():
    lists = scaling.slot_lists()
    assert [len(s) for s in lists] == list(range(1, min(4, scaling.cores()) + 1))
    assert all(d == torch.device("cpu") for s in lists for d in s)
    assert [len(s) for s in scaling.slot_lists(max_slots=1)] == [1]


def test_torch_dataparallel_is_timed_only_on_distinct_gpus():
    names = scaling.steps(nn.Linear(4, 2), torch.randn(4, 4), [["cpu"], ["cpu", "cpu"]])
    assert list(names) == ["plain", "dpteach 1", "dpteach 2"]  # no "torch n": torch refuses CPU slots


def test_a_run_returns_plain_data_one_entry_per_slot_count():
    model, x = nn.Linear(8, 4), torch.randn(6, 8)
    out = scaling.scaling(model, x, [["cpu"], ["cpu", "cpu"], ["cpu"] * 3], repeats=2)
    assert json.loads(json.dumps(out)) == out  # what bench.json records, as it is
    assert out["slots"] == [1, 2, 3] and out["kind"] == "cpu" and out["batch"] == 6 and out["params"] == 36
    assert len(out["dpteach_s"]) == 3 and all(t > 0 for t in out["dpteach_s"]) and out["plain_s"] > 0
    assert out["torch_dp_s"] == [None, None, None] and out["repeats"] == 2
    assert model.weight.grad is not None  # the steps trained the model itself


def test_the_wheel_ships_the_data_folder():
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert {"data/*.json", "data/ours/*.json"} <= set(package_data["dpteach.measure"])
    assert scaling.DATA == ROOT / "dpteach" / "measure" / "data" and scaling.DATA.is_dir()


def test_the_drawing_shows_the_learners_run(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    mine = scaling.scaling(nn.Linear(8, 4), torch.randn(6, 8), [["cpu"], ["cpu", "cpu"]], repeats=1)
    fig = scaling.draw(mine)
    left, right = fig.axes
    assert [line.get_label() for line in left.lines] == ["plain step, one device", "dpteach.DataParallel"]
    assert list(right.get_xticks()) == [1, 2]
    fig.savefig(tmp_path / "scaling.png")
    assert (tmp_path / "scaling.png").stat().st_size > 10_000


def test_the_table_has_a_row_per_slot_count_and_a_dash_where_torch_did_not_run():
    s = json.loads(FIXTURE.read_text())["scaling"]
    rows = scaling.table(s).splitlines()
    assert len(rows) == 2 + len(s["slots"]) and "40.00" in rows[1]  # header, plain step, one row per n
    assert rows[-1].split()[-3:] == ["16.00", "-", "2.50x"]  # 4 GPUs: dpteach's ms, no torch run, 40 / 16


def test_draw_rounds_draws_every_step_and_against_plain_prints_medians_and_middle_halves():
    import matplotlib

    matplotlib.use("Agg")
    from dpteach.measure.timer import Timing

    times = {
        "plain": Timing([0.010, 0.011, 0.012, 0.013]),
        "dpteach 1": Timing([0.0105, 0.0115, 0.0125, 0.0135]),  # overlaps the plain step's middle half
        "dpteach 2": Timing([0.030, 0.031, 0.032, 0.033]),  # well clear of it
    }
    fig = scaling.draw_rounds(times)
    [ax] = fig.axes
    dots = [line for line in ax.get_lines() if line.get_linestyle() == "None"]
    assert [len(line.get_xdata()) for line in dots] == [4, 4, 4]  # a dot for every timed step
    medians = [line.get_ydata()[0] for line in ax.get_lines() if line.get_linestyle() != "None"]
    assert medians == pytest.approx([t.median * 1e3 for t in times.values()])  # the median lines
    assert [t.get_text() for t in ax.get_xticklabels()] == [
        "plain step",
        "dpteach, 1 slot",
        "dpteach, 2 slots",
    ]
    plain, one, two = scaling.against_plain(times).splitlines()
    assert plain == "plain step: median 11.5 ms, middle half 10.8-12.2 ms"
    assert one == "dpteach, 1 slot: median 12.0 ms, middle half 11.3-12.8 ms (+0.5 ms between medians)"
    assert two.startswith("dpteach, 2 slots: median 31.5 ms") and two.endswith("(+20.0 ms between medians)")
    # medians and middle halves only: a verdict from a few rounds can flip when the cell is run again
    assert not any(word in scaling.against_plain(times) for word in ("spread", "says nothing", "larger"))
