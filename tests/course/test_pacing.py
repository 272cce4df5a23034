"""No progress bar in a chapter's saved outputs, and one optimizer style across the chapters.

A tqdm bar is a widget: a saved notebook opened without a live kernel (GitHub, nbviewer, the book)
shows it as "0%", so the chapters' loops run without one. Every chapter steps with plain SGD written
out (``story.sgd_step``: ``p -= lr * p.grad``), never a ``torch.optim`` optimizer to train with. The
exceptions are the cells tagged ``sgd-skips`` (chapter 01's, chapter 10's), which show that torch's
optimizers skip a parameter whose ``.grad`` is None, without a warning: that is what the learner's own
loop would do.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

CHAPTERS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("[01][0-9]_*.ipynb"))


def _code(path: Path, skip_tag: str | None = None) -> str:
    cells = nbformat.read(path, as_version=4).cells
    return "\n".join(
        c.source
        for c in cells
        if c.cell_type == "code" and skip_tag not in c.get("metadata", {}).get("tags", [])
    )


@pytest.mark.parametrize(
    "path",
    CHAPTERS,
    ids=[p.name for p in CHAPTERS],
)
def test_no_progress_bar_in_a_chapter(path):
    assert not re.search(r"\btqdm\b", _code(path)), f"{path.name} draws a tqdm bar"


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.name for p in CHAPTERS])
def test_one_optimizer_style(path):
    assert not re.search(r"\boptim\.\w+\(", _code(path, "sgd-skips")), (
        f"{path.name} builds a torch.optim optimizer"
    )
