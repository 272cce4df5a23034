"""`python -m dpteach reset`: chapters back to the course's version, never without asking first."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from dpteach import __main__ as cli
from dpteach import _reset

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = ("00_start_here.ipynb", "03_rewiring_gradient_edges.ipynb", "11_exercises.ipynb")


class Answer(io.StringIO):
    """A learner at a terminal typing ``text``."""

    def isatty(self) -> bool:
        return True


@pytest.fixture
def course(tmp_path, monkeypatch):
    """A git checkout of a small course (three chapters, one solutions notebook), as committed."""
    nb = tmp_path / "notebooks"
    (nb / "solutions").mkdir(parents=True)
    for name in CHAPTERS:
        (nb / name).write_text(f'{{"cells": [], "name": "{name}"}}\n')
    (nb / "solutions" / "11_exercises_solutions.ipynb").write_text('{"solutions": 1}\n')
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "course"], check=True)
    monkeypatch.chdir(nb)  # a learner in a terminal of the lab, in notebooks/
    return nb


def _run(args, answer=None):
    out = io.StringIO()
    stdin = Answer(answer) if answer is not None else io.StringIO()
    code = _reset.reset(args, stdin=stdin, out=out)
    return code, out.getvalue()


def test_reset_one_chapter_after_yes(course):
    edited = course / CHAPTERS[1]
    committed = edited.read_text()
    edited.write_text('{"cells": ["my work"]}\n')
    (course / CHAPTERS[0]).write_text("other edits\n")
    code, out = _run(["03"], answer="y\n")
    assert code == 0, out
    assert "03_rewiring_gradient_edges.ipynb" in out and "00_start_here" not in out  # lists what differs
    assert edited.read_text() == committed
    assert (course / CHAPTERS[0]).read_text() == "other edits\n"  # a chapter not named is left alone


@pytest.mark.parametrize("answer", ["\n", "n\n", "no\n", "whatever\n"])
def test_edits_stay_unless_the_answer_is_yes(course, answer):
    edited = course / CHAPTERS[1]
    edited.write_text("my work\n")
    code, out = _run(["03"], answer=answer)
    assert code == 1 and "nothing changed" in out
    assert edited.read_text() == "my work\n"


def test_without_a_terminal_it_asks_for_yes_and_changes_nothing(course):
    (course / CHAPTERS[1]).write_text("my work\n")
    code, out = _run(["03"])
    assert code == 1 and "--yes" in out
    assert (course / CHAPTERS[1]).read_text() == "my work\n"


def test_all_with_yes_resets_every_chapter_and_the_solutions(course):
    for p in course.rglob("*.ipynb"):
        p.write_text("edited\n")
    code, out = _run(["--all", "--yes"])
    assert code == 0, out
    assert all(p.read_text() != "edited\n" for p in course.rglob("*.ipynb"))
    assert "4 chapter(s)" in out


def test_a_chapter_already_as_committed_is_not_listed(course):
    code, out = _run(["03", "00"], answer="y\n")
    assert code == 0 and "nothing to do" in out


def test_eleven_is_the_chapter_not_its_solutions(course):
    (course / "11_exercises.ipynb").write_text("mine\n")
    code, _ = _run(["11", "--yes"])
    assert code == 0 and "mine" not in (course / "11_exercises.ipynb").read_text()


def test_unknown_chapter_and_bad_usage(course):
    with pytest.raises(SystemExit, match="no single chapter '42'"):
        _run(["42", "--yes"])
    assert _run(["--all", "03"])[0] == 2
    assert _run(["--force"])[0] == 2


def test_outside_a_checkout_it_downloads_the_release(tmp_path, monkeypatch):
    nb = tmp_path / "course" / "notebooks"
    nb.mkdir(parents=True)
    (nb / CHAPTERS[1]).write_text("my work\n")
    mirror = tmp_path / "mirror" / "notebooks"
    mirror.mkdir(parents=True)
    (mirror / CHAPTERS[1]).write_text('{"as": "released"}\n')
    monkeypatch.setenv("DPTEACH_COURSE_URL", (tmp_path / "mirror").as_uri())
    monkeypatch.setattr(_reset, "_git_root", lambda path: None)  # as if no git here (the test may run in one)
    monkeypatch.chdir(tmp_path / "course")
    code, out = _run(["3", "--yes"])
    assert code == 0, out
    assert (nb / CHAPTERS[1]).read_text() == '{"as": "released"}\n'


def test_the_release_url_is_the_tag_the_set_up_cell_installs(tmp_path, monkeypatch):
    seen = []

    def fake_urlopen(url, timeout):
        seen.append(url)
        raise OSError("offline")

    monkeypatch.delenv("DPTEACH_COURSE_URL", raising=False)
    monkeypatch.setattr(_reset, "_git_root", lambda path: None)
    monkeypatch.setattr(_reset.urllib.request, "urlopen", fake_urlopen)
    (tmp_path / "03_rewiring_gradient_edges.ipynb").write_text("x")
    with pytest.raises(SystemExit, match="could not fetch"):
        _reset.course_version(tmp_path / "03_rewiring_gradient_edges.ipynb", tmp_path)
    from dpteach import _course

    assert seen == [
        f"https://raw.githubusercontent.com/dpteach/dpteach/{_course.RELEASE}/notebooks/03_rewiring_gradient_edges.ipynb"
    ]


def test_help_prints_usage():
    out = io.StringIO()
    assert cli.main(["--help"], out=out) == 0
    assert "python -m dpteach reset 03" in out.getvalue() and "--all" in out.getvalue()
    out = io.StringIO()
    assert cli.main(["frobnicate"], out=out) == 2 and "usage:" in out.getvalue()


def test_python_m_dpteach_help_in_a_process():
    done = subprocess.run(
        [sys.executable, "-m", "dpteach", "--help"], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 0 and done.stdout.startswith("usage: python -m dpteach")
