"""Which verdicts of the cost model survive its assumed constants: the grid, the verdicts, the table."""

from __future__ import annotations

import re

import pytest

from dpteach.measure import costmodel as cm
from dpteach.measure import sensitivity as sens

WORK = cm.Workload(
    flops_fwd=1e12, flops_bwd=2e12, param_bytes=100_000_000, param_tensors=10,
    input_bytes=8_000_000, output_bytes=4_000_000, batch=64,
)  # fmt: skip


def test_each_pair_of_the_grid_is_one_prediction():
    [spread] = sens.sensitivity(WORK, ("A100-SXM",), (4,), thread_s=(0.0, 1e-3), efficiencies=(0.3, 0.7))
    pairs = [(0.0, 0.3), (0.0, 0.7), (1e-3, 0.3), (1e-3, 0.7)]  # thread_s first, then efficiency
    for i, (t, e) in enumerate(pairs):
        plain = cm.predict(WORK, "A100-SXM", 1, efficiency=e).total_s
        dp = cm.predict(WORK, "A100-SXM", 4, "DataParallel", efficiency=e, thread_s=t).total_s
        ddp = cm.predict(WORK, "A100-SXM", 4, "DDP", efficiency=e).total_s
        assert spread.dp_over_ddp[i] == pytest.approx(dp / ddp)
        assert (spread.dp_speedup[i], spread.ddp_speedup[i]) == pytest.approx((plain / dp, plain / ddp))
    # DDP starts no thread per replica: its speed-up does not move with thread_s
    assert spread.ddp_speedup[:2] == spread.ddp_speedup[2:]
    assert spread.dp_speedup[2] < spread.dp_speedup[0]  # a dearer thread slows DataParallel


def test_verdicts_sort_each_profile_by_how_many_pairs_it_holds_under():
    spreads = [
        sens.Spread("A", 2, dp_over_ddp=(1.2, 1.3), dp_speedup=(0.5, 0.9), ddp_speedup=(1.5, 2.0)),
        sens.Spread("B", 2, dp_over_ddp=(1.1, 1.3), dp_speedup=(0.5, 1.1), ddp_speedup=(0.5, 0.9)),
    ]
    v = sens.verdicts(spreads)
    assert v["DDP's step is shorter than DataParallel's"]["every"] == ["A n=2", "B n=2"]
    assert v["DDP's step is over 15% shorter than DataParallel's"] == {
        "every": ["A n=2"], "some": ["B n=2"], "none": [],
    }  # fmt: skip
    assert v["DataParallel is faster than one GPU"] == {"every": [], "some": ["B n=2"], "none": ["A n=2"]}
    assert v["DDP is faster than one GPU"] == {"every": ["A n=2"], "some": [], "none": ["B n=2"]}


def test_the_table_says_modelled_and_assumed_and_prints_the_ranges():
    text = sens.table(WORK, ("A100-SXM", "H200-SXM"), (2, 8))
    assert text.startswith("modelled under 9 assumed pairs")
    assert "PYTHON_THREAD_S in {0 µs, 100 µs, 1000 µs}" in text and "EFFICIENCY in {30%, 50%, 70%}" in text
    spreads = sens.sensitivity(WORK, ("A100-SXM", "H200-SXM"), (2, 8))
    first = spreads[0]
    row = next(line for line in text.splitlines() if line.startswith("A100-SXM") and line.split()[1] == "2")
    assert f"{sens.ratio(min(first.dp_over_ddp))}–{sens.ratio(max(first.dp_over_ddp))}×" in row
    for sentence, _, _ in sens.VERDICTS:
        assert sentence in text


def test_the_table_heads_its_columns_in_plain_words_and_aligns_each_range_under_them():
    lines = sens.table(WORK, ("A100-SXM",), (4,)).splitlines()
    over, head, row = lines[2], lines[3], lines[4]
    assert "speed-up over one GPU" in over and "DP step ÷ DDP step" in head
    [spread] = sens.sensitivity(WORK, ("A100-SXM",), (4,))
    dp = f"{sens.ratio(min(spread.dp_speedup))}–{sens.ratio(max(spread.dp_speedup))}×"
    assert row.index(dp) + len(dp) == head.index("DataParallel") + len("DataParallel")  # right-aligned
    assert over.index("speed-up") > head.index("DP step ÷ DDP step") + len("DP step ÷ DDP step")


