"""Binder: the environment it builds, and whether the heaviest chapters fit in its 2 GB.

mybinder.org guarantees 1 GB and restarts a kernel over 2 GB (its user guidelines). Chapters 08 and 09
(two DDP ranks each) and 10 (a C++ compile) are the heaviest; tests/executed.py samples them while the suite
runs them (scripts/peak_memory.py's sampler), summing the memory of the kernel and every process it
starts (PSS: shared pages split among them).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
import executed as executed_module  # noqa: E402  (the suite's one run of each chapter)

ENV = yaml.safe_load((ROOT / "environment.yml").read_text())
BINDER_MAX_MB = 2048


def _names() -> set[str]:
    return {e.split("=")[0].strip() for e in ENV["dependencies"] if isinstance(e, str)}


def test_binder_builds_openblas_torch_with_what_chapter_10_needs():
    names = _names()
    assert "nomkl" in names  # conda-forge's generic-BLAS pytorch build (OpenBLAS), not the MKL one
    assert "pytorch-cpu" in names
    assert {"ninja", "cxx-compiler"} <= names  # chapter 10 compiles on Binder


def test_teaching_guide_tells_binder_users_to_shut_kernels_down():
    guide = (ROOT / "docs" / "teaching.md").read_text()  # the README points instructors there
    section = guide.split("## On Binder", 1)[1].split("\n## ", 1)[0]
    assert "Shut Down Kernel" in section and "2 GB" in section
    assert all(f"| {n} " in section for n in ("08", "09", "10"))  # the measured peaks are stated


@pytest.mark.slow
@pytest.mark.notebook
@pytest.mark.skipif(
    shutil.which("c++") is None, reason="chapter 10 needs a C++ compiler to measure its compile"
)
@pytest.mark.parametrize("chapter", executed_module.MEMORY_SAMPLED)
def test_chapters_that_start_processes_fit_in_binders_memory(chapter):
    """Sampled while the suite's one run of the chapter ran (tests/executed.py); chapter 10 compiled
    into an empty C++ cache there, as on a fresh Binder."""
    nb = executed_module.executed(ROOT / "notebooks" / f"{chapter}.ipynb")[0]
    peaks = nb.metadata["dpteach_memory"]
    print(chapter, peaks)
    assert peaks["peak_processes"] >= 2, (
        peaks
    )  # the sampler saw the ranks / the compiler, not the kernel alone
    assert peaks["peak_pss_mb"] < BINDER_MAX_MB, (
        f"{chapter} peaks at {peaks['peak_pss_mb']} MB: over Binder's 2 GB"
    )
