"""Compile ``dp_original.cpp`` once, cache it, and say in one sentence why when it cannot be done.

The build directory is keyed by torch version, Python version and a hash of the source and
flags, so an upgrade of either never loads a stale binary. Two processes (pytest and a notebook)
may compile at once: an OS file lock (``flock``, released by the kernel even when a process is
killed) lets one compile while the other waits, then loads the finished module. A cached binary
is imported directly, so a warm load needs neither the compiler nor ninja.

torch's own lock (``FileBaton``, torch/utils/file_baton.py) is a file named ``lock`` in the build
directory: ``try_acquire`` creates it with ``O_CREAT | O_EXCL`` and keeps the descriptor open,
``release`` closes it and removes the file, and ``wait`` sleeps while the file exists, with no
time limit. A process killed mid-compile never removes it, and every later ``load_inline`` into
that folder waits forever. :func:`clear_stale_baton` removes such a file once no process has it
open; :func:`build_directory` calls it, so a ``load_inline`` into the folder it names (chapter 10's
exercise 3) starts clean, and :func:`build` also clears one whose owner dies while it waits.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import ModuleType

import torch

SOURCE = Path(__file__).with_name("dp_original.cpp")
CFLAGS: list[
    str
] = []  # torch's default is -O0 without -g: the fastest build, and speed is not the point here
# A cold compile's range, said once: load() prints it and chapter 10's prose quotes it (a test checks).
# Measured: 12.7 to 25 s on 2 idle cores, 84 to 147 s fresh on a busy machine; the top is the bar's length.
EXPECTED_SECONDS = (10, 180)


def compiler() -> str | None:
    """The C++ compiler torch.utils.cpp_extension would call (``$CXX`` or ``c++``), or None."""
    return shutil.which(os.environ.get("CXX", "cl" if sys.platform == "win32" else "c++"))


def ninja() -> str | None:
    """The ``ninja`` a build can use, or None: on PATH, in the pip ``ninja`` package, or beside the interpreter.

    A pure lookup: :func:`put_ninja_on_path` is what makes torch (which looks on PATH only) find one
    that is off PATH, such as a ``pip install ninja`` in a venv that is not activated (a kernel
    started as ``.venv/bin/python``)."""
    found = shutil.which("ninja")
    if found:
        return found
    folders = [Path(sys.executable).parent]
    try:
        import ninja as package

        folders.insert(0, Path(package.BIN_DIR))
    except (ImportError, AttributeError):
        pass
    for folder in folders:
        found = shutil.which("ninja", path=str(folder))
        if found:
            return found
    return None


def put_ninja_on_path() -> str | None:
    """Put the folder of :func:`ninja` first on ``PATH`` when it is not there yet (torch looks on PATH only)."""
    found = ninja()
    if found and shutil.which("ninja") is None:
        os.environ["PATH"] = f"{Path(found).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return found


_fallback_root: Path | None = None  # set when the usual cache folder cannot be written


def cache_root() -> Path:
    """``$DPTEACH_CPP_CACHE``, else ``$TORCH_EXTENSIONS_DIR/dpteach``, else ``~/.cache/dpteach/cpp``."""
    if _fallback_root is not None:
        return _fallback_root
    if os.environ.get("DPTEACH_CPP_CACHE"):
        return Path(os.environ["DPTEACH_CPP_CACHE"])
    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        return Path(os.environ["TORCH_EXTENSIONS_DIR"]) / "dpteach"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dpteach" / "cpp"


def source_hash(source: str | None = None) -> str:
    """12 hex digits naming this source, these flags, this torch and this Python."""
    text = SOURCE.read_text() if source is None else source
    key = "\n".join([text, " ".join(CFLAGS), torch.__version__, sys.version])
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def extension_name(source: str | None = None) -> str:
    """The Python module name, unique per source so two versions never clash in one process."""
    return f"dpteach_cpp_{source_hash(source)}"


def build_directory(source: str | None = None) -> Path:
    """Where this source is compiled: one folder per torch version, Python version and source hash.

    A stale torch baton in it (a compile killed midway) is removed first, see :func:`clear_stale_baton`,
    so a ``load_inline(..., build_directory=str(build_directory(source)))`` never waits on a dead process."""
    py = f"py{sys.version_info.major}{sys.version_info.minor}"
    directory = cache_root() / f"torch-{torch.__version__}-{py}-{source_hash(source)}"
    clear_stale_baton(directory)
    return directory


def _holders(path: Path) -> set[int] | None:
    """The ids of the processes that have ``path`` open; None when this system cannot tell.

    Linux: every ``/proc/PID/fd`` entry this user may read; a process of the file's owner that
    cannot be read means "cannot tell". Elsewhere ``lsof`` when there is one. A process on another
    machine (a shared network folder) or in another PID namespace is not seen."""
    try:
        target = path.stat()
    except FileNotFoundError:
        return set()
    if Path("/proc/self/fd").is_dir():
        found = set()
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                owner = entry.stat().st_uid
                descriptors = list(os.scandir(f"/proc/{entry.name}/fd"))
            except FileNotFoundError:  # it exited meanwhile
                continue
            except PermissionError:  # another user's process cannot have created this file ...
                if owner == target.st_uid:  # ... but one of its owner's could hold it
                    return None
                continue
            for fd in descriptors:
                try:
                    seen = os.stat(fd.path)  # follows the link to the open file
                except OSError:
                    continue
                if (seen.st_dev, seen.st_ino) == (target.st_dev, target.st_ino):
                    found.add(int(entry.name))
                    break
        return found
    lsof = shutil.which("lsof")
    if lsof is None:
        return None
    try:  # lsof lists the ids, one a line, and exits 1 when nobody has the file open
        listed = subprocess.run([lsof, "-t", "--", str(path)], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return {int(word) for word in listed.stdout.split() if word.isdigit()}


def _identity(path: Path) -> tuple[int, int, int] | None:
    """Device, inode and change time of ``path`` (None when it is gone): a new file never matches."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino, st.st_ctime_ns


