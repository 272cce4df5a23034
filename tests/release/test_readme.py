"""The README is for learners: short, its two commands first, and what it promises is true."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
WORD_LIMIT = 1000

# The one table of what each kind of hardware gets; README, chapter 00's map (and chapter 08).
HARDWARE_ROWS = ("| a CPU (laptop, Binder) |", "| one GPU (Colab) |", "| several GPUs |")


def test_readme_is_at_most_a_thousand_words():
    words = len(README.split())
    assert words <= WORD_LIMIT, f"README.md has {words} words; move detail to docs/ (limit {WORD_LIMIT})"


def test_the_two_commands_come_first():
    first_block = README.split("```", 2)[1]
    before = README.split("```", 1)[0]
    assert "## " not in before, "the two commands come before the first section"
    assert "make lab" in first_block and "make test" in first_block
    assert first_block.index("make lab") < first_block.index("make test")


def test_the_first_block_pastes_as_is_on_a_bare_debian():
    first_block = README.split("```", 2)[1]
    assert first_block.index("git clone ") < first_block.index("cd dpteach") < first_block.index("make lab")
    # what `make lab` needs before scripts/setup.sh can install the rest: git for the clone, make,
    # python3 with venv (Debian ships ensurepip apart), and CA certificates for the https downloads
    line = re.search(r"`(apt-get update && apt-get install -y [^`]+)`", README)
    assert line, "the README names the one apt-get line a bare Debian/Ubuntu image needs"
    for package in ("git", "make", "python3", "python3-venv", "ca-certificates"):
        assert package in line.group(1).split(), package
    assert "sudo" in README.split(line.group(0), 1)[1][:80]  # and says a normal user prefixes sudo


def test_three_ways_to_start_and_the_reset_command():
    start = README.split("## Three ways to start", 1)[1].split("\n## ", 1)[0]
    for way in ("make lab", "Binder", "Colab"):
        assert way in start, way
    assert "python -m dpteach reset 03" in README and "--all" in README


def test_hardware_table_has_the_three_rows():
    rows = [line for line in README.splitlines() if line.startswith(HARDWARE_ROWS)]
    assert [r.split(" |")[0] for r in rows] == [r.split(" |")[0] for r in HARDWARE_ROWS]


def test_hardware_rows_are_chapter_00s():
    nb = nbformat.read(ROOT / "notebooks" / "00_start_here.ipynb", as_version=4)
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    ours = [line for line in README.splitlines() if line.startswith(HARDWARE_ROWS)]
    theirs = [line for line in text.splitlines() if line.startswith(HARDWARE_ROWS)]
    assert ours == theirs, "the README's hardware rows differ from chapter 00's map"


def test_chapter_table_row_per_chapter_uses_current_numbers():
    chapters = sorted(p.stem[:2] for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    rows = re.findall(r"^\| \[(\d\d) [^\]]+\]\(notebooks/", README, flags=re.M)
    assert rows == chapters


def test_shows_the_drop_in_and_the_replicas_for_autograd_graph():
    code = README.split("```python", 1)[1].split("```", 1)[0]
    assert "import dpteach" in code or "import torch, dpteach" in code
    assert "dpteach.DataParallel(" in code
    assert "dpteach.keep_replicas(" in code and "dpteach.autograd_graph(" in code
    assert "replicas=replicas" in code


def test_readme_code_runs():
    """The README's example does what its comments say (the bug under "clone")."""
    code = README.split("```python", 1)[1].split("```", 1)[0]
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    assert scope["model"][0].weight.grad is None  # "None under clone: the bug"
    assert len(scope["replicas"]) == 2


def test_readme_does_not_claim_to_reimplement_ddp():
    assert "complete, importable re-implementation" not in README
    assert "does not re-implement it" in README


def test_linked_documents_exist():
    for link in re.findall(r"\]\(((?:docs/|CONTRIBUTING|CHANGELOG|CITATION|LICENSE)[^)#]*)\)", README):
        assert (ROOT / link).is_file(), link
    for doc in ("docs/library.md", "docs/teaching.md", "docs/architecture.md", "CONTRIBUTING.md"):
        assert f"]({doc})" in README, doc
