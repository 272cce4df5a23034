"""A learner's install: what `make lab` sets up, and the wheel in a fresh environment that has torch."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, from PyPI
    import tomli as tomllib
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
TEST_TOOLS = {"pytest", "pytest-timeout", "hypothesis", "playwright", "nbclient", "nbformat"}


def _dry_run(tmp_path: Path, target: str) -> str:
    """`make -n` in a copy: the commands a target would run, none of them run."""
    for name in ("Makefile", "pyproject.toml", "scripts/setup.sh"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    return subprocess.run(
        ["make", "-n", "-B", target], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_lab_sets_up_only_what_a_learner_needs(tmp_path):
    lab = _dry_run(tmp_path, "lab")
    assert "scripts/setup.sh lab" in lab and "setup.sh test" not in lab
    test = _dry_run(tmp_path, "test")
    assert "scripts/setup.sh test" in test
    lab_extra = {Requirement(r).name for r in PYPROJECT["project"]["optional-dependencies"]["lab"]}
    assert not lab_extra & TEST_TOOLS  # no test tooling in a learner's install
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert 'lab) EXTRAS="lab"' in setup  # `setup.sh lab` installs the lab extra alone...
    assert 'if [ "$WHAT" = test ]; then\n  command -v chromium' in setup  # ...and Chromium only for tests


def test_license_file_ships():
    assert (ROOT / "LICENSE").read_text().startswith("BSD 3-Clause License")
    assert PYPROJECT["project"]["license"] == "BSD-3-Clause" and PYPROJECT["project"]["license-files"] == [
        "LICENSE"
    ]
    assert (ROOT / "dpteach" / "py.typed").exists() and "py.typed" in PYPROJECT["tool"]["setuptools"][
        "package-data"
    ]["dpteach"]
    requires = [Requirement(r) for r in PYPROJECT["build-system"]["requires"]]
    setuptools = next(r for r in requires if r.name == "setuptools")
    assert not setuptools.specifier.contains("76.9") and setuptools.specifier.contains(
        "77.0"
    )  # SPDX license needs 77


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_wheel_installs_into_a_fresh_venv_with_torch(tmp_path):
    """scripts/check_wheel.sh: build from a clean copy, install beside torch, import and run it.

    The fresh venv gets this suite's torch by hard links (scripts/link_torch.py), not from pip: what is
    tested is the wheel, and unpacking torch again took most of the test's minute."""
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "check_wheel.sh"), str(tmp_path / "work")],
        cwd=ROOT,
        env={**os.environ, "DPTEACH_TORCH_FROM": sys.executable},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "check_wheel: OK" in done.stdout
    assert "link_torch: " in done.stdout  # torch was linked, not installed again
    assert "site-packages/dpteach" in done.stdout  # imported from the installed wheel, not the checkout
    assert "BUG  clone" in done.stdout and "ok   rewire" in done.stdout  # python -m dpteach ran its tour
