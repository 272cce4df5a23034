"""Set-up, checked statically: pyproject admits what Colab ships, environment.yml matches it, Binder installs us."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, from PyPI
    import tomli as tomllib
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
ENV = yaml.safe_load((ROOT / "environment.yml").read_text())

# What Google Colab ships (googlecolab/backend-info, 2026-08; see ../shared/research/ecosystem.md §2).
COLAB = {
    "torch": "2.11.0",
    "ipywidgets": "7.7.1",
    "graphviz": "0.21",
    "matplotlib": "3.10.0",
    "tqdm": "4.67.3",
    "numpy": "2.0.2",
}
# PyPI name -> conda-forge name on Binder
CONDA_NAME = {"torch": "pytorch-cpu", "graphviz": "python-graphviz", "matplotlib": "matplotlib-base"}


def _deps():
    return [Requirement(r) for r in PYPROJECT["project"]["dependencies"]]


def _conda_specs():
    specs = {}
    for entry in ENV["dependencies"]:
        if isinstance(entry, str):
            name, _, version = entry.partition("=")
            specs[name.strip()] = version.split("#")[0].strip()
    return specs


@pytest.mark.parametrize("req", _deps(), ids=lambda r: r.name)
def test_runtime_ranges_admit_what_colab_ships(req):
    assert req.name in COLAB, f"{req.name}: add Colab's version to COLAB in this test"
    assert req.specifier.contains(COLAB[req.name], prereleases=True), (
        f"{req} would upgrade Colab's {req.name} {COLAB[req.name]}"  # installing on Colab must upgrade nothing
    )


def test_python_range_admits_binder_ci_and_colab():
    spec = SpecifierSet(PYPROJECT["project"]["requires-python"])
    for version in ("3.10", "3.11", "3.13"):
        assert spec.contains(version), version


def test_core_needs_torch_alone():
    code = (
        "import sys, torch; before = set(sys.modules); import dpteach; "
        "print(sorted(m for m in ('graphviz', 'matplotlib', 'ipywidgets', 'tqdm', 'IPython') "
        "if m in sys.modules and m not in before))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"  # import dpteach loads none of the optional libraries


def test_environment_yml_is_conda_forge_with_pinned_python():
    assert ENV["channels"] == ["conda-forge"]
    specs = _conda_specs()
    assert re.fullmatch(r"3\.\d+", specs.get("python", "")), "pin Python: Binder's default is older"
    assert not any("cuda" in str(e).lower() for e in ENV["dependencies"])  # no CUDA builds on Binder
    assert not any(isinstance(e, dict) for e in ENV["dependencies"]), (
        "no pip: section (postBuild installs dpteach)"
    )


def test_environment_yml_has_every_runtime_dependency():
    specs = _conda_specs()
    for req in _deps():
        name = CONDA_NAME.get(req.name, req.name)
        assert name in specs, f"environment.yml lacks {name} (for {req.name})"
        version = specs[name].rstrip(".*")
        if version:
            # the Binder pin must satisfy pyproject's range
            assert req.specifier.contains(
                version + (".0" if version.count(".") < 2 else ""), prereleases=True
            ), f"{name}={specs[name]} does not satisfy {req}"
    assert "jupyterlab" in specs and "ipywidgets" in specs  # the lab itself


def test_postbuild_installs_dpteach():
    text = (ROOT / "postBuild").read_text()
    assert text.startswith("#!/bin/bash") and "set -e" in text
    assert re.search(r"pip install .*-e \.", text)
    assert os.access(ROOT / "postBuild", os.X_OK)


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme and "make lab" in readme  # the two commands
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_readme_links_point_at_notebooks_that_exist():
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"notebooks/[\w/.-]+\.ipynb", readme)
    assert links, "the README should link the chapters"
    for link in links:
        assert (ROOT / link).exists(), link


def test_packages_are_declared_explicitly():
    pkgs = PYPROJECT["tool"]["setuptools"]["packages"]
    on_disk = sorted(
        str(p.parent.relative_to(ROOT)).replace("/", ".") for p in (ROOT / "dpteach").rglob("__init__.py")
    )
    assert sorted(pkgs) == on_disk  # every subpackage ships (flat layout: no auto-discovery)


def _extra(name):
    """The requirements of one extra, with an extra of dpteach itself (``dpteach[book]``) unfolded."""
    found = []
    for line in PYPROJECT["project"]["optional-dependencies"][name]:
        req = Requirement(line)
        found += [r for extra in req.extras for r in _extra(extra)] if req.name == "dpteach" else [req]
    return found


@pytest.mark.parametrize("extra", ["test", "book", "lab", "e2e"])
def test_extras_install_on_the_oldest_python_we_admit(extra):
    """A pin whose release needs a newer Python than requires-python allows carries a marker that skips it there."""
    from importlib import metadata

    oldest = PYPROJECT["project"]["requires-python"].removeprefix(">=")  # ">=3.10": 3.10
    assert re.fullmatch(r"3\.\d+", oldest), "requires-python is one lower bound"
    for req in _extra(extra):
        if not any(spec.operator == "==" for spec in req.specifier):
            continue  # an open range: pip picks an older release that supports the Python it runs on
        try:
            needs = metadata.metadata(req.name).get("Requires-Python")
        except metadata.PackageNotFoundError:
            continue  # not installed here: nothing to read its Requires-Python from
        if needs and not SpecifierSet(needs).contains(oldest):
            assert req.marker is not None and not req.marker.evaluate({"python_version": oldest}), (
                f"{req}: its release needs Python {needs}; add `; python_version >= ...` so "
                f"`pip install .[{extra}]` works on {oldest}"
            )


def test_an_install_prints_no_package_would_be_ignored_page():
    """setuptools takes a data folder with an identifier's name for an unlisted package under include-package-data."""
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    data_folders = sorted(
        ".".join(d.relative_to(ROOT).parts)
        for d in (ROOT / "dpteach").rglob("*")
        if d.is_dir() and d.name != "__pycache__" and d.name.isidentifier() and any(d.iterdir())
    )
    unlisted = [d for d in data_folders if d not in listed]  # today dpteach.measure.data and its ours/
    assert not unlisted or PYPROJECT["tool"]["setuptools"].get("include-package-data", True) is False, (
        f"{unlisted} would each print a page of 'Package would be ignored' at `pip install -e .`"
    )
