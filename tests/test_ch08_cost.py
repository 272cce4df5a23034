"""Chapter 08: its cells found by tag, its budgets, and the deterministic evidence it prints."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import matplotlib
import nbformat
import pytest

matplotlib.use("Agg")

ROOT = Path(__file__).resolve().parents[1]
NB = nbformat.read(ROOT / "notebooks" / "08_real_gpus.ipynb", as_version=4)
TAGGED = {tag: c for c in NB.cells for tag in c.metadata.get("tags", [])}
FIGURES = ("timeline", "over-n", "published", "my-timing")


def main_path_words(nb) -> int:
    text = " ".join(c.source for c in nb.cells if c.cell_type == "markdown")
    return len(re.sub(r"<details>.*?</details>", " ", text, flags=re.S).split())


def test_budgets_hold():
    assert main_path_words(NB) <= 1500
    long = [c.id for c in NB.cells if c.cell_type == "code" and len(c.source.splitlines()) > 25]
    assert not long, f"code cells over 25 lines: {long}"
    for c in NB.cells:
        for block in re.findall(r"<details>.*?</details>", c.source, flags=re.S):
            assert len(block.split()) <= 400


def test_the_thread_table_is_within_the_first_five_cells_and_figures_have_alt_text():
    assert NB.cells.index(TAGGED["thread-table"]) < 5
    assert "remove-cell" in NB.cells[1].metadata["tags"]
    for tag in FIGURES:
        assert TAGGED[tag].metadata["mystnb"]["image"]["alt"].strip(), tag
    opening = NB.cells[2].source
    assert "The one thing to learn" in opening and opening.count("\n|") >= 4  # the three-row table


def run(*tags: str) -> tuple[dict, str]:
    """Run the chapter's set-up cell and the cells with ``tags`` in one scope; what they printed."""
    scope: dict = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for tag in ("hide-input", *tags):
            exec(compile(TAGGED[tag].source, f"<{tag}>", "exec"), scope)
    return scope, out.getvalue()


def test_the_thread_table_puts_every_cpu_backward_node_on_the_caller_thread():
    pytest.importorskip("torch")
    scope, printed = run("thread-table")
    if scope["on_gpu"]:
        pytest.skip("the CPU branch")
    assert scope["recorded"].roles == {"caller thread"}
    assert "replica 1" in printed and "autograd thread" not in printed
    _, again = run("thread-table")
    assert printed == again  # the same on every run


def test_the_cost_cells_print_the_same_twice_and_say_modelled():
    _, first = run("cost-table", "published")
    _, second = run("cost-table", "published")
    assert first == second
    assert "modelled ms per step" in first and "measured/modelled" in first
    scope, _ = run("cost-table", "timeline")
    titles = [ax.get_title() for ax in scope["fig"].axes]
    assert all("modelled, A100-SXM" in t for t in titles) and len(titles) == 2


def test_the_markdown_names_the_misses_the_published_cell_prints():
    from dpteach.measure import published

    rows = {m.id: published.compare(m) for m in published.shipped() if not m.ours}
    r50, r101 = rows["ddp-benchmark-resnet50"], rows["ddp-benchmark-resnet101"]
    text = " ".join(" ".join(c.source.split()) for c in NB.cells if c.cell_type == "markdown")
    assert f"ratios {r50[0].ratio:.2f} and {r101[0].ratio:.2f}" in text
    one = [round(100 * (m.ddp_one_gpu_s / dict(m.points)[1] - 1)) for m in published.shipped() if not m.ours]
    assert f"On one GPU DDP already adds {one[0]}% (ResNet-50) and {one[1]}% (ResNet-101)" in text
    grew = [100 * (r[-1].measured_s / r[1].measured_s - 1) for r in (r50, r101)]  # from 2 to 8 GPUs
    modelled = [100 * (r[-1].modelled_s / r[1].modelled_s - 1) for r in (r50, r101)]
    assert (
        f"grows by {grew[0]:.1f}% and {grew[1]:.1f}%, the model's by {modelled[0]:.2f}% and {modelled[1]:.2f}%"
        in text
    )
    assert [round(g / m) for g, m in zip(grew, modelled)] == [8, 31]  # "eight and thirty times too little"
