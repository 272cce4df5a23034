"""torch's compile lock (the ``lock`` file of FileBaton) never makes a build wait on a dead process.

FileBaton (torch/utils/file_baton.py) creates ``lock`` with O_CREAT | O_EXCL, holds it open while
it compiles, and removes it when done; a waiter sleeps while the file exists, with no time limit.
Here a real FileBaton is held by a child process, which is then killed as a kernel killed
mid-compile would be. Every wait has a timeout, so a regression fails instead of hanging.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch.utils.cpp_extension
import torch.utils.file_baton

from dpteach import cpp
from dpteach.cpp import _build

# A FileBaton owner, loaded from torch's file alone (no `import torch`: it starts in a blink)
HOLD = textwrap.dedent(
    """
    import importlib.util, sys, time
    spec = importlib.util.spec_from_file_location("file_baton", sys.argv[1])
    file_baton = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(file_baton)
    baton = file_baton.FileBaton(sys.argv[2])
    assert baton.try_acquire()
    print("held", flush=True)
    time.sleep(float(sys.argv[3]))
    baton.release()
    """
)


def hold(lock, seconds=120.0):
    """A child process holding torch's baton on ``lock`` for ``seconds``, once it says so."""
    owner = subprocess.Popen(
        [sys.executable, "-c", HOLD, torch.utils.file_baton.__file__, str(lock), str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert owner.stdout.readline().strip() == "held"
    return owner


def kill(owner):
    owner.send_signal(signal.SIGKILL)  # no `finally` runs: the baton's file stays, as after a killed kernel
    owner.wait(timeout=30)


@pytest.mark.skipif(sys.platform == "win32", reason="open files are listed from /proc or lsof")
def test_a_live_owners_baton_stays_and_a_dead_owners_goes(tmp_path):
    lock = tmp_path / "lock"
    owner = hold(lock)
    try:
        assert _build.clear_stale_baton(tmp_path, settle=0.1) is False
        assert lock.exists()  # a compile in progress keeps its lock
    finally:
        kill(owner)
    assert lock.exists()  # the killed owner left it behind
    assert _build.clear_stale_baton(tmp_path, settle=0.1) is True
    assert not lock.exists()
    assert _build.clear_stale_baton(tmp_path, settle=0.1) is False  # nothing left to clear


@pytest.mark.skipif(sys.platform == "win32", reason="open files are listed from /proc or lsof")
def test_build_directory_clears_a_stale_baton(tmp_path, monkeypatch):
    monkeypatch.setenv("DPTEACH_CPP_CACHE", str(tmp_path))
    folder = _build.build_directory("// an edited copy")
    folder.mkdir(parents=True)
    (folder / "lock").touch()  # planted, and closed at once: nobody holds it
    assert _build.build_directory("// an edited copy") == folder
    assert not (folder / "lock").exists()


def run_in_thread(function):
    """Start ``function`` on a thread; the returned dict gets its result under "value"."""
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(value=function()), daemon=True)
    thread.start()
    return thread, result


@pytest.mark.skipif(sys.platform == "win32", reason="open files are listed from /proc or lsof")
def test_a_waiting_build_takes_over_when_the_owner_dies(tmp_path):
    lock = tmp_path / "lock"
    owner = hold(lock)
    baton = _build._guarded_baton()(str(lock))
    thread, result = run_in_thread(baton.try_acquire)
    try:
        thread.join(timeout=3)
        assert thread.is_alive()  # waits while the owner lives
    finally:
        kill(owner)
    thread.join(timeout=60)  # torch's own baton would wait here forever
    assert result.get("value") is True  # this process holds the baton now, and compiles
    baton.release()
    assert not lock.exists()


def test_a_waiting_build_loads_what_a_live_owner_built(tmp_path):
    lock = tmp_path / "lock"
    owner = hold(lock, seconds=1.0)  # releases the baton normally
    thread, result = run_in_thread(_build._guarded_baton()(str(lock)).try_acquire)
    thread.join(timeout=60)
    owner.wait(timeout=30)
    assert result.get("value") is False  # torch then imports what the owner built, as it always did
    assert not lock.exists()


def test_the_guarded_baton_is_torchs_only_during_the_call():
    original = torch.utils.cpp_extension.FileBaton
    with _build._baton_that_notices_a_dead_owner():
        assert issubclass(torch.utils.cpp_extension.FileBaton, original)
        assert torch.utils.cpp_extension.FileBaton is not original
    assert torch.utils.cpp_extension.FileBaton is original  # outside build(), torch is as it came


# Chapter 10's exercise 3 as it is written, on a source that compiles in well under a second (the
# baton and the build folder do not depend on what is compiled)
PING = Path(__file__).parent / "fixtures" / "ping.cpp"
EXERCISE_3 = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from torch.utils.cpp_extension import load_inline
    from dpteach import cpp
    source = Path(sys.argv[1]).read_text()
    folder = cpp.build_directory(source)
    module = load_inline(
        name=cpp.extension_name(source), cpp_sources=[source], no_implicit_headers=True,
        build_directory=str(folder),
    )
    print("ok", module.ping() == 1)
    """
)


@pytest.mark.skipif(sys.platform == "win32", reason="open files are listed from /proc or lsof")
def test_exercise_3s_load_inline_finishes_despite_a_stale_baton(tmp_path, monkeypatch):
    if cpp.compiler() is None or cpp.ninja() is None:
        pytest.skip("no C++ compiler or ninja found: load_inline cannot run")
    monkeypatch.setenv("DPTEACH_CPP_CACHE", str(tmp_path))
    directory = _build.build_directory(PING.read_text())
    directory.mkdir(parents=True)
    lock = directory / "lock"
    owner = hold(lock)
    kill(owner)  # a compile killed midway: the baton's file stays
    env = {**os.environ}
    env["PATH"] = f"{os.path.dirname(cpp.ninja())}{os.pathsep}{env.get('PATH', '')}"  # as load() leaves it
    done = subprocess.run(
        [sys.executable, "-c", EXERCISE_3, str(PING)], env=env, capture_output=True, text=True, timeout=300
    )  # torch alone waits forever here: subprocess.run kills it and raises TimeoutExpired
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "ok True"
    assert not lock.exists()