def clear_stale_baton(directory: Path, *, settle: float = 0.5) -> bool:
    """Remove torch's ``lock`` file in ``directory`` when no process holds it; True when one was removed.

    A live owner keeps the file open from ``try_acquire`` to ``release``, so a file nobody has open
    was left by a process that died. ``release`` closes before it removes: the check is made twice,
    ``settle`` seconds apart, on the same file, so that instant is never taken for a death. Two
    processes clearing at once take turns (an OS lock), and each removes only the file it checked.
    Where open files cannot be listed (Windows without ``lsof``) nothing is removed."""
    lock = directory / "lock"
    first = _identity(lock)
    if first is None or _holders(lock) != set():
        return False
    time.sleep(settle)
    try:
        import fcntl
    except ImportError:
        return False
    try:
        handle = open(directory / "dpteach-baton.lock", "a")
    except OSError:  # a folder this user cannot write: torch could not compile there either
        return False
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        if _identity(lock) != first or _holders(lock) != set():
            return False  # released meanwhile, replaced by a live one, or held after all
        try:
            lock.unlink()
        except FileNotFoundError:
            return False
        return True


def _guarded_baton():
    """torch's ``FileBaton`` that, while another process holds the baton, notices when it dies.

    ``try_acquire`` waits as torch's ``wait`` would, and returns False once the owner released
    the baton (torch then loads what it built); when the owner died instead, it clears the file and
    tries again, so this process compiles."""
    from torch.utils.file_baton import FileBaton

    class GuardedBaton(FileBaton):
        def try_acquire(self):
            path = Path(self.lock_file_path)
            while True:
                if super().try_acquire():
                    return True
                checked = time.monotonic()
                while path.exists():
                    time.sleep(self.wait_seconds)
                    if time.monotonic() - checked > 2:  # a /proc scan every 2 s, not every 0.1 s
                        if clear_stale_baton(path.parent):
                            break
                        checked = time.monotonic()
                else:
                    return False  # released by a live owner: what it built is there

    return GuardedBaton


@contextlib.contextmanager
def _baton_that_notices_a_dead_owner():
    """For the ``load_inline`` call inside: torch looks ``FileBaton`` up in its module at each call."""
    import torch.utils.cpp_extension as cpp_extension

    original = cpp_extension.FileBaton
    cpp_extension.FileBaton = _guarded_baton()
    try:
        yield
    finally:
        cpp_extension.FileBaton = original


def _binary() -> Path | None:
    """The compiled module in the cache, or None."""
    directory = build_directory()
    return next((f for ext in (".so", ".pyd") if (f := directory / (extension_name() + ext)).exists()), None)


def is_cached() -> bool:
    """True when the compiled module is already in the cache: loading takes a second, not a compile's EXPECTED_SECONDS."""
    return _binary() is not None


