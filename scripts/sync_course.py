"""Rewrite everything derived from dpteach/_course.py (REPOSITORY, VERSION): the README's badges and
launch links, every notebook's link cell, set-up cell and GPU metadata, pyproject's URLs, CITATION.cff's repository-code.

    python scripts/sync_course.py [ROOT]      (make sync)

tests/course/test_course_links.py fails until this has been run after a change to dpteach/_course.py.
"""

import importlib.util
import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]


def load_course(root: Path):
    """dpteach/_course.py of ``root``, loaded by path: it needs only the standard library, not torch."""
    spec = importlib.util.spec_from_file_location("_course", root / "dpteach" / "_course.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


course = load_course(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)


def sync_notebook(path: Path, root: Path) -> bool:
    """Give one notebook the current set-up cell, link line and GPU metadata; True if it changed.

    Only the first code cell (set-up, tagged ``remove-cell`` for the book), the link cell (id ``open-links``, added at the top when
    missing) and the notebook metadata are touched; every other cell stays as it is.
    """
    nb = nbformat.read(path, as_version=4)
    before = nbformat.writes(nb)
    rel = path.relative_to(root).as_posix()
    setup = next(c for c in nb.cells if c.cell_type == "code")
    setup.source = course.SETUP_CELL
    tags = setup.metadata.setdefault("tags", [])
    if "remove-cell" not in tags:  # the book drops the set-up cell from the page
        tags.append("remove-cell")
    links = course.link_cell(rel)
    cell = next((c for c in nb.cells if c.get("id") == course.LINKS_CELL_ID), None)
    if cell is None:
        cell = nbformat.v4.new_markdown_cell(links)
        cell.id = course.LINKS_CELL_ID
        nb.cells.insert(0, cell)
    cell.source = links
    if path.stem in course.GPU_CHAPTERS:
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
    return f"| [{title}]({rel}) | {what} | {course.badges(rel)} |"


def sync_readme(root: Path) -> bool:
    """Rewrite the README's top badges and the launch column of its chapter table; True if it changed."""
    readme = root / "README.md"
    text = readme.read_text()
    top = course.badges("notebooks/00_start_here.ipynb")
    new = re.sub(r"^\[!\[Open In Colab\].*$", top, text, count=1, flags=re.M)

    def row(match: re.Match) -> str:
        title, rel, what = match.group(1), match.group(2), match.group(3)
        return readme_table_row(root / rel, root, what, title)  # the title as written is kept

    new = re.sub(
        r"dpteach @ git\+https://[\w./-]+@v[\w.]+", f"dpteach @ git+{course.REPOSITORY}@{course.RELEASE}", new
    )
    new = re.sub(
        r"git clone https://[\w./-]+ && cd [\w.-]+",
        f"git clone {course.REPOSITORY} && cd " + course.REPOSITORY.rstrip("/").rsplit("/", 1)[-1],
        new,
    )  # the README's first step
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
    path = root / "pyproject.toml"
    text = path.read_text()
    new = re.sub(
        r'^(\w+ = ")https://github\.com/[\w.-]+/[\w.-]+',
        lambda m: m.group(1) + course.REPOSITORY,
        text,
        flags=re.M,
    )
    if new == text:
        return False
    path.write_text(new)
    return True


def sync_citation(root: Path) -> bool:
    """Point CITATION.cff's repository-code at REPOSITORY; True if it changed."""
    path = root / "CITATION.cff"
    text = path.read_text()
    new = re.sub(r'^(repository-code: ")[^"]*', lambda m: m.group(1) + course.REPOSITORY, text, flags=re.M)
    if new == text:
        return False
    path.write_text(new)
    return True


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    root = Path(args[0]) if args else ROOT
    changed = [
        p.relative_to(root).as_posix() for p in course.chapter_notebooks(root) if sync_notebook(p, root)
    ]
    if sync_readme(root):
        changed.append("README.md")
    if sync_pyproject(root):
        changed.append("pyproject.toml")
    if sync_citation(root):
        changed.append("CITATION.cff")
    print("rewrote: " + (", ".join(changed) if changed else "nothing (all up to date)"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or [str(ROOT)]))
