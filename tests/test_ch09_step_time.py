"""Chapter 09's step-time section rests on what repeats, the cost model and a published measurement.

The timeline cell prints how much of DataParallel's modelled step is the assumed thread starts and what
is left without them; the published cell prints PyTorch's own DDP measurement beside the model; the
timing of this machine comes last, introduced as the learner's own figure, with nothing resting on it.
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path
from unittest import mock

import nbformat
import pytest

from dpteach.distributed import make_data, make_model
from dpteach.measure import costmodel

CHAPTER = Path(__file__).resolve().parents[1] / "notebooks" / "09_beyond_one_process.ipynb"


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


def test_the_timeline_prints_dataparallels_modelled_step_without_the_assumed_thread_starts():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nb, at = tagged("ddp-timeline")
    printed = run_cell(nb[at].source, scope := {"make_model": make_model, "make_data": make_data})
    plt.close(scope["fig"])
    without = re.search(r"without them, modelled: DataParallel ([0-9.e-]+) ms, DDP ([0-9.e-]+) ms", printed)
    assert without, printed
    # the subtraction in the cell must be what the model gives with no thread starts at all
    work = costmodel.workload(make_model(512, depth=3), make_data(128)[0])
    with mock.patch.object(costmodel, "PYTHON_THREAD_S", 0.0):
        dp = costmodel.predict(work, "A100-SXM", 4, strategy="DataParallel", bucket_bytes=2**18)
    assert float(without[1]) == pytest.approx(dp.total_s * 1e3, rel=5e-3)
    ddp = costmodel.predict(work, "A100-SXM", 4, strategy="DDP", bucket_bytes=2**18)
    assert float(without[2]) == pytest.approx(ddp.total_s * 1e3, rel=5e-3)
    # and the prose beside it names the assumption, labelled modelled
    assert "PYTHON_THREAD_S" in nb[at + 1].source and "modelled" in nb[at + 1].source.lower()


def test_a_published_measurement_stands_beside_the_model():
    nb, at = tagged("ddp-published")
    printed = run_cell(nb[at].source, {})
    assert "(published)" in printed and "measured/modelled" in printed and "source:" in printed
    # the prose before it says that DataParallel has no such figure: its bar is the model's alone
    assert nb[at - 1].cell_type == "markdown" and "No published DataParallel figure" in nb[at - 1].source


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
