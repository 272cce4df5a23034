"""Chapter 00: the environment check never fails, and what the chapter says about devices and scatter holds."""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import dpteach
from dpteach.course import env, story

ROOT = Path(__file__).resolve().parents[2]
NAMES = [
    "python",
    "dpteach",
    "torch",
    "devices",
    "memory",
    "dot",
    "graphviz",
    "ipywidgets",
    "matplotlib",
    "tqdm",
    "compiler",
    "ninja",
    "notebook",
]


@pytest.fixture
def local(monkeypatch):
    """A plain local machine: no Colab module, no Binder variables."""
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    monkeypatch.delenv("BINDER_SERVICE_HOST", raising=False)
    monkeypatch.delenv("BINDER_REPO_URL", raising=False)


def test_report_lists_every_item_once(local):
    report = env.check()
    assert [i.name for i in report.items] == NAMES  # one line per thing the course uses, in a fixed order
    assert all(i.status in ("OK", "missing", "warning", "info") for i in report.items)  # four statuses only


def test_text_shows_every_item_and_html_a_row_for_each_that_is_not_ok(local):
    report = env.check()
    text, page = str(report), report._repr_html_()
    oks = page.split("<b>OK</b>", 1)[1] if "<b>OK</b>" in page else ""
    for item in report.items:
        assert (
            item.name in text and item.status in text
        )  # the plain-text form (python -m dpteach) has each line
        if item.status == env.OK:
            assert f"<td>{item.name}</td>" not in page and item.name in oks  # named in one line, no row
        else:
            assert f"<td>{item.name}</td>" in page  # a row that says what was found and how to fix it
    assert repr(report) == text  # a bare `report` in a terminal prints the same table


def test_html_of_a_report_with_everything_ok_is_one_line_and_all_set():
    report = env.Report("local", [env.Item("torch", env.OK, "2.13"), env.Item("dot", env.OK, "graphviz")])
    page = report._repr_html_()
    assert "<table>" not in page and "All set." in page and "torch, dot" in page
    broken = env.Report(
        "local", [env.Item("torch", env.OK, "2.13"), env.Item("dot", env.MISSING, "-", "fix")]
    )
    assert "<td>dot</td>" in broken._repr_html_() and "<td>torch</td>" not in broken._repr_html_()


def test_place_is_local_colab_or_binder(local, monkeypatch):
    assert env.check().place == "local"  # neither marker present
    monkeypatch.setenv("BINDER_SERVICE_HOST", "10.0.0.1")
    assert env.check().place == "Binder"  # Binder sets BINDER_SERVICE_HOST
    monkeypatch.setitem(sys.modules, "google.colab", type(sys)("google.colab"))
    assert env.check().place == "Colab"  # the Colab kernel imports google.colab at start-up; it wins


def test_binder_repo_url_alone_means_binder(local, monkeypatch):
    monkeypatch.setenv("BINDER_REPO_URL", "https://github.com/dpteach/dpteach")
    assert env.where() == "Binder"  # the other Binder marker


def test_missing_dot_is_reported_with_a_fix_not_raised(local, monkeypatch):
    monkeypatch.setattr(env.shutil, "which", lambda name: None)
    report = env.check()
    assert report["dot"].status == "missing" and not report.ok  # missing, and the verdict says so
    assert "install" in report["dot"].fix.lower()  # one sentence on how to get it
    assert "Some parts are missing" in str(report)


def test_fix_sentence_depends_on_the_place(local, monkeypatch):
    monkeypatch.setattr(env.shutil, "which", lambda name: None)
    monkeypatch.setitem(sys.modules, "google.colab", type(sys)("google.colab"))
    assert "!apt-get install" in env.check()["dot"].fix  # on Colab: a cell command


def test_missing_package_is_reported_not_raised(local, monkeypatch):
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # makes `import ipywidgets` raise ImportError
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    report = env.check()
    assert report["ipywidgets"].status == "missing" and "pip install ipywidgets" in report["ipywidgets"].fix
    assert report["matplotlib"].status == "missing"  # each missing piece is its own line


