"""Chapter 09's step-time section rests on what repeats, the cost model and a published measurement.

The timeline cell prints how much of DataParallel's modelled step is the assumed thread starts and what
is left without them, and the prose after it says what the model leaves out, quoting no published
timing (the one DataParallel-and-DDP pair, in chapter 08, is a single run each); the published cell prints PyTorch's own DDP measurement beside the
model, how close first; the timing of this machine comes last, introduced as the learner's own figure,
with what DDP's step adds said from what is counted, and nothing resting on it.
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import nbformat
import pytest

from dpteach.distributed import make_data, make_model
from dpteach.measure import costmodel

CHAPTER = Path(__file__).resolve().parents[2] / "notebooks" / "09_beyond_one_process.ipynb"


def cells():
    return nbformat.read(CHAPTER, as_version=4).cells


def tagged(tag):
    nb = cells()
    at = next(i for i, c in enumerate(nb) if tag in c.metadata.get("tags", []))
    return nb, at


def run_cell(source: str, scope: dict) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(source, scope)
    return out.getvalue()


def test_the_timeline_is_a_compute_bound_workload_on_one_axis_with_the_ratio_printed():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nb, at = tagged("ddp-timeline")
    printed = run_cell(nb[at].source, scope := {"make_model": make_model, "make_data": make_data})
    fig = scope["fig"]
    top, bottom = fig.axes[0], fig.axes[1]
    assert top.get_xlim() == bottom.get_xlim()  # one shared x-axis: the bars compare by length
    plt.close(fig)
    work = costmodel.large_workload("gpt2-small").scaled(16)
    dp = costmodel.predict(work, "A100-SXM", 4, strategy="DataParallel")
    ddp = costmodel.predict(work, "A100-SXM", 4, strategy="DDP")
    ratio = re.search(r"DataParallel / DDP step, modelled: ([0-9.]+)", printed)
    assert ratio and float(ratio[1]) == pytest.approx(dp.total_s / ddp.total_s, abs=1e-3), printed
    # compute dominates: most of each modelled step is GPU 0's forward and backward
    for name, pred in (("DataParallel", dp), ("DDP", ddp)):
        outside = re.search(rf"{name}, modelled: [0-9.]+ ms, of which ([0-9.e-]+) ms is not", printed)
        compute = sum(
            p.seconds for p in pred.parts if p.lane == "GPU 0" and p.name in ("forward", "backward")
        )
        assert outside and float(outside[1]) == pytest.approx((pred.total_s - compute) * 1e3, rel=5e-3)
        assert compute > 0.9 * pred.total_s
    # the assumed thread starts are named with their share, and the prose beside it says modelled
    assert "assumed PYTHON_THREAD_S" in printed
    assert "PYTHON_THREAD_S" in nb[at + 1].source and "modelled" in nb[at + 1].source.lower()
    assert "too thin to see" in nb[at + 1].source  # the legend lists parts the reader cannot see
    # the prose says what the model leaves out, on the main path, and rests no verdict on a published
    # timing: the one DataParallel-and-DDP pair is a single run each, with no spread (chapter 08 holds it)
    beside = " ".join(re.sub(r"<details\b.*?</details>", " ", nb[at + 1].source, flags=re.S).split())
    assert "interpreter lock" in beside and "GPU 0 alone" in beside
    assert not any(f in beside for f in ("110.6 s", "101.9 s", "131.4 s", "significantly faster")), beside
    assert (
        "chapter 08" in nb[at + 1].source
        and "TITAN RTX" in (CHAPTER.parent / "08_real_gpus.ipynb").read_text()
    )


def test_the_machines_timing_is_said_in_words_in_the_direction_it_went():
    from dpteach.distributed.compare import Rounds

    slower = Rounds(single=(1.0, 1.0, 1.0), ddp=(1.5, 2.0, 1.2))
    assert slower.in_words().startswith("DDP on 2 ranks took 1.50x as long as one process")
    assert "from 1.20x to 2.00x" in slower.in_words()
    assert Rounds(single=(2.0,), ddp=(1.0,)).in_words().startswith("DDP on 2 ranks took 0.50x as long")
    # one statistic: the milliseconds printed beside the median ratio are its own round's, so they divide to
    # it (a ratio of the two sides' medians would give 1.6 / 1.0 here, not the rounds' median 1.5)
    mixed = Rounds(single=(1.0, 1.0, 1.0, 0.5, 2.0), ddp=(1.5, 2.0, 1.2, 1.6, 2.2))
    ms = re.search(r"one process ([0-9.]+) ms, DDP on 2 ranks ([0-9.]+) ms", mixed.in_words())
    assert mixed.in_words().startswith("DDP on 2 ranks took 1.50x") and float(ms[2]) / float(ms[1]) == 1.5
    assert "median of 5 per-round ratios" in mixed.in_words()
    nb, at = tagged("ddp-speed")
    assert "in_words()" in nb[at].source
    # what DDP's step adds on this machine is said before the figure, from what is counted, not a timing:
    # the all-reduce over loopback on gloo's threads, sharing the cores with both ranks
    before = " ".join(nb[at - 1].source.split())
    assert "loopback" in before and "gloo's own threads" in before and "machine's cores" in before
    # and the cell prints the bytes each rank all-reduces, for the model it times
    assert "hidden=512, depth=3" in nb[at].source and "make_model(512, 3).parameters()" in nb[at].source
    assert "os.cpu_count()" in nb[at].source


def test_a_published_measurement_stands_beside_the_model_takeaway_first():
    from dpteach.distributed import compare
    from dpteach.measure import published

    nb, at = tagged("ddp-published")
    first, close, *rows, footnote = run_cell(nb[at].source, {"compare": compare}).strip().splitlines()
    assert first.endswith("measured [1] beside the model:") and "measured/modelled" in rows[0]
    # the takeaway is the first figure printed, and it is what the prose says: within a few percent
    worst = re.fullmatch(r"  the model's step is within (\d+)% of every measured one", close)
    resnet50 = next(m for m in published.shipped() if m.id == "ddp-benchmark-resnet50")
    ratios = [r.ratio for r in published.compare(resnet50)]
    assert worst and int(worst[1]) == round(100 * max(abs(x - 1) for x in ratios)) < 10, close
    # the provenance is one short footnote, the inferred GPU named as inferred
    assert footnote.startswith("[1] PyTorch, benchmarks/distributed/ddp/README.md") and len(footnote) < 200
    assert "inferred" in footnote
    prose = " ".join(nb[at - 1].source.split())
    assert nb[at - 1].cell_type == "markdown" and "within a few percent" in prose
    # the V100s are said to be inferred, and the DataParallel comparison is sent to chapter 08
    assert "V100s inferred" in prose and "chapter 08" in prose


def test_this_machines_timing_is_the_learners_own_figure_and_sets_up_no_winner():
    nb, at = tagged("ddp-speed")
    before = nb[at - 1]
    main = re.sub(r"<details\b.*?</details>", " ", before.source, flags=re.S)
    assert before.cell_type == "markdown" and "nothing in this chapter rests on it" in " ".join(main.split())
    for expectation in ("faster", "slower", "wins", "two cores at once", "can use two cores", "speed-up"):
        assert expectation not in main.lower(), expectation
    # it comes after the model and the published measurement, last in its section
    tags = [t for c in nb for t in c.metadata.get("tags", [])]
    assert tags.index("ddp-timeline") < tags.index("ddp-published") < tags.index("ddp-speed")
