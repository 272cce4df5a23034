"""``python -m dpteach reset``: put chapters back to the course's version, asking before any edit is lost.

Where the course's version comes from:

* in a git checkout of the course (``make lab``, Binder): the committed file, ``git show HEAD:<path>``;
* anywhere else (a folder of downloaded chapters): the chapter at the release tag on GitHub
  (``_course.REPOSITORY`` at ``_course.RELEASE``), ``raw.githubusercontent.com``; ``DPTEACH_COURSE_URL``
  names another base URL (a mirror, or a ``file://`` folder).

Which chapters differ from it are listed first, and nothing is written until the learner answers ``y``;
``--yes`` answers for a script. A chapter that already matches is left alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path

from . import _course

USAGE = """\
usage: python -m dpteach reset CHAPTER... [--yes]
       python -m dpteach reset --all [--yes]

Put chapters back to the course's version (the committed file in a git checkout, else the release
on GitHub). CHAPTER is a number (03), a name (03_rewiring_gradient_edges) or a path. The chapters that
differ are listed and nothing is overwritten until you answer y; --yes answers for you."""


def find_notebooks(start: Path | None = None) -> Path:
    """The course's ``notebooks/`` folder: under the working directory or one above it, else beside
    this package (an editable install of a checkout)."""
    start = Path.cwd() if start is None else start
    for folder in (start, *start.parents):
        if (folder / "notebooks").is_dir() and any((folder / "notebooks").glob("[0-9][0-9]_*.ipynb")):
            return folder / "notebooks"
        if folder.name == "notebooks" and any(folder.glob("[0-9][0-9]_*.ipynb")):
            return folder
    beside = Path(__file__).resolve().parents[1] / "notebooks"
    if beside.is_dir():
        return beside
    raise SystemExit("reset: no notebooks/ folder of the course here or above; cd into the course first")


def select(notebooks: Path, names: list[str], every: bool) -> list[Path]:
    """The chapter files ``names`` name (``every``: all of them, solutions included)."""
    chapters = sorted(
        p for p in notebooks.rglob("*.ipynb") if not any(part.startswith(".") for part in p.parts)
    )
    if every:
        return chapters
    chosen = []
    for name in names:
        stem = Path(name).stem
        found = [p for p in chapters if p.stem == stem or p.stem.split("_")[0] == stem.zfill(2)]
        found = [p for p in found if p.parent == notebooks] or found  # "11": the chapter, not its solutions
        if len(found) != 1:
            known = ", ".join(p.stem.split("_")[0] for p in chapters if p.parent == notebooks)
            raise SystemExit(f"reset: no single chapter {name!r} (chapters: {known})")
        chosen.append(found[0])
    return chosen


def _git_root(path: Path) -> Path | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(path.parent), "rev-parse", "--show-toplevel"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return Path(out.stdout.strip())


def course_version(path: Path, notebooks: Path) -> bytes:
    """The course's version of chapter ``path``: committed in git, else downloaded from the release."""
    root = _git_root(path)
    if root is not None:
        rel = path.resolve().relative_to(root.resolve()).as_posix()
        shown = subprocess.run(["git", "-C", str(root), "show", f"HEAD:{rel}"], capture_output=True)
        if shown.returncode == 0:
            return shown.stdout
    owner_repo = _course.REPOSITORY.removeprefix("https://github.com/")
    base = os.environ.get(
        "DPTEACH_COURSE_URL", f"https://raw.githubusercontent.com/{owner_repo}/{_course.RELEASE}"
    )
    url = f"{base.rstrip('/')}/notebooks/{path.relative_to(notebooks).as_posix()}"
    try:
        with urllib.request.urlopen(url, timeout=30) as reply:
            return reply.read()
    except OSError as err:
        raise SystemExit(f"reset: could not fetch the course's {path.name} from {url}: {err}") from err


def reset(argv: list[str], stdin=sys.stdin, out=sys.stdout) -> int:
    """The ``reset`` command; returns the exit status."""
    if not argv or "-h" in argv or "--help" in argv:
        print(USAGE, file=out)
        return 0 if argv else 2
    yes = "--yes" in argv or "-y" in argv
    every = "--all" in argv
    names = [a for a in argv if not a.startswith("-")]
    unknown = [a for a in argv if a.startswith("-") and a not in ("--yes", "-y", "--all")]
    if unknown or (every and names) or not (every or names):
        print(USAGE, file=out)
        return 2
    notebooks = find_notebooks()
    chapters = select(notebooks, names, every)
    wanted = {p: course_version(p, notebooks) for p in chapters}
    differ = [p for p, text in wanted.items() if p.read_bytes() != text]
    if not differ:
        print("reset: every chapter named is already the course's version; nothing to do", file=out)
        return 0
    print(
        "These chapters differ from the course's version; your edits and saved outputs in them go:", file=out
    )
    for p in differ:
        print(f"  {p.relative_to(notebooks.parent)}", file=out)
    if not yes:
        if not stdin.isatty():
            print("reset: not asked at a terminal; run again with --yes to reset them", file=out)
            return 1
        print("Reset them? [y/N] ", end="", file=out, flush=True)
        if stdin.readline().strip().lower() not in ("y", "yes"):
            print("reset: nothing changed", file=out)
            return 1
    for p in differ:
        p.write_bytes(wanted[p])
    print(
        f"reset: {len(differ)} chapter(s) back to the course's version (reload them in JupyterLab)", file=out
    )
    return 0
