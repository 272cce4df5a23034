"""A rank's own child processes stop with the rank: after close(), RankTimeout and RankFailed.

Each rank leads a process group of its own (it starts in a new session), so the launcher signals
the group, as torchrun's agent does, and a process the rank started (a DataLoader worker, a shell
command) does not outlive it.
"""

from __future__ import annotations

import os
import textwrap
import time

import pytest

from dpteach.distributed import RankFailed, Ranks, RankTimeout

pytestmark = pytest.mark.slow  # each test starts a rank: a fresh interpreter importing torch

TASKS = textwrap.dedent(
    """
    import subprocess, sys, time

    def spawn():
        # a child that would sleep for ten minutes, in the rank's process group
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]).pid

    def spawn_and_hang():
        spawn_and_report()
        time.sleep(600)

    def spawn_and_fail():
        spawn_and_report()
        raise ValueError("told to fail")

    def spawn_and_report():
        with open(__file__ + ".pid", "w") as f:
            f.write(str(spawn()))
    """
)


@pytest.fixture
def tasks(tmp_path, monkeypatch):
    (tmp_path / "rank_child_tasks.py").write_text(TASKS)
    monkeypatch.syspath_prepend(str(tmp_path))  # the launcher checks the task name by importing it too
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    )
    return tmp_path / "rank_child_tasks.py.pid"


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting for its adopter counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def gone_soon(pid: int) -> bool:
    deadline = time.monotonic() + 5.0  # the child is reaped by whoever adopted it, not by us
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not running(pid)


def test_close_stops_the_children_a_rank_started(tasks):
    with Ranks(1, "gloo", timeout=60, preload=()) as group:
        [pid] = group.run("rank_child_tasks:spawn")
        assert running(pid)
    assert gone_soon(pid)


def test_a_timeout_stops_the_children_a_rank_started(tasks):
    with Ranks(1, "gloo", timeout=60, preload=()) as group:
        group.wait_ready()
        with pytest.raises(RankTimeout):
            group.run("rank_child_tasks:spawn_and_hang", timeout=3.0)
    pid = int(tasks.read_text())
    assert gone_soon(pid)


def test_a_failure_stops_the_children_a_rank_started(tasks):
    with Ranks(1, "gloo", timeout=60, preload=()) as group:
        with pytest.raises(RankFailed, match="told to fail"):
            group.run("rank_child_tasks:spawn_and_fail")
    pid = int(tasks.read_text())
    assert gone_soon(pid)