def test_ddp_overhead_is_a_third_axis_added_to_every_ddp_step():
    base = sens.sensitivity(WORK, ("A100-SXM",), (4,), thread_s=(0.0,), efficiencies=(0.5,))[0]
    [spread] = sens.sensitivity(
        WORK, ("A100-SXM",), (4,), thread_s=(0.0,), efficiencies=(0.5,), ddp_overhead_s=(0.0, 0.01)
    )
    ddp = cm.predict(WORK, "A100-SXM", 4, "DDP", efficiency=0.5).total_s
    plain = cm.predict(WORK, "A100-SXM", 1, efficiency=0.5).total_s
    assert spread.ddp_speedup == pytest.approx((base.ddp_speedup[0], plain / (ddp + 0.01)))
    assert spread.dp_speedup[0] == spread.dp_speedup[1]  # DataParallel is charged nothing extra
    text = sens.table(WORK, ("A100-SXM",), (4,), ddp_overhead_s=(0.0, 0.01))
    assert text.startswith("modelled under 18 assumed settings") and "{0.0 ms, 10.0 ms}" in text
    assert "pair" not in text  # with three axes the grid's points are settings


def test_verdict_lists_group_each_profile_on_one_line_part():
    assert sens._grouped(["T4 n=2", "T4 n=4", "A100-SXM n=8"]) == "T4 n=2, 4; A100-SXM n=8"


def test_ratios_print_in_few_digits_and_never_as_zero():
    assert [sens.ratio(v) for v in (0.0024, 0.62, 1.154, 9.994, 10.2, 213.8)] == [
        "0.0024", "0.62", "1.15", "9.99", "10", "214",
    ]  # fmt: skip
    text = sens.table(WORK, ("A100-SXM",), (4,), ddp_overhead_s=(0.0, 10.0))  # a DDP step 10 s too long
    row = text.splitlines()[4]
    assert (
        not re.search(r"\b0\.00(?!\d)", row)
        and "0.0055–" in row
        and "–" in row
        and "×" in row
        and "-" not in row.split("A100-SXM")[1]
    )


def test_folded_shows_a_going_deeper_block_in_a_notebook_and_the_text_elsewhere():
    box = sens.folded("all 27 <settings>", "a & b\nrow 2")
    assert box._repr_html_() == (
        "<details><summary>Going deeper: all 27 &lt;settings&gt;</summary><pre>a &amp; b\nrow 2</pre></details>"
    )
    assert str(box) == "all 27 <settings>\n\na & b\nrow 2"


def test_the_summary_takes_ddp_overhead_as_a_third_axis_and_names_the_settings():
    import dataclasses

    small = dataclasses.replace(WORK, flops_fwd=1e9, flops_bwd=2e9)  # copies weigh: DDP leads by far
    args = {"gpus": ("A100-SXM",), "ns": (2, 4)}
    plain = sens.summary({"w": small}, **args)
    assert "under each of 9 assumed pairs" in plain and "all: under every pair" in plain
    assert plain.splitlines()[3:5] == ["   A100-SXM", "   n=2  n=4"]  # a column per profile and n
    assert plain.splitlines()[-2].split() == ["w", "all", "all"]
    charged = sens.summary({"w": small}, **args, ddp_overhead_s=(0.0, 10.0))
    assert "under 18 assumed settings: the 9 pairs" in charged
    assert "DDP charged {0.0 ms, 10000.0 ms} more" in charged and "all: under every setting" in charged
    # 10 s more on every DDP step: the 15% lead now holds under the uncharged settings only
    kinds = sens.verdicts(sens.sensitivity(small, ddp_overhead_s=(0.0, 10.0), **args))
    assert kinds[sens.VERDICTS[1][0]]["some"] == ["A100-SXM n=2", "A100-SXM n=4"]
    assert charged.splitlines()[-2].split() == ["w", "some", "some"]