def _import(path: Path) -> ModuleType:
    """Import a cached binary directly: no compiler and no ninja needed once it is built."""
    spec = importlib.util.spec_from_file_location(extension_name(), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def _exclusive(directory: Path, on_wait=None):
    """One compiler per build directory across processes; the OS drops the lock if we die.

    ``on_wait()`` is called once when another process holds the lock, before this one waits for it."""
    try:
        import fcntl
    except ImportError:  # Windows: torch's own baton file is all there is
        yield
        return
    with open(directory / "dpteach.lock", "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another process is compiling (build_in_background, another kernel)
            if on_wait is not None:
                on_wait()
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            # torch's baton may still be held by a load_inline outside this lock (chapter 10,
            # exercise 3, in another kernel): only a dead owner's is removed
            clear_stale_baton(directory)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _ticking(label: str, expected: int):
    """A tqdm bar counting seconds while the compiler runs (silent when tqdm is missing or disabled)."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def bar():
        done = threading.Event()
        with tqdm(total=expected, desc=label, bar_format="{desc}: {bar} {elapsed}") as progress:

            def tick():
                while not done.wait(0.5):
                    progress.n = min(expected - 1, int(progress.format_dict["elapsed"]))
                    progress.refresh()

            ticker = threading.Thread(target=tick, daemon=True)
            ticker.start()
            try:
                yield
            finally:
                done.set()
                ticker.join()
                progress.n = expected
                progress.refresh()

    return bar()


def header_options(load_inline) -> dict:
    """``no_implicit_headers=True`` where ``load_inline`` takes it (torch 2.8 and newer), else nothing.

    The option skips the implicit ``#include <torch/extension.h>``; the source includes what it
    needs, so on an older torch it compiles the same, only more slowly."""
    import inspect

    return (
        {"no_implicit_headers": True}
        if "no_implicit_headers" in inspect.signature(load_inline).parameters
        else {}
    )


def build(*, progress: bool = True, verbose: bool = False) -> ModuleType:
    """Compile (or load from the cache) ``dp_original.cpp``; raises when the compiler fails."""
    global _fallback_root
    directory = build_directory()
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError:  # a read-only home: fall back to the temporary folder, one per user
        user = os.getuid() if hasattr(os, "getuid") else os.environ.get("USERNAME", "user")
        _fallback_root = Path(tempfile.gettempdir()) / f"dpteach-cpp-{user}"
        directory = build_directory()
        directory.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    waited = []

    def waiting():
        waited.append(True)
        if progress:
            print(f"waiting for another process that is compiling {SOURCE.name} (build_in_background)…")

    with _exclusive(directory, waiting):  # if another process is compiling, this waits for it
        binary = _binary()
        cold = binary is None
        if binary is not None:
            try:
                module = _import(binary)
            except ImportError:  # a binary cut short (a machine that died mid-link): build it again
                binary.unlink()
                cold = True
        if cold:
            from torch.utils.cpp_extension import load_inline

            put_ninja_on_path()  # the one place PATH changes: right before torch runs ninja

            if progress:
                print(
                    f"compiling {SOURCE.name} (only the first time, about {EXPECTED_SECONDS[0]} to {EXPECTED_SECONDS[1]} s; "
                    "later it loads from the cache)…"
                )
            ticking = _ticking("compiling", EXPECTED_SECONDS[1]) if progress else contextlib.nullcontext()
            with ticking, _baton_that_notices_a_dead_owner():
                module = load_inline(
                    name=extension_name(),
                    cpp_sources=[SOURCE.read_text()],
                    **header_options(
                        load_inline
                    ),  # the source includes what it needs, less than torch/extension.h
                    extra_cflags=CFLAGS,
                    build_directory=str(directory),
                    verbose=verbose,
                )
    if progress:
        seconds = time.perf_counter() - start
        how = (
            "compiled"
            if cold
            else "compiled by the other process, loaded"
            if waited
            else "loaded from the cache"
        )
        print(f"{how} in {seconds:.1f} s ({directory})")
    return module


_background: list[subprocess.Popen] = []  # build_in_background's processes, kept so their exits are collected


def build_in_background() -> bool:
    """Start compiling ``dp_original.cpp`` in a second process and return at once; True when it started.

    :func:`build` (``load()``) then waits for that process on the OS lock and imports what it built,
    so the compile runs while the notebook does something else: chapter 10 compiles its hello
    extension meanwhile, on a second core. Nothing starts when the module is cached, when no
    compiler or ninja is found (``load()`` then says why), or while an earlier one still runs. If
    that process fails, ``load()`` compiles again itself and reports the compiler's error."""
    if any(process.poll() is None for process in _background):
        return False
    _background.clear()
    if is_cached() or compiler() is None or put_ninja_on_path() is None:
        return False
    here = str(Path(__file__).resolve().parents[2])  # the folder holding dpteach: the child imports this copy
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))}
    child = "from dpteach.cpp import _build; _build.build(progress=False)"
    process = subprocess.Popen(
        [sys.executable, "-c", child], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    # reap it the moment it exits: a child left unreaped delayed the kernel's shutdown by about 2.5 s
    threading.Thread(target=process.wait, daemon=True).start()
    _background.append(process)
    return True
