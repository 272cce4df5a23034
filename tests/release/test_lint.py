"""The package, its tests and scripts pass ruff's lint rules and are formatted as ruff formats them.

The rules live in pyproject.toml ([tool.ruff]); the README's test command runs this file like any other,
so a lint error or an unformatted file fails the run. Fix with `.venv/bin/ruff format dpteach tests scripts`
and `.venv/bin/ruff check --fix dpteach tests scripts`.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PATHS = ["dpteach", "tests", "scripts"]


def _ruff() -> list[str]:
    found = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if found is None:
        pytest.fail("ruff is not installed: it is in the test extra (pip install -e '.[test]')")
    return [found]


def test_ruff_lint_passes():
    done = subprocess.run([*_ruff(), "check", *PATHS], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_format_leaves_every_file_as_it_is():
    done = subprocess.run([*_ruff(), "format", "--check", *PATHS], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
