"""The headless runner gives a chapter whose kernel stops answering one more try in a new kernel, and
no more: a cell that times out twice fails the run."""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest
from nbclient.exceptions import CellTimeoutError

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from run_notebook import execute  # noqa: E402


def _notebook(tmp_path: Path, source: str) -> Path:
    path = tmp_path / "hang.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)]), path)
    return path


@pytest.mark.slow
def test_a_cell_that_hangs_once_runs_again_in_a_new_kernel(tmp_path, capsys):
    flag = tmp_path / "first-run-was-here"
    path = _notebook(
        tmp_path,
        f"import pathlib, time\nflag = pathlib.Path({str(flag)!r})\n"
        "if not flag.exists():\n    flag.touch()\n    time.sleep(60)  # the first kernel stops answering\n"
        "print('second run')",
    )
    nb, _ = execute(path, timeout=3)
    assert flag.exists()
    assert "second run" in nb.cells[0].outputs[0]["text"]
    assert "running it again in a new kernel" in capsys.readouterr().err


@pytest.mark.slow
def test_a_cell_that_always_hangs_fails(tmp_path):
    path = _notebook(tmp_path, "import time\ntime.sleep(60)")
    with pytest.raises(CellTimeoutError):
        execute(path, timeout=2)


@pytest.mark.slow
def test_a_run_past_its_wall_clock_runs_again_even_when_no_cell_timeout_fires(tmp_path, capsys):
    flag = tmp_path / "first-run-was-here"
    path = _notebook(
        tmp_path,
        f"import pathlib, time\nflag = pathlib.Path({str(flag)!r})\n"
        "if not flag.exists():\n    flag.touch()\n    time.sleep(60)\n"
        "print('second run')",
    )
    nb, _ = execute(path, timeout=120, whole=8)  # the per-cell limit alone would wait 120 s
    assert "second run" in nb.cells[0].outputs[0]["text"]
    assert "ran 8 s; running it again" in capsys.readouterr().err
