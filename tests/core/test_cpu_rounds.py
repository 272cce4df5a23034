"""What ``compare.CpuRounds`` says each way's rounds show, on hand-made rounds (no clock is read).

A way is called faster or slower than the one-thread process only when its whole range of per-round
ratios lies on one side of 1; a range that covers 1 means the spread is as large as the gap, and the
line says no difference is measurable, whatever the median.
"""

from __future__ import annotations

import pytest

from dpteach.distributed.compare import CPU_KINDS, CpuRounds

BASE, DP, DDP, THREADS = CPU_KINDS


def rounds(**per_kind: tuple[float, ...]) -> CpuRounds:
    """The baseline at 100 ms in every round, each other kind as given (seconds per round)."""
    n = len(next(iter(per_kind.values())))
    seconds = {BASE: (0.1,) * n, DP: (0.1,) * n, DDP: (0.1,) * n, THREADS: (0.1,) * n}
    seconds.update({{"dp": DP, "ddp": DDP, "threads": THREADS}[k]: v for k, v in per_kind.items()})
    return CpuRounds(seconds, hidden=512, depth=3, global_batch=2048)


@pytest.mark.parametrize(
    "ddp, verdict",
    [
        ((0.065, 0.068, 0.070), "faster"),  # a quiet machine: 1.43x to 1.54x, every round above 1
        ((0.076, 0.09, 0.112), "no difference"),  # 0.89x to 1.32x: a busy machine's range covers 1
        ((0.17, 0.25, 0.30), "slower"),  # 0.33x to 0.59x: every round below 1
        ((0.1, 0.05, 0.05), "no difference"),  # one round exactly at 1: the range touches it
        ((0.0996, 0.05, 0.05), "no difference"),  # one round at 1.004x, printed 1.00x: not above 1
        ((0.1004, 0.2, 0.2), "no difference"),  # one round at 0.996x, printed 1.00x: not below 1
    ],
)
def test_the_verdict_rests_on_the_whole_range_not_the_median(ddp, verdict):
    r = rounds(ddp=ddp)
    assert r.verdict(DDP) == verdict
    line = next(line for line in r.lines() if line.lstrip().startswith(DDP) and "x (" in line)
    assert line.endswith(r.reading(DDP))


def test_a_median_far_from_1_is_no_verdict_when_one_round_crosses_it():
    r = rounds(threads=(0.05, 0.05, 0.05, 0.05, 0.12))  # four rounds at 2.00x, one at 0.83x
    ratios = sorted(r.ratios(THREADS))
    assert ratios[len(ratios) // 2] == pytest.approx(2.0) and ratios[0] < 1
    assert r.verdict(THREADS) == "no difference"
    assert r.reading(THREADS) == "no difference measurable: its range covers 1"


def test_each_reading_says_what_it_rests_on():
    assert rounds(dp=(0.05, 0.06)).reading(DP) == "faster: all rounds above 1"
    assert rounds(dp=(0.2, 0.3)).reading(DP) == "slower: all rounds below 1"
    assert rounds(dp=(0.05,)).verdict(DP) == "one round"  # no spread to judge by
    assert "no spread" in rounds(dp=(0.05,)).reading(DP)


def test_the_lines_give_each_step_then_each_ratio_with_its_reading():
    r = rounds(ddp=(0.05, 0.08, 0.1), threads=(0.2, 0.3, 0.4))  # DDP 1.25x (1.00x to 2.00x)
    lines = r.lines()
    assert lines[0] == "median step over 3 rounds (and range), MLP 3 x 512, batch 2048:"
    steps, ratios = lines[1:5], lines[6:]
    assert [line.split()[0] for line in steps] == [k.split()[0] for k in CPU_KINDS]
    assert "80.0 ms (50.0 to 100.0)" in steps[2]
    assert lines[5].startswith(f"{BASE}'s step / each way's, per round")
    assert len(ratios) == 3 and not any(BASE in line for line in ratios)  # the baseline is the 1
    assert "1.25x (1.00x to 2.00x)  no difference measurable" in ratios[1]
    assert ratios[2].endswith("slower: all rounds below 1")
