"""Facts about the course that the notebooks, the README and the tests must agree on.

One place for where the course lives and which release it is:

* ``REPOSITORY``: the course's home. Moving it is a one-line change here, then
  ``scripts/sync_course.py`` (``make sync``) rewrites what is derived from it (the README's badges and
  chapter table links, every chapter's set-up cell and link line, pyproject's URLs); ``tests/test_course_links.py`` fails until
  that is done.
* ``VERSION``: the package version. ``pyproject.toml`` reads it (``dynamic = ["version"]``), and
  ``dpteach.__version__`` is this string. ``RELEASE`` is its git tag, which the set-up cell installs
  and the Colab and Binder links open.

This module imports nothing but the standard library, so setuptools can read ``VERSION`` statically.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPOSITORY = "https://github.com/dpteach/dpteach"  # the course's home: change it here only
VERSION = "0.1.0"
RELEASE = f"v{VERSION}"

_OWNER_REPO = REPOSITORY.removeprefix("https://github.com/").strip("/")

# Chapters that are worth opening on a GPU runtime: their notebooks ask Colab for one.
GPU_CHAPTERS = ("06_the_cost_of_copies", "08_real_gpus", "09_beyond_one_process")

COLAB_BADGE = "https://colab.research.google.com/assets/colab-badge.svg"
BINDER_BADGE = "https://mybinder.org/badge_logo.svg"
LINKS_CELL_ID = "open-links"  # the id of the markdown cell at the top of every notebook


def colab_url(notebook: str) -> str:
    """Open ``notebook`` (a path such as ``notebooks/01_the_bug.ipynb``) in Colab, at the release tag."""
    return f"https://colab.research.google.com/github/{_OWNER_REPO}/blob/{RELEASE}/{notebook}"


def binder_url(notebook: str) -> str:
    """Open ``notebook`` in JupyterLab on mybinder.org, at the release tag."""
    return f"https://mybinder.org/v2/gh/{_OWNER_REPO}/{RELEASE}?urlpath=lab/tree/{notebook}"


def badges(notebook: str) -> str:
    """The markdown line of launch badges for one notebook (README and the top of each notebook)."""
    return (
        f"[![Open In Colab]({COLAB_BADGE})]({colab_url(notebook)}) "
        f"[![Binder]({BINDER_BADGE})]({binder_url(notebook)})"
    )


# The first code cell of every chapter, verbatim (tests/test_notebooks.py checks it). It must work
# before dpteach is installed, so it is self-contained. On Colab it streams pip's output into the
# notebook (Colab hides a subprocess's own output) and, when pip fails, says so in one sentence.
SETUP_CELL = f'''\
# Set-up: on Colab, install dpteach {VERSION} (and ninja, for chapter 10) and turn on widgets;
# anywhere else (JupyterLab, Binder, a laptop) this cell does nothing.
import sys, subprocess
if "google.colab" in sys.modules:
    print("Installing dpteach {VERSION} from {REPOSITORY} ...", flush=True)
    pip = subprocess.Popen([sys.executable, "-m", "pip", "install", "--progress-bar", "off", "ninja",
                            "dpteach @ git+{REPOSITORY}@{RELEASE}"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in pip.stdout:
        print(line, end="", flush=True)
    if pip.wait() != 0:
        raise RuntimeError("pip could not install dpteach (its messages are above): check that this "
                           "runtime is online and that {REPOSITORY} has the tag "
                           "{RELEASE}, then run this cell again.")
    from google.colab import output
    output.enable_custom_widget_manager()
    print("dpteach {VERSION} is installed.")'''


# --------------------------------------------------------------------------------------------
# Writing the derived copies: scripts/sync_course.py [ROOT]
# --------------------------------------------------------------------------------------------


def chapter_notebooks(root: Path) -> list[Path]:
    """Every notebook of the course (chapters and solutions), sorted."""
    found = (root / "notebooks").rglob("*.ipynb")
    return sorted(
        p for p in found if ".ipynb_checkpoints" not in p.parts
    )  # JupyterLab's copies are not the course


def sync_notebook(path: Path, root: Path) -> bool:
    """Give one notebook the current set-up cell, link line and GPU metadata; True if it changed.

    Only the first code cell (set-up), the link cell (id ``open-links``, added at the top when
    missing) and the notebook metadata are touched; every other cell stays as it is.
    """
    import nbformat

    nb = nbformat.read(path, as_version=4)
    before = nbformat.writes(nb)
    rel = path.relative_to(root).as_posix()
    setup = next(c for c in nb.cells if c.cell_type == "code")
    setup.source = SETUP_CELL
    links = badges(rel)
    cell = next((c for c in nb.cells if c.get("id") == LINKS_CELL_ID), None)
    if cell is None:
        cell = nbformat.v4.new_markdown_cell(links)
        cell.id = LINKS_CELL_ID
        nb.cells.insert(0, cell)
    cell.source = links
    if path.stem in GPU_CHAPTERS:
        nb.metadata["accelerator"] = "GPU"
        nb.metadata["colab"] = {"provenance": [], "gpuType": "T4"}
    else:
        nb.metadata.pop("accelerator", None)
        nb.metadata.pop("colab", None)
    if nbformat.writes(nb) == before:
        return False
    nbformat.write(nb, path)
    return True


def readme_table_row(path: Path, root: Path, what: str, title: str | None = None) -> str:
    """One row of the README's chapter table; ``title`` defaults to the file name in words."""
    rel = path.relative_to(root).as_posix()
    if title is None:
        number, _, name = path.stem.partition("_")
        title = f"{number} {name.replace('_', ' ')}"
    return f"| [{title}]({rel}) | {what} | {badges(rel)} |"


def sync_readme(root: Path) -> bool:
    """Rewrite the README's top badges and the launch column of its chapter table; True if it changed."""
    import re

    readme = root / "README.md"
    text = readme.read_text()
    top = badges("notebooks/00_start_here.ipynb")
    new = re.sub(r"^\[!\[Open In Colab\].*$", top, text, count=1, flags=re.M)

    def row(match: re.Match) -> str:
        title, rel, what = match.group(1), match.group(2), match.group(3)
        return readme_table_row(root / rel, root, what, title)  # the title as written is kept

    new = re.sub(r"dpteach @ git\+https://[\w./-]+@v[\w.]+", f"dpteach @ git+{REPOSITORY}@{RELEASE}", new)
    new = re.sub(
        r"^\| \[(\d\d [^\]]+)\]\((notebooks/[\w/.-]+\.ipynb)\) \| (.*?) \|(?: \[!\[Open In Colab.*\|)?$",
        row,
        new,
        flags=re.M,
    )
    if new == text:
        return False
    readme.write_text(new)
    return True


def sync_pyproject(root: Path) -> bool:
    """Point pyproject.toml's [project.urls] at REPOSITORY; True if it changed."""
    import re

    path = root / "pyproject.toml"
    text = path.read_text()
    new = re.sub(
        r'^(\w+ = ")https://github\.com/[\w.-]+/[\w.-]+', lambda m: m.group(1) + REPOSITORY, text, flags=re.M
    )
    if new == text:
        return False
    path.write_text(new)
    return True


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    root = Path(args[0]) if args else Path(__file__).resolve().parents[1]
    changed = [p.relative_to(root).as_posix() for p in chapter_notebooks(root) if sync_notebook(p, root)]
    if sync_readme(root):
        changed.append("README.md")
    if sync_pyproject(root):
        changed.append("pyproject.toml")
    print("rewrote: " + (", ".join(changed) if changed else "nothing (all up to date)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
