"""Each course notebook executed once, its executed copy shared by every test that reads one.

``executed(path)`` runs ``path`` headless (``scripts/run_notebook.execute``, a fresh kernel, as a
learner's) the first time any test asks for it, and hands every later caller the same executed
notebook. The copy is also kept in ``artifacts/notebooks/cache/`` under a key that hashes the
notebook, every file of ``dpteach/``, the runners (this file, scripts/run_notebook.py and
peak_memory.py), the torch and Python versions and the ``DPTEACH_*`` environment; a later run with the same key reads it instead of running the
notebook again. Any edit to a chapter or to the library changes the key, so a stale copy is never
used. ``DPTEACH_NB_CACHE=0`` turns the cross-run cache off (every run executes every notebook once).
A failed run is never stored: the error is raised to every test that asks, in this run only.
Under pytest-xdist (``make test`` runs two or more workers) a lock file per notebook lets one worker
execute it while any other that asks waits, then reads the stored copy: no chapter runs twice.

Who shares it: tests/course/test_notebooks.py (every notebook), tests/exercises/test_exercises.py (the exercises and
solutions notebooks) and tests/release/test_browser.py (it opens the executed copy of every chapter without
widgets and checks how JupyterLab renders it). Chapters with widgets need a live kernel in the page,
so the browser runs those itself; the ipywidgets-7 test runs chapter 12 in the Colab-like kernel,
since that run is what it tests.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "artifacts" / "notebooks" / "cache"
sys.path.insert(0, str(ROOT / "scripts"))
from run_notebook import execute  # noqa: E402

# The chapters that start processes (DDP ranks; the compiler and ninja) have their memory sampled as they
# run, for test_binder.py. Chapter 10 compiles into an empty C++ cache, as on a fresh Binder.
MEMORY_SAMPLED = ("08_real_gpus", "09_beyond_one_process", "10_the_cpp_original")
FRESH_CPP_CACHE = ("10_the_cpp_original",)

CHAPTER_10 = ROOT / "notebooks" / "10_the_cpp_original.ipynb"

_memo: dict[Path, tuple[nbformat.NotebookNode, float, bool] | BaseException] = {}


def course_notebooks(folder: Path = ROOT / "notebooks") -> list[Path]:
    """Every notebook under ``folder``, without JupyterLab's ``.ipynb_checkpoints`` copies (or any hidden folder)."""
    return sorted(
        p
        for p in folder.rglob("*.ipynb")
        if not any(part.startswith(".") for part in p.relative_to(folder).parts)
    )


def source_key(path: Path) -> str:
    """16 hex digits naming what an executed copy of ``path`` depends on."""
    import torch

    h = hashlib.sha256()
    h.update(path.read_bytes())
    for f in sorted((ROOT / "dpteach").rglob("*")):
        if f.is_file() and "__pycache__" not in f.parts:
            h.update(str(f.relative_to(ROOT)).encode())
            h.update(f.read_bytes())
    for runner in ("scripts/run_notebook.py", "scripts/peak_memory.py", "tests/executed.py"):
        h.update((ROOT / runner).read_bytes())
    h.update(f"{torch.__version__} {sys.version}".encode())
    h.update(repr(sorted((k, v) for k, v in os.environ.items() if k.startswith("DPTEACH_"))).encode())
    return h.hexdigest()[:16]


def _kernel_env(path: Path) -> dict[str, str | None]:
    """What the kernel must (not) inherit from pytest; the old values, to put back."""
    changes = {"TQDM_DISABLE": "1", "MPLBACKEND": None}  # conftest's Agg would hide every inline figure
    if path.stem in FRESH_CPP_CACHE:
        changes["DPTEACH_CPP_CACHE"] = tempfile.mkdtemp(prefix="dpteach-cpp-")
    old = {k: os.environ.get(k) for k in changes}
    for k, v in changes.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    return old


def _restore(old: dict[str, str | None]) -> None:
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def stored_copy(path: Path) -> Path:
    """Where ``executed(path)`` keeps the executed copy (under the repository, so JupyterLab can open it)."""
    path = Path(path).resolve()
    return CACHE / f"{path.stem}-{source_key(path)}.ipynb"


def executed(path: Path, timeout: int = 240) -> tuple[nbformat.NotebookNode, float, bool]:
    """``(executed notebook, seconds it took to run, whether it came from an earlier run's cache)``.

    Each caller gets its own deep copy, so one test cannot change what another reads.
    """
    path = Path(path).resolve()
    if path not in _memo:
        _memo[path] = _execute_or_read(path, timeout)
    found = _memo[path]
    if isinstance(found, BaseException):
        raise found
    nb, seconds, cached = found
    return copy.deepcopy(nb), seconds, cached


