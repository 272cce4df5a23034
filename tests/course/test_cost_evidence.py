"""The evidence chapters 06, 09 and 12 rest on comes out the same on every run, and their budgets hold.

Counts (copy calls, bytes), the order of DDP's buckets among the backward nodes, and the rankings of
the cost explorer never read a clock. Timings are shown only as figures with their spread: these
chapters' code prints no verdict about speed.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
import torch

from dpteach.distributed import order
from dpteach.measure import costs, timer
from dpteach.widgets import CostLab

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
BUDGETS = {"06_the_cost_of_copies.ipynb": 1500, "09_beyond_one_process.ipynb": 2000, "12_the_lab.ipynb": 2000}
DETAILS = re.compile(r"<details>.*?</details>", re.S)


def main_words(source: str) -> int:
    return len(DETAILS.sub("", source).split())


def cells(name):
    return nbformat.read(NOTEBOOKS / name, as_version=4).cells


@pytest.mark.parametrize("name", BUDGETS)
def test_word_and_cell_budgets(name):
    nb = cells(name)
    words = sum(main_words(c.source) for c in nb if c.cell_type == "markdown")
    assert words <= BUDGETS[name], f"{name}: {words} main-path words"
    for c in nb:
        if c.cell_type == "code":
            assert len(c.source.splitlines()) <= 25, f"{name} cell {c.id}: over 25 lines"
        for block in DETAILS.findall(c.source):
            assert len(block.split()) <= 400, f"{name} cell {c.id}: a Going-deeper block over 400 words"


@pytest.mark.parametrize("name", BUDGETS)
def test_no_timing_verdict_is_printed(name):
    code = "\n".join(c.source for c in cells(name) if c.cell_type == "code")
    assert "claims." not in code and "Comparison(" not in code and "SpeedUp(" not in code


def test_chapter_09_step_time_section_is_at_most_300_words():
    nb = cells("09_beyond_one_process.ipynb")
    start = next(i for i, c in enumerate(nb) if c.source.startswith("## Step time"))
    end = next(i for i, c in enumerate(nb) if i > start and c.source.startswith("## "))
    words = sum(main_words(c.source) for c in nb[start:end] if c.cell_type == "markdown")
    assert words <= 300, words


def test_chapter_06_shows_its_counts_within_its_first_five_cells():
    assert any("step-bytes" in c.metadata.get("tags", []) for c in cells("06_the_cost_of_copies.ipynb")[:5])


@pytest.mark.parametrize("name", BUDGETS)
def test_every_figure_cell_has_alt_text(name):
    for c in cells(name):
        draws = c.cell_type == "code" and re.search(
            r"plt\.subplots|plot_bytes|plot_timings|draw_timeline", c.source
        )
        if draws:
            assert c.metadata.get("mystnb", {}).get("image", {}).get("alt"), (
                f"{name} cell {c.id}: no alt text"
            )


@pytest.mark.parametrize("counts", [[1, 16, 256, 1024], [4, 64]])
def test_copy_calls_are_one_per_tensor_or_one_per_bucket(counts):
    calls = costs.copy_calls([costs.copy_per_tensor, costs.copy_coalesced], counts, 2**14, "cpu")
    assert calls == {"copy_per_tensor": counts, "copy_coalesced": [1] * len(counts)}  # 64 KiB: one bucket


def test_quartiles_hold_the_middle_half():
    t = timer.Timing([5.0, 1.0, 2.0, 3.0, 4.0])
    assert t.quartiles == (2.0, 4.0) and t.median == 3.0
    assert timer.Timing([1.5]).quartiles == (1.5, 1.5)


def step(events):
    return {"events": events, "on_caller": True}


def test_overlap_is_the_backward_work_after_each_launch():
    events = [
        ("node", "MseLossBackward0"),
        ("grad", "1.bias"),
        ("bucket", 0, ["1.bias"], 4),
        ("node", "AddmmBackward0"),
        ("grad", "0.weight"),
        ("bucket", 1, ["0.weight"], 8),
    ]
    (first, last) = order.overlap(step(events))
    assert first["nodes"] == ["AddmmBackward0"] and first["grads"] == ["0.weight"]
    assert last["nodes"] == [] and last["at"] == 5
    lines = order.overlap_lines(step(events))
    assert "1 backward node (AddmmBackward0) still to run" in lines[0]
    assert lines[1].endswith("nothing left to overlap")
    assert order.event_lines(step(events))[2] == "  3  bucket 0 launched: 1.bias (4 bytes)"


def test_cost_lab_ranks_by_bytes_with_equal_counts_said_equal():
    lab = CostLab(width=64, slots=3, max_repeats=1)
    lab.measure()
    ranked = lab.by_bytes()
    assert ranked[0].strategy == "broadcast"  # N - 1 model copies, the others N
    assert ranked[1].bytes == ranked[2].bytes  # clone and rewire copy the same
    assert "'broadcast' " in lab.status() and " = " in lab.status().split("fewest first: ")[1]
    assert lab.by_bytes() == sorted(lab.costs, key=lambda c: (c.bytes, c.strategy))


def test_cost_lab_byte_ranking_is_the_same_on_every_run():
    runs = []
    for _ in range(2):
        lab = CostLab(width=16, slots=2, max_repeats=1)
        lab.measure()
        runs.append([(c.strategy, c.bytes) for c in lab.by_bytes()])
    assert runs[0] == runs[1]


def test_plot_helpers_draw_what_they_are_given():
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    x = torch.randn(4, 3)
    model = torch.nn.Linear(3, 2)
    traffic = {s: costs.step_traffic(model, x, ["cpu", "cpu"], s) for s in ("clone", "broadcast")}
    ax = costs.plot_bytes(traffic)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["clone", "broadcast"]
    colours = {h.get_label().split(" (")[0]: h.patches[0].get_facecolor() for h in ax.containers}
    assert colours["clone"] == matplotlib.colors.to_rgba(
        costs.OP_COLOURS["clone"]
    )  # one palette: the bug red
    ax = costs.plot_timings([1, 2], {"a": [timer.Timing([1.0, 2.0]), timer.Timing([3.0, 5.0])]})
    assert ax.get_legend().get_texts()[0].get_text() == "a"


def test_chapter_09_says_what_keeps_ranks_in_step_and_no_thread_is_a_core():
    """Equal rows give one device's gradient; the same number of batches keeps ranks in step (the 6 + 2
    cell runs without hanging). One intra-op thread is not a core, in the chapter or in compare.py."""
    import inspect

    from dpteach.distributed import compare

    text = " ".join(" ".join(c.source for c in cells("09_beyond_one_process.ipynb")).split())
    assert "same number of batches" in text and "one process, one core" not in text
    assert "gets one core" not in " ".join(inspect.getsource(compare).split())
