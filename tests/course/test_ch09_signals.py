"""Ranks and signals: what a notebook's kernel sends must stop the ranks through the launcher only.

Jupyter's "interrupt", a terminal's Ctrl-C and jupyter_client's kernel shutdown send SIGINT to the
kernel's whole process group. A rank hit while it still imports torch dies with "Fatal Python
error: init_import_site ... KeyboardInterrupt" (every headless run of chapter 09 printed it, from
the fresh ranks of its last cell). So the ranks live in a session of their own: the launcher alone
gets the SIGINT, and stops them itself. And no rank outlives its launcher, even one killed while
its ranks were still starting.

Each launcher here is a separate Python process in a session of its own, so the signals sent to it
and its group never reach pytest.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each launcher imports torch, and its ranks do too

ROOT = Path(__file__).resolve().parents[2]


def launcher(code: str) -> subprocess.Popen:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    )
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # its process group is not pytest's
    )


def running(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie waiting for whoever adopted it does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="reads /proc")
def test_sigint_to_the_launchers_group_reaches_the_launcher_only_and_ctrl_c_still_stops_the_ranks():
    proc = launcher(
        """
        import os, signal
        from dpteach.distributed import Ranks

        got = []
        signal.signal(signal.SIGINT, lambda *_: got.append("SIGINT"))  # an idle kernel lives on
        ranks = Ranks(2, "gloo", timeout=60)  # the ranks now import torch ...
        os.killpg(os.getpgid(0), signal.SIGINT)  # ... when the kernel's group gets SIGINT (shutdown)
        print("ranks answered:", [r["rank"] for r in ranks.run("hello", echo=False)], got, flush=True)

        signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C raises KeyboardInterrupt again
        print("pids", *ranks.pids, flush=True)
        try:
            ranks.run("hang", on_rank=1, seconds=120)  # the test sends Ctrl-C to our group meanwhile
        except KeyboardInterrupt:
            print("interrupted; alive:", ranks.alive(), flush=True)
        """
    )
    try:
        answered = proc.stdout.readline()
        pids = proc.stdout.readline().split()[1:]
        time.sleep(1.0)  # rank 0 waits in the barrier, rank 1 sleeps
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # the ranks lived through the SIGINT sent while they imported; the launcher got it
    assert answered.strip() == "ranks answered: [0, 1] ['SIGINT']", (answered, err)
    assert "Fatal Python error" not in err and "KeyboardInterrupt" not in err, err
    # Ctrl-C in the launcher still stops every rank
    assert out.strip() == "interrupted; alive: [False, False]", (out, err)
    assert len(pids) == 2 and not any(running(int(p)) for p in pids)


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="reads /proc")
def test_ranks_exit_when_their_launcher_is_killed_even_while_they_start():
    proc = launcher(
        """
        from dpteach.distributed import Ranks

        ready = Ranks(2, "gloo").wait_ready()  # in the process group, serving
        starting = Ranks(2, "gloo")  # still importing torch when the launcher dies
        print(*ready.pids, *starting.pids, flush=True)
        import time; time.sleep(600)
        """
    )
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # a killed kernel: no close(), no finalizer
        proc.wait()
    assert len(pids) == 4
    # the ranks are in sessions of their own, so the SIGKILL above did not reach them: they leave
    # by themselves (the ones still starting once they have imported torch, well before their
    # 120 s rendezvous timeout)
    deadline = time.monotonic() + 60
    while any(running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = [p for p in pids if running(p)]
    for p in left:  # leave nothing behind, whatever the verdict
        os.kill(p, signal.SIGKILL)
    assert not left, f"ranks {left} outlived their launcher"
