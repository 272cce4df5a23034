"""The cost chapters' prose states no measured speed: a timing is the learner's own figure, printed.

On a laptop, Binder or a busy 2-core machine a timing does not repeat, so no sentence a chapter
wrote in advance may state one; the chapters print what the learner's run measured, with its spread.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
COST_CHAPTERS = [
    "06_the_cost_of_copies.ipynb",
    "08_real_gpus.ipynb",
    "09_beyond_one_process.ipynb",
    "12_the_lab.ipynb",
]
NUMBER_CLAIM = re.compile(
    r"\d+(\.\d+)?\s*(×|x\b)|\d+(\.\d+)?\s*(ms|µs|us)\b|\b(twice|three times|half) as (fast|slow|long)\b"
)


# A model's stated assumption ("an assumed 100 µs per thread start") is not a measured speed.
ASSUMPTION = re.compile(r"assum|modelled", re.I)


def stated_speeds(text: str) -> list[str]:
    """The speeds ``text`` states as facts: every match outside a sentence that names an assumption."""
    found = []
    for sentence in re.split(r"(?<=[.!?])\s+", text):
        if not ASSUMPTION.search(sentence):
            found += [m[0] for m in NUMBER_CLAIM.finditer(sentence)]
    return found


def test_the_pattern_catches_a_stated_speed():
    assert stated_speeds("DDP was 1.8x faster.") and stated_speeds("A step took 12 ms.")
    assert stated_speeds("It is twice as fast.") and not stated_speeds("Two processes, one thread each.")
    assert not stated_speeds("The model charges an assumed 100 µs per thread start.")
    assert stated_speeds("The model is labelled. A step took 12 ms.")  # the next sentence still counts


@pytest.mark.parametrize("name", COST_CHAPTERS)
def test_markdown_states_no_measured_speed(name):
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            found = stated_speeds(cell.source)
            assert not found, f"cell {i} states {found[0]!r}: print it from the measurement instead"
