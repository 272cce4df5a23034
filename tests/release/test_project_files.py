"""The files a contributor, an instructor and a citer look for: present, valid, and in step."""

from __future__ import annotations

import datetime
import re
from pathlib import Path

import yaml

from dpteach._course import VERSION

ROOT = Path(__file__).resolve().parents[2]


def test_citation_cff_is_valid_cff_1_2_0():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    for key in ("cff-version", "message", "title", "authors"):  # the keys CFF 1.2.0 requires
        assert cff.get(key), key
    assert cff["cff-version"] == "1.2.0"
    assert isinstance(cff["authors"], list)
    assert all(isinstance(a, dict) and ("name" in a or "family-names" in a) for a in cff["authors"])
    assert cff["type"] in ("software", "dataset")
    assert cff["license"] == "BSD-3-Clause"
    datetime.date.fromisoformat(str(cff["date-released"]))


def test_citation_names_the_repository_the_readme_installs_from():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    readme = (ROOT / "README.md").read_text()
    assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", cff["repository-code"])  # CFF's url pattern
    assert f"git+{cff['repository-code']}@" in readme  # the pip install line's repository


def test_citation_version_is_the_package_version():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert str(cff["version"]) == VERSION, "set CITATION.cff's version when VERSION changes"


def test_changelog_keeps_a_changelog_with_unreleased_and_this_version():
    text = (ROOT / "CHANGELOG.md").read_text()
    versions = re.findall(r"^## \[([^\]]+)\]", text, flags=re.M)
    assert versions[0] == "Unreleased"
    assert VERSION in versions, f"CHANGELOG.md has no section for {VERSION}"
    for heading in re.findall(r"^### (.+)$", text, flags=re.M):
        assert heading in ("Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"), heading
    dates = re.findall(r"^## \[\d[^\]]*\] - (\S+)$", text, flags=re.M)
    assert dates, "each released version has a date: ## [X.Y.Z] - YYYY-MM-DD"
    for date in dates:
        datetime.date.fromisoformat(date)


def test_contributing_names_the_commands_and_links_the_architecture():
    text = (ROOT / "CONTRIBUTING.md").read_text()
    assert "make lab" in text and "make test" in text
    assert 'pytest -m "not slow and not browser"' in text  # the fast subset
    assert "(docs/architecture.md)" in text
    for target in ("dist", "wheel-check", "sync"):
        assert f"make {target}" in text
        assert re.search(rf"^{re.escape(target)}:", (ROOT / "Makefile").read_text(), flags=re.M), target
    for section in ("## Adding a chapter", "## Adding an exercise", "## Adding a strategy", "## Releasing"):
        assert section in text


def test_documents_link_only_to_files_that_exist():
    for doc in ("CONTRIBUTING.md", "docs/teaching.md", "docs/library.md", "docs/architecture.md"):
        path = ROOT / doc
        for link in re.findall(r"\]\(([^)#:]+\.(?:md|ipynb|cff))\)", path.read_text()):
            assert (path.parent / link).is_file(), f"{doc} links {link}"


def test_gpu_check_names_only_test_files_that_exist():
    """scripts/gpu_check.sh runs a fixed list of test files; one renamed away stops its whole pytest step."""
    named = re.findall(r"tests/[\w/]+\.py", (ROOT / "scripts" / "gpu_check.sh").read_text())
    assert len(named) >= 10
    assert [p for p in named if not (ROOT / p).is_file()] == []
