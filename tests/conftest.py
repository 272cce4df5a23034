"""Shared fixtures: seeded runs, CPU slots, and a one-device reference for every comparison."""

from __future__ import annotations

import ast
import os
import re
import shutil

import pytest
import torch

os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("TQDM_DISABLE", "1")


@pytest.fixture
def fresh_checks():
    """``dpteach.course.checks`` with every exercise's hint ladder at its first step, before and after."""
    from dpteach.course import checks

    checks.reset()
    yield checks
    checks.reset()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


# Files whose tests must run in one pytest-xdist worker: they open JupyterLab or the book in Chromium and
# check what the servers left in the repository, so two of them at once would see each other's files.
ONE_WORKER = {"test_browser.py": "jupyterlab", "test_lab_command.py": "jupyterlab"}
# Files whose tests share no module fixture and no state, so any worker may run any of them: the
# chapters' headless runs (tests/executed.py's lock file lets one worker run a chapter while another
# waits for it), the comparisons with torch's own DataParallel, and the runner's hang tests.
ANY_WORKER = {"test_notebooks.py", "test_real_use.py", "test_run_notebook.py"}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    """Each test file is one xdist group (a module's fixtures, such as the book, are built once),
    except the files of ``ANY_WORKER``; then the CUDA skips."""
    for item in items:
        name = item.path.name
        if name not in ANY_WORKER:
            item.add_marker(pytest.mark.xdist_group(ONE_WORKER.get(name, name)))
    _skip_cuda(items)


def _skip_cuda(items):
    has_cuda = torch.cuda.is_available()
    n_gpu = torch.cuda.device_count() if has_cuda else 0
    skip_cuda = pytest.mark.skip(reason="needs a CUDA device (run scripts/gpu_check.sh on a GPU machine)")
    skip_multi = pytest.mark.skip(reason="needs two or more CUDA devices")
    for item in items:
        if "cuda" in item.keywords and not has_cuda:
            item.add_marker(skip_cuda)
        if "multigpu" in item.keywords and n_gpu < 2:
            item.add_marker(skip_multi)


# ------------------------------------------------------------------------------------------------
# Headless Chromium, one for the whole run: the book (test_book.py), JupyterLab (test_browser.py) and
# `make lab` (test_lab_command.py) each open pages in it. Playwright drives Debian's chromium (its own
# browser download is not used); a test that needs it skips, saying why, where either is missing.
# ------------------------------------------------------------------------------------------------
CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
CHROMIUM_FLAGS = [
    "--no-sandbox",  # root in a container has no user namespace for the sandbox
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


@pytest.fixture(scope="session")
def chromium():
    """A Playwright ``Browser``: headless Chromium, started on first use and closed at the end of the run."""
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="needs Playwright for Python: pip install playwright"
    )
    if CHROMIUM is None:
        pytest.skip(
            "needs Chromium: apt-get install chromium (Playwright's own browser download is not used)"
        )
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        yield browser
        browser.close()


def offline(page) -> list[str]:
    """Cut ``page`` off the network: every request that is not file:// or to this machine is refused.

    Returns the list the refused URLs are appended to.
    """
    refused: list[str] = []

    def refuse(route):
        refused.append(route.request.url)
        route.abort()

    page.route(re.compile(r"^(?!https?://(127\.0\.0\.1|localhost)[:/])[a-z]+://(?!/)"), refuse)
    return refused


def parse_source(source: str, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse``, tried again when CPython 3.11 reports a false recursion-depth mismatch.

    CPython 3.11's AST constructor counts its depth in interpreter-wide state (the generated code
    quoted in python/cpython#106905, where the error is reported in threaded programs), so a parse
    running in another thread of this test worker can make a correct parse raise ``SystemError``.
    """
    for _ in range(3):
        try:
            return ast.parse(source, filename=filename)
        except SystemError as error:
            if "recursion depth mismatch" not in str(error):
                raise
            last = error
    raise last
