"""Sentences about speed follow what the chapter measured, never the prose's hopes.

``dpteach.course.claims.Comparison`` turns two medians into a sentence with a verdict. These tests check the
verdict rule, then run chapter 08 and check every printed sentence against its own numbers and
against the measurements printed in the same cell, and that the markdown of chapter 08 and of the
cost chapters (06, 09, 12) states no measured speed itself.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat
import pytest

from dpteach.course import claims
from dpteach.course.claims import Comparison

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from executed import executed  # noqa: E402  (each chapter runs once per test run)

MEASURING = ["08_real_gpus.ipynb"]  # the chapters that still print sentences about speed
SENTENCES = {"08_real_gpus.ipynb": 1}  # the comparisons each chapter prints
# chapters whose markdown must state no measured speed: those that measure, and the cost chapters
NO_SPEED_IN_PROSE = [
    *MEASURING,
    "06_the_cost_of_copies.ipynb",
    "09_beyond_one_process.ipynb",
    "12_the_lab.ipynb",
]

# "<a> took 2.00x the time of <b> (2.000 ms against 1.000 ms): slower"
SENTENCE = re.compile(
    r"took (?P<ratio>\d+\.\d+)x the time of .*? \((?P<a>[\d.]+) (?P<au>us|ms) against (?P<b>[\d.]+) (?P<bu>us|ms)\): "
    r"(?P<verdict>slower|faster|about the same|too noisy to tell)(?: \(noise margin (?P<margin>\d+\.\d+)x\))?"
)
SPEEDUP = re.compile(
    r"ran at (?P<ratio>\d+\.\d+)x the speed of .*? \((?P<a>[\d.]+) (?P<au>us|ms) against (?P<b>[\d.]+) (?P<bu>us|ms)\): "
    r"(?P<verdict>a speed-up|no speed-up|too noisy to tell)(?: \(noise margin (?P<margin>\d+\.\d+)x\))?"
)
UNIT = {"us": 1e-6, "ms": 1e-3}


def verdict_for(ratio: float, margin: float = claims.MARGIN) -> str:
    """The rule, written out again independently of dpteach.course.claims."""
    if ratio >= margin:
        return "slower"
    if ratio <= 1 / margin:
        return "faster"
    return "too noisy to tell" if margin >= 1.5 else "about the same"


def _margin(match) -> float:
    """The margin a sentence names (a chapter's measured noise), never narrower than claims.MARGIN."""
    if match["margin"] is None:
        return claims.MARGIN
    margin = float(match["margin"])
    assert margin > claims.MARGIN, f"{match[0]}: a noise margin narrower than claims.MARGIN"
    return margin


@pytest.mark.parametrize(
    "a, b, verdict",
    [
        (2.0, 1.0, "slower"),
        (1.0, 2.0, "faster"),
        (1.1, 1.0, "about the same"),
        (1.0, 1.1, "about the same"),
        (claims.MARGIN, 1.0, "slower"),
        (1.0, claims.MARGIN, "faster"),
    ],
)
def test_verdict_follows_the_ratio_of_medians(a, b, verdict):
    assert Comparison("a", "b", a, b).verdict == verdict


def test_swapping_the_measurements_swaps_the_verdict():
    assert Comparison("a", "b", 3e-3, 1e-3).verdict == "slower"
    assert Comparison("a", "b", 1e-3, 3e-3).verdict == "faster"  # the numbers decide, not the names


def test_sentence_states_the_numbers_it_was_computed_from():
    match = SENTENCE.search(str(Comparison("clone_then_to", "to_device", 97.0e-6, 48.4e-6)))
    assert match, "the sentence keeps its parseable form"
    assert float(match["a"]) == 97.0 and match["au"] == "us"
    assert float(match["b"]) == 48.4 and float(match["ratio"]) == pytest.approx(97.0 / 48.4, abs=0.01)
    assert match["verdict"] == "slower"


def test_speed_up_needs_more_than_the_margin():
    assert claims.SpeedUp("dp", "plain", 1.0, 2.0).verdict == "a speed-up"
    assert claims.SpeedUp("dp", "plain", 1.0, 1.05).verdict == "no speed-up"  # noise is not a speed-up
    assert claims.SpeedUp("dp", "plain", 2.0, 1.0).verdict == "no speed-up"
    assert SPEEDUP.search(str(claims.SpeedUp("dp", "the plain step", 1e-3, 2e-3)))["ratio"] == "2.00"


def _seconds(value: str, unit: str) -> tuple[float, float]:
    """A printed 'number unit' in seconds, with half its last digit: what rounding may have moved."""
    decimals = len(value.split(".")[1]) if "." in value else 0
    return float(value) * UNIT[unit], 0.5 * 10**-decimals * UNIT[unit]


def _numbers_printed(text: str) -> list[tuple[float, float]]:
    """Every 'number unit' the cell printed outside the sentences, in seconds."""
    table = "\n".join(line for line in text.splitlines() if not SENTENCE.search(line))
    return [_seconds(v, u) for v, u in re.findall(r"(\d+\.\d+) (us|ms)\b", table)]


def _close(value: tuple[float, float], printed: list[tuple[float, float]]) -> bool:
    return any(abs(value[0] - p) <= value[1] + r + 1e-12 for p, r in printed)


def check_cell_output(text: str) -> int:
    """Check every claim one cell printed against the numbers it printed; return how many were checked."""
    checked = 0
    printed = _numbers_printed(text)
    for match in SENTENCE.finditer(text):
        (a, ra), (b, rb) = _seconds(match["a"], match["au"]), _seconds(match["b"], match["bu"])
        ratio = float(match["ratio"])
        low, high = (a - ra) / (b + rb), (a + ra) / max(b - rb, 1e-12)
        assert low - 0.006 <= ratio <= high + 0.006, match[0]  # the ratio is of the medians it names
        assert match["verdict"] == verdict_for(ratio, _margin(match)), match[0]  # the verdict is the ratio's
        if len(printed) >= 2:
            assert _close((a, ra), printed) and _close((b, rb), printed), (
                f"{match[0]} names medians the cell did not print"
            )
        checked += 1
    for match in SPEEDUP.finditer(text):  # chapter 08: did DataParallel beat the plain step?
        (a, ra), (b, rb) = _seconds(match["a"], match["au"]), _seconds(match["b"], match["bu"])
        ratio = float(match["ratio"])
        assert (b - rb) / (a + ra) - 0.006 <= ratio <= (b + rb) / max(a - ra, 1e-12) + 0.006, match[0]
        margin = _margin(match)
        expected = (
            "a speed-up"
            if ratio >= margin
            else "too noisy to tell"
            if margin >= 1.5 and ratio >= claims.MARGIN
            else "no speed-up"
        )
        assert match["verdict"] == expected, match[0]
        assert _close((a, ra), printed) and _close((b, rb), printed), (
            f"{match[0]} names times the cell did not print"
        )
        checked += 1
    return checked


GOOD = """plain step         100.00 ms
DataParallel       150.00 ms   (1.50x the plain step)
On cpu, 2 slots: the DataParallel step ran at 0.67x the speed of the plain step (150.000 ms against 100.000 ms): no speed-up
"""


@pytest.mark.parametrize(
    "bad",
    [
        GOOD.replace("no speed-up", "a speed-up"),  # a verdict the numbers do not support
        GOOD.replace("150.000 ms against", "250.000 ms against"),  # a median the table did not print
        "clone_then_to  5.0 us\nto_device  3.0 us\n"
        "x took 1.67x the time of y (5.0 us against 3.0 us): about the same\n",  # 1.67 is beyond the margin
        "x took 1.67x the time of y (5.0 us against 3.0 us): about the same (noise margin 1.50x)\n",  # beyond it
        "x took 1.10x the time of y (3.3 us against 3.0 us): about the same (noise margin 1.05x)\n",  # too narrow
    ],
)
def test_the_check_catches_a_claim_its_numbers_contradict(bad):
    assert check_cell_output(GOOD) == 1
    with pytest.raises(AssertionError):
        check_cell_output(bad)


@pytest.mark.notebook
@pytest.mark.parametrize("name", MEASURING)
def test_printed_claims_agree_with_the_measurements(name, monkeypatch):
    monkeypatch.setenv("TQDM_DISABLE", "1")
    nb, _, _ = executed(ROOT / "notebooks" / name)  # the run's one executed copy, shared with test_notebooks
    checked = sum(
        check_cell_output("".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream"))
        for cell in nb.cells
        if cell.cell_type == "code"
    )
    assert checked >= SENTENCES[name], (
        f"{name} printed {checked} measured comparisons; its conclusions come from them"
    )


NUMBER_CLAIM = re.compile(
    r"\d+(\.\d+)?\s*(×|x\b)|\d+(\.\d+)?\s*(ms|µs|us)\b|\b(twice|three times|half) as (fast|slow|long)\b"
)


@pytest.mark.parametrize("name", NO_SPEED_IN_PROSE)
def test_markdown_states_no_measured_speed(name):
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            found = NUMBER_CLAIM.search(cell.source)
            assert not found, f"cell {i} states {found[0]!r}: print it from the measurement instead"


def test_a_wider_measured_margin_is_said_and_checked():
    wide = Comparison("x", "y", 1.3e-3, 1.0e-3, margin=1.45)
    assert wide.verdict == "about the same" and "(noise margin 1.45x)" in str(wide)
    assert check_cell_output(str(wide) + "\n") == 1
    assert "noise margin" not in str(Comparison("x", "y", 1.3e-3, 1.0e-3))  # claims.MARGIN goes unsaid
    speed = claims.SpeedUp("dp", "the plain step", 1.0e-3, 1.3e-3, margin=1.45)
    assert speed.verdict == "no speed-up" and check_cell_output(str(speed) + "\n") == 1


@pytest.mark.parametrize("first", [1.1996e-3, 1.2000e-3, 1.2012e-3])
def test_the_verdict_is_the_printed_ratios(first):
    # all three print "1.20x": against a 1.20x margin each must read the same, whatever the third decimal
    said = Comparison("x", "y", first, 1.0e-3)
    assert "took 1.20x" in str(said)
    assert said.verdict == verdict_for(1.20) == "slower"
    speed = claims.SpeedUp("dp", "plain", 1.0e-3, first)
    assert f"{speed.ratio:.2f}" == "1.20" and speed.verdict == "a speed-up"


def test_a_ratio_just_inside_the_margin_as_printed_is_about_the_same():
    said = Comparison("x", "y", 1.1949e-3, 1.0e-3)  # prints 1.19x
    assert "took 1.19x" in str(said) and said.verdict == "about the same"
    faster = Comparison("x", "y", 0.8349e-3, 1.0e-3)  # prints 0.83x, under 1/1.2 = 0.8333
    assert "took 0.83x" in str(faster) and faster.verdict == verdict_for(0.83) == "faster"


def test_inside_a_wide_margin_the_verdict_is_too_noisy_to_tell_not_the_same():
    # chapter 09 once printed "DDP took 0.42x the time of DataParallel ... about the same (noise margin 5.08x)"
    wide = Comparison("DDP", "DataParallel", 0.42e-3, 1.0e-3, margin=5.08)
    assert wide.verdict == "too noisy to tell" and check_cell_output(str(wide) + "\n") == 1
    narrow = Comparison("DDP", "DataParallel", 1.1e-3, 1.0e-3, margin=1.3)
    assert narrow.verdict == "about the same"  # a margin under claims.WIDE still reads "about the same"
    assert claims.SpeedUp("dp", "plain", 1.0e-3, 1.3e-3, margin=1.6).verdict == "too noisy to tell"
    assert claims.SpeedUp("dp", "plain", 1.0e-3, 1.1e-3, margin=1.6).verdict == "no speed-up"
    with pytest.raises(AssertionError):  # a sentence that says "about the same" inside 5.08x is refused
        check_cell_output(str(wide).replace("too noisy to tell", "about the same") + "\n")
