"""The Colab branch of every chapter's set-up cell, run for real against a stand-in Colab.

Colab cannot run here, so the test builds what the cell touches: a ``google.colab`` module whose
``output.enable_custom_widget_manager`` records its call, and a ``pip`` stand-in (``sys.executable``
pointed at a small script) that prints like pip and then succeeds or fails. The cell's exact source,
as committed in the chapters, runs in-process and in a real Jupyter kernel.
"""

from __future__ import annotations

import stat
import sys
import types
from pathlib import Path

import nbformat
import pytest

from dpteach._course import RELEASE, REPOSITORY, SETUP_CELL, VERSION

ROOT = Path(__file__).resolve().parents[2]
CHAPTER = ROOT / "notebooks" / "01_the_bug.ipynb"


def committed_setup_cell() -> str:
    nb = nbformat.read(CHAPTER, as_version=4)
    source = next(c for c in nb.cells if c.cell_type == "code").source
    assert source == SETUP_CELL  # the learners' cell is the one this module tests
    return source


def fake_pip(tmp_path: Path, ok: bool) -> tuple[Path, Path]:
    """A stand-in for `python -m pip`: records its arguments, prints on stdout and stderr, exits 0 or 1."""
    argv = tmp_path / "argv.txt"
    script = tmp_path / "python"
    last = (
        'echo "Successfully installed dpteach-0.1.0 ninja-1.13.0"; exit 0'
        if ok
        else "echo \"ERROR: Could not find a tag or branch 'nope' (stand-in pip)\" >&2; exit 1"
    )
    script.write_text(
        "#!/bin/sh\n"
        f'printf "%s\\n" "$@" > "{argv}"\n'
        'echo "Collecting dpteach (stand-in pip)"\n'
        'echo "  Cloning the course repository (stand-in pip)" >&2\n'
        f"{last}\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script, argv


@pytest.fixture
def colab(monkeypatch):
    """Install a stand-in ``google.colab``; yields the list of widget-manager calls."""
    calls: list[str] = []
    google = types.ModuleType("google")
    colab_mod = types.ModuleType("google.colab")
    output = types.ModuleType("google.colab.output")
    output.enable_custom_widget_manager = lambda: calls.append("enable_custom_widget_manager")
    colab_mod.output = output
    google.colab = colab_mod
    monkeypatch.setitem(sys.modules, "google", google)
    monkeypatch.setitem(sys.modules, "google.colab", colab_mod)
    monkeypatch.setitem(sys.modules, "google.colab.output", output)
    return calls


def test_on_colab_pip_output_is_shown_and_widgets_are_turned_on(colab, tmp_path, monkeypatch, capsys):
    pip, argv = fake_pip(tmp_path, ok=True)
    monkeypatch.setattr(sys, "executable", str(pip))
    exec(compile(committed_setup_cell(), "setup-cell", "exec"), {})
    out = capsys.readouterr().out
    # pip's stdout and stderr both reach the notebook, in order, after the cell's own first line
    lines = [line for line in out.splitlines() if line.strip()]
    assert lines[0] == f"Installing dpteach {VERSION} from {REPOSITORY} ..."
    assert lines[1:4] == [
        "Collecting dpteach (stand-in pip)",
        "  Cloning the course repository (stand-in pip)",
        "Successfully installed dpteach-0.1.0 ninja-1.13.0",
    ]
    assert lines[-1] == f"dpteach {VERSION} is installed."
    args = argv.read_text().splitlines()
    assert args[:3] == ["-m", "pip", "install"]
    assert f"dpteach @ git+{REPOSITORY}@{RELEASE}" in args  # the release tag, from the one source of truth
    assert "ninja" in args  # chapter 10 compiles with ninja, which Colab lacks
    assert colab == ["enable_custom_widget_manager"]


def test_on_colab_a_failed_pip_says_what_happened_and_what_to_do(colab, tmp_path, monkeypatch, capsys):
    pip, _ = fake_pip(tmp_path, ok=False)
    monkeypatch.setattr(sys, "executable", str(pip))
    with pytest.raises(RuntimeError) as raised:
        exec(compile(committed_setup_cell(), "setup-cell", "exec"), {})
    out = capsys.readouterr().out
    assert "ERROR: Could not find a tag or branch 'nope' (stand-in pip)" in out  # pip's own error is visible
    message = str(raised.value)
    assert message.count(". ") == 0 and message.endswith(".")  # one sentence
    assert "could not install dpteach" in message and REPOSITORY in message and RELEASE in message
    assert "run this cell again" in message  # what to do
    assert colab == []  # nothing after the failed install ran


def test_elsewhere_the_cell_does_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    pip, argv = fake_pip(tmp_path, ok=True)
    monkeypatch.setattr(sys, "executable", str(pip))
    exec(compile(committed_setup_cell(), "setup-cell", "exec"), {})
    assert capsys.readouterr().out == ""
    assert not argv.exists()  # pip never ran


@pytest.mark.parametrize("ok", [True, False], ids=["pip-succeeds", "pip-fails"])
def test_in_a_jupyter_kernel_the_learner_sees_pip(tmp_path, ok):
    """The same cell in a real kernel: pip's lines arrive as the cell's stream output, not lost."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    pip, _ = fake_pip(tmp_path, ok=ok)
    stand_in = f"""\
import sys, types
google, colab, output = (types.ModuleType(n) for n in ("google", "google.colab", "google.colab.output"))
output.enable_custom_widget_manager = lambda: print("[widget manager on]")
colab.output, google.colab = output, colab
sys.modules.update({{"google": google, "google.colab": colab, "google.colab.output": output}})
sys.executable = {str(pip)!r}"""
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(stand_in), nbformat.v4.new_code_cell(committed_setup_cell())]
    )
    client = NotebookClient(
        nb, timeout=60, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    if ok:
        client.execute()
    else:
        with pytest.raises(CellExecutionError):
            client.execute()
    outputs = nb.cells[1].outputs
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "Collecting dpteach (stand-in pip)" in text and "Cloning the course repository" in text
    if ok:
        assert "[widget manager on]" in text and f"dpteach {VERSION} is installed." in text
    else:
        assert "ERROR: Could not find a tag" in text
        errors = [o for o in outputs if o.output_type == "error"]
        assert errors and errors[0].ename == "RuntimeError" and "run this cell again" in errors[0].evalue
