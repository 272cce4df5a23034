"""One source of truth: dpteach/_course.py holds the repository, the version and the release tag.

Everything else that names them (README badges and chapter links, every notebook's link cell and
set-up cell, pyproject.toml, the environment check, the installed package) is derived from it or
checked against it here. A wrong copy anywhere fails; so does a stray hard-coded URL.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, from PyPI
    import tomli as tomllib

import dpteach
from dpteach import _course
from dpteach._course import GPU_CHAPTERS, LINKS_CELL_ID, RELEASE, REPOSITORY, SETUP_CELL, VERSION
from dpteach.course import env

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = _course.chapter_notebooks(ROOT)
CHAPTERS = [p for p in NOTEBOOKS if p.parent.name == "notebooks"]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_version_is_written_once():
    assert dpteach.__version__ == VERSION
    assert "version" not in PYPROJECT["project"] and "version" in PYPROJECT["project"]["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "dpteach._course.VERSION"}
    assert RELEASE == f"v{VERSION}"
    # no other file spells the version out as a literal assignment
    tracked = subprocess.run(
        ["git", "ls-files", "*.py", "*.toml", "*.cfg"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    literal = re.compile(r"""^\s*(__version__|version)\s*=\s*["']\d""", re.M | re.I)
    assert [f for f in tracked if literal.search((ROOT / f).read_text())] == ["dpteach/_course.py"]


def test_setuptools_reads_the_version_without_importing_torch(tmp_path):
    """The build backend's own view of the version: what a wheel gets stamped with."""
    code = (
        "import sys; sys.modules['torch'] = None\n"  # importing torch would fail: it must not be needed
        "from setuptools.config.pyprojecttoml import read_configuration\n"
        f"print(read_configuration({str(ROOT / 'pyproject.toml')!r}, expand=True)['project']['version'])"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == VERSION


def test_setup_cell_installs_the_release_from_the_repository():
    assert f"dpteach @ git+{REPOSITORY}@{RELEASE}" in SETUP_CELL
    assert "ninja" in SETUP_CELL
    compile(SETUP_CELL, "setup-cell", "exec")  # valid Python on this interpreter


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_every_notebook_opens_with_its_own_launch_links(path):
    nb = nbformat.read(path, as_version=4)
    rel = path.relative_to(ROOT).as_posix()
    first = nb.cells[0]
    assert first.cell_type == "markdown" and first.id == LINKS_CELL_ID
    assert first.source == _course.link_cell(rel)  # the badges; from chapter 05 on, the recap under them
    colab = f"https://colab.research.google.com/github/{REPOSITORY.removeprefix('https://github.com/')}/blob/{RELEASE}/{rel}"
    assert f"]({colab})" in first.source  # Colab opens exactly this file at the release tag
    assert f"/{RELEASE}?urlpath=lab/tree/{rel})" in first.source  # and so does Binder
    setup = next(c for c in nb.cells if c.cell_type == "code")
    assert setup.source == SETUP_CELL


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.name for p in CHAPTERS])
def test_gpu_chapters_ask_colab_for_a_gpu(path):
    nb = nbformat.read(path, as_version=4)
    wants = path.stem in GPU_CHAPTERS
    assert (nb.metadata.get("accelerator") == "GPU") == wants
    if wants:
        assert nb.metadata["colab"]["gpuType"]
        assert "cuda" in "".join(c.source for c in nb.cells if c.cell_type == "code")  # it really uses one


def test_readme_badges_and_table_are_derived():
    readme = (ROOT / "README.md").read_text()
    assert _course.badges("notebooks/00_start_here.ipynb") in readme.split("\n\n")[1]  # the top badges
    for path in CHAPTERS:
        rel = path.relative_to(ROOT).as_posix()
        rows = [
            line
            for line in readme.splitlines()
            if line.startswith(f"| [{path.stem[:2]} ") and f"({rel})" in line
        ]
        assert len(rows) == 1, f"the README's chapter table needs one row for {rel}"
        assert rows[0].endswith(f"| {_course.badges(rel)} |")
    assert (
        f'pip install "dpteach @ git+{REPOSITORY}@{RELEASE}"' in readme
    )  # the install line for your own notebook


def test_pyproject_urls_point_at_the_repository():
    urls = PYPROJECT["project"]["urls"]
    assert urls and all(u.startswith(REPOSITORY) for u in urls.values())


def test_environment_check_reports_this_release():
    item = env.check()["dpteach"]
    assert VERSION in item.found and RELEASE in item.found and REPOSITORY in item.found
    assert str(Path(dpteach.__file__).parent) in item.found  # where it is installed


def test_everything_derived_is_up_to_date(tmp_path):
    """Running the sync on a copy changes nothing: no copy was edited by hand."""
    copy = _copy_course(tmp_path)
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "sync_course.py"), str(copy)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "nothing" in out, out


def test_no_other_file_names_the_repository():
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    derived = {"dpteach/_course.py", "README.md", "pyproject.toml", "CITATION.cff"}
    stray = [
        f
        for f in tracked
        if f not in derived
        and not f.endswith(".ipynb")
        and not f.startswith("tests/")
        and (ROOT / f).is_file()
        and REPOSITORY in (ROOT / f).read_text(errors="ignore")
    ]
    assert stray == [], "derive these from dpteach._course.REPOSITORY instead"


def test_moving_the_repository_is_a_one_line_change(tmp_path):
    copy = _copy_course(tmp_path)
    source = (copy / "dpteach" / "_course.py").read_text()
    line = f'REPOSITORY = "{REPOSITORY}"'
    assert source.count(line) == 1
    (copy / "dpteach" / "_course.py").write_text(
        source.replace(line, 'REPOSITORY = "https://github.com/new-home/course"')
    )
    subprocess.run(
        [sys.executable, str(copy / "scripts" / "sync_course.py"), str(copy)], check=True, capture_output=True
    )
    spec = importlib.util.spec_from_file_location("moved_course", copy / "dpteach" / "_course.py")
    moved = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(moved)
    for path in [
        copy / "README.md",
        copy / "pyproject.toml",
        copy / "CITATION.cff",
        *moved.chapter_notebooks(copy),
    ]:
        text = path.read_text()
        assert "dpteach/dpteach" not in text, path  # the old home is gone everywhere
    for path in moved.chapter_notebooks(copy):
        nb = nbformat.read(path, as_version=4)
        assert (
            "/github/new-home/course/blob/" in nb.cells[0].source
            and "/gh/new-home/course/" in nb.cells[0].source
        )
        assert (
            "git+https://github.com/new-home/course@"
            in next(c for c in nb.cells if c.cell_type == "code").source
        )
    assert "colab.research.google.com/github/new-home/course/blob/" in (copy / "README.md").read_text()


def _copy_course(tmp_path: Path) -> Path:
    copy = tmp_path / "course"
    for name in ("README.md", "pyproject.toml", "CITATION.cff"):
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, copy / name)
    shutil.copytree(ROOT / "notebooks", copy / "notebooks")
    (copy / "dpteach").mkdir()
    shutil.copy(ROOT / "dpteach" / "_course.py", copy / "dpteach" / "_course.py")
    (copy / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "sync_course.py", copy / "scripts" / "sync_course.py")
    return copy
