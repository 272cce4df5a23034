"""Chapter 09's sentences about speed come from its own measurement, as chapters 06 and 08's do.

Which of DataParallel and DDP was faster changes with the machine and its load, so the chapter prints
``claims.SpeedUp`` and ``claims.Comparison`` sentences beside the medians it measured, and its markdown
states no measured speed. The checks are ``tests/test_claims.py``'s, applied to chapter 09.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from executed import executed
from test_claims import NUMBER_CLAIM, check_cell_output

CHAPTER = Path(__file__).resolve().parents[1] / "notebooks" / "09_beyond_one_process.ipynb"


def test_markdown_states_no_measured_speed():
    nb = nbformat.read(CHAPTER, as_version=4)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            found = NUMBER_CLAIM.search(cell.source)
            assert not found, f"cell {i} states {found[0]!r}: print it from the measurement instead"


@pytest.mark.notebook
def test_printed_verdicts_agree_with_the_measurements(monkeypatch):
    monkeypatch.setenv("TQDM_DISABLE", "1")
    nb, _, _ = executed(CHAPTER)  # the run's one executed copy, shared with test_notebooks
    checked = sum(
        check_cell_output("".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream"))
        for cell in nb.cells
        if cell.cell_type == "code"
    )
    # three widths: DataParallel and DDP against one process, and DDP against DataParallel
    assert checked >= 9, f"chapter 09 printed {checked} measured verdicts; its conclusions come from them"