def chapter_10_first(session) -> None:
    """Run chapter 10 now (or wait for the worker running it) when this session runs it anyway.

    For the tests that load the compiled ``dp_original.cpp`` (``cpp.load()``): chapter 10 compiles it
    into an empty cache, and :func:`_keep_cpp_builds` moves that build into the usual cache, so the
    test then imports it instead of compiling the same source a second time. "Anyway" is when the
    session holds the chapter's headless run, its JupyterLab test or the book; a run of the C++ tests
    alone compiles for itself, as before, and so does a test whose chapter run failed (the chapter's
    own test reports that failure). With ``DPTEACH_NB_CACHE=0`` under pytest-xdist a worker does not
    read another's copy, so the chapter would run once more here: the test compiles instead.
    """
    if os.environ.get("DPTEACH_NB_CACHE", "1") == "0" and os.environ.get("PYTEST_XDIST_WORKER"):
        return
    runs_it = any(
        item.path.name == "test_book.py"
        or (
            CHAPTER_10.name in item.nodeid
            and item.name.startswith(("test_notebook_executes", "test_chapter_in_jupyterlab"))
        )
        for item in session.items
    )
    if runs_it:
        with contextlib.suppress(Exception):
            executed(CHAPTER_10)


def executed_all(paths, timeout: int = 240) -> dict[Path, nbformat.NotebookNode]:
    """``executed(path)[0]`` for every path, run in the order that keeps this worker busy.

    A caller that needs every chapter (the book) would otherwise walk them in the order the chapters'
    own tests do, and wait on each chapter another worker is running. Here it walks them from the last,
    skips a chapter whose lock another worker holds and comes back to it, and waits only when every
    chapter left is held elsewhere.
    """
    left = [Path(p).resolve() for p in reversed(list(paths))]
    while left:
        for path in list(left):
            if path in _memo or _try_lock_free(path):
                executed(path, timeout)
                left.remove(path)
                break
        else:  # every chapter left is running on another worker: wait for the first of them
            executed(left.pop(0), timeout)
    return {Path(p).resolve(): executed(p, timeout)[0] for p in paths}


def _try_lock_free(path: Path) -> bool:
    """Whether no other worker holds ``path``'s lock at this moment (taken and released at once)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{path.stem}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(lock, fcntl.LOCK_UN)
        return True


@contextlib.contextmanager
def _only_one_worker(path: Path):
    """Hold ``path``'s lock file while inside: a second pytest-xdist worker waits here."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{path.stem}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _write(nb: nbformat.NotebookNode, where: Path) -> None:
    """Write ``nb`` whole or not at all: another worker may read ``where`` at any moment."""
    partial = where.with_name(f".{where.name}.{os.getpid()}.partial")
    nbformat.write(nb, partial)
    os.replace(partial, where)


def _keep_cpp_builds(fresh: Path) -> None:
    """Move what chapter 10 compiled in its empty cache into the usual C++ cache, where missing there.

    ``cpp.load()`` imports a cached ``dp_original.cpp`` binary directly, so the tests that load it
    (test_cpp.py and the others) then import the chapter's build instead of compiling the same source
    a second time. Each build folder is moved whole or not at all, and never over one that is there:
    another worker may be compiling into it at this moment.
    """
    from dpteach.cpp import _build

    root = _build.cache_root()
    for folder in sorted(fresh.glob("torch-*")):
        if not folder.is_dir() or (root / folder.name).exists():
            continue
        for lock in ("lock", "dpteach.lock", "dpteach-baton.lock"):  # lock files of that run, not builds
            (folder / lock).unlink(missing_ok=True)
        staged = None
        try:
            root.mkdir(parents=True, exist_ok=True)
            staged = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=root))
            shutil.copytree(folder, staged, dirs_exist_ok=True)
            os.rename(staged, root / folder.name)
        except OSError:  # another process made the folder meanwhile, or the cache is not writable
            if staged is not None:
                shutil.rmtree(staged, ignore_errors=True)


def _execute_or_read(path: Path, timeout: int):
    with _only_one_worker(path):
        return _execute_or_read_unlocked(path, timeout)


def _execute_or_read_unlocked(path: Path, timeout: int):
    key = source_key(path)
    stored = CACHE / f"{path.stem}-{key}.ipynb"
    if os.environ.get("DPTEACH_NB_CACHE", "1") != "0" and stored.exists():
        nb = nbformat.read(stored, as_version=4)
        return nb, float(nb.metadata.get("dpteach_executed", {}).get("seconds", 0.0)), True
    old = _kernel_env(path)
    cpp_cache = os.environ.get("DPTEACH_CPP_CACHE") if path.stem in FRESH_CPP_CACHE else None
    try:
        # under the suite's load a chapter has taken up to 105 s on a slow 2-core machine (chapter 10,
        # compiling into an empty C++ cache): a kernel that hangs is given up on (and the chapter run
        # again, once) after 360 s, not after timeout + 60 s
        limit = min(timeout, 240)
        nb, seconds = execute(path, timeout=limit, whole=360, memory=path.stem in MEMORY_SAMPLED)
    except Exception as err:  # noqa: BLE001 - CellExecutionError and kernel failures alike: remembered, not stored
        return err
    finally:
        _restore(old)
        if cpp_cache:
            _keep_cpp_builds(Path(cpp_cache))
            shutil.rmtree(cpp_cache, ignore_errors=True)
    nb.metadata["dpteach_executed"] = {"seconds": round(seconds, 1), "key": key}
    CACHE.mkdir(parents=True, exist_ok=True)
    for old_copy in CACHE.glob(f"{path.stem}-*.ipynb"):
        old_copy.unlink()  # one copy per notebook: the newest
    _write(nb, stored)
    review = ROOT / "artifacts" / "notebooks" / path.name  # where a reviewer opens it, as before
    _write(nb, review)
    return nb, seconds, False
