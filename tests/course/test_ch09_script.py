"""Chapter 09's ordinary DDP script: the cell writes it, and torchrun runs it on 2 CPU ranks.

The chapter shows the script a learner would write (init the process group, wrap in DDP, a
DistributedSampler, the loop, destroy the group) and tells them to run it from a terminal; here it is
run as they would, so the chapter never shows a script that does not train.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest

CHAPTER = Path(__file__).resolve().parents[2] / "notebooks" / "09_beyond_one_process.ipynb"

pytestmark = pytest.mark.slow  # torchrun and two ranks, each importing torch


def script_cell():
    cells = nbformat.read(CHAPTER, as_version=4).cells
    return next(c for c in cells if "ddp-script" in c.metadata.get("tags", []))


def test_the_script_shows_every_step_of_an_ordinary_ddp_program():
    source = script_cell().source
    for step in (
        'dist.init_process_group("gloo")',
        "DDP(torch.nn.Sequential(",
        "DistributedSampler(data)",
        "sampler.set_epoch(epoch)",
        "loss.backward()",
        "dist.destroy_process_group()",
    ):
        assert step in source, step
    assert len(source.splitlines()) <= 25


def test_torchrun_runs_the_written_script_on_two_cpu_ranks(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the cell writes into gettempdir()
    scope: dict = {}
    exec(script_cell().source, scope)
    script = scope["script"]
    assert script.parent == tmp_path and script.exists()
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    lines = re.findall(r"rank (\d), epoch (\d): loss ([0-9.]+)", run.stdout)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    # every rank trained every epoch, and printed a finite loss
    assert sorted((int(r), int(e)) for r, e, _ in lines) == [(r, e) for r in range(2) for e in range(5)]
    assert all(float(loss) < 1.0 for *_, loss in lines)