def test_a_probe_that_raises_becomes_a_warning(local, monkeypatch):
    def broken():
        raise RuntimeError("driver exploded")

    monkeypatch.setattr(torch.cuda, "is_available", broken)
    report = env.check()  # must not raise
    assert report["devices"].status == "warning" and "driver exploded" in report["devices"].found
    assert [i.name for i in report.items] == NAMES  # the other items are still there


def test_broken_dot_program_is_a_warning(local, monkeypatch, tmp_path):
    fake = tmp_path / "dot"
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setattr(env.shutil, "which", lambda name: str(fake))
    assert env.check()["dot"].status == "warning"  # found but cannot draw: said, not raised


@pytest.mark.skipif(shutil.which("dot") is None, reason="needs the Graphviz dot program")
def test_working_dot_is_ok(local):
    item = env.check()["dot"]
    assert item.status == "OK" and "graphviz" in item.found.lower()  # `dot -V` names itself


def test_widget_generation_mismatch_is_a_warning(local, monkeypatch):
    pytest.importorskip("ipywidgets")
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "1.1.0")  # a JupyterLab-3-era frontend
    monkeypatch.setattr(sys.modules["ipywidgets"], "__version__", "8.1.0")
    assert env.check()["ipywidgets"].status == "warning"  # ipywidgets 8 needs jupyterlab_widgets 3


def test_devices_item_names_the_default_devices(local):
    found = env.check()["devices"].found
    assert ", ".join(str(d) for d in dpteach.default_devices()) in found  # says which slots, and why


def test_no_gpu_means_two_cpu_slots():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert (
        dpteach.default_devices() == [torch.device("cpu")] * 2
    )  # the chapter's "no GPU: two slots on the CPU"
    found = env.check()["devices"].found  # what is the same as on two GPUs, and what is not
    assert "four moves and autograd graph" in found and "take turns on one thread" in found


@pytest.mark.parametrize(
    "gpus, expected",
    [
        (0, ["cpu", "cpu"]),
        (1, ["cuda:0", "cuda:0"]),
        (2, ["cuda:0", "cuda:1"]),
        (8, [f"cuda:{i}" for i in range(8)]),
    ],
)
def test_default_devices_rule(monkeypatch, gpus, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    assert dpteach.default_devices() == [
        torch.device(d) for d in expected
    ]  # the chapter's three cases, and 8 GPUs
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "Fake GPU")
    item = env.check()["devices"]
    assert item.status in ("OK", "info") and ", ".join(expected) in item.found  # the report says the same


@pytest.mark.parametrize("strategy", list(dpteach.STRATEGIES))
def test_slot1_owns_its_copy_on_the_same_device(strategy):
    model = story.make_model()
    replicas = dpteach.replicate(model, ["cpu", "cpu"], strategy=strategy)
    assert replicas[1][0].weight.data_ptr() != model[0].weight.data_ptr()  # even on the same device


def test_one_step_matches_one_device():
    devices = dpteach.default_devices()
    x, y = story.make_data()
    x, y = x.to(devices[0]), y.to(devices[0])
    reference = story.make_model().to(devices[0])
    F.mse_loss(reference(x), y).backward()
    model = story.make_model().to(devices[0])
    F.mse_loss(dpteach.DataParallel(model, devices)(x), y).backward()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)  # same gradients as one device


@pytest.mark.parametrize("slots", range(1, 9))
def test_scatter_piece_sizes_follow_torch_chunk(slots):
    rows = 10
    per_piece = math.ceil(rows / slots)  # torch.chunk's piece size
    expected = [min(per_piece, rows - i) for i in range(0, rows, per_piece)]
    sizes = [len(p) for p in dpteach.scatter(torch.arange(rows), ["cpu"] * slots)]
    assert sizes == expected  # 4 slots: 3, 3, 3, 1; 8 slots: five pieces of 2 (fewer pieces than slots)


def test_report_prints_as_plain_text_outside_jupyter():
    done = subprocess.run(
        [sys.executable, "-c", "import dpteach.course.env as e; print(e.check())"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "dpteach environment check" in done.stdout  # plain text outside Jupyter
