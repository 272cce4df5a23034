"""`make test` keeps each test file on one pytest-xdist worker, as the suite needs.

tests/conftest.py marks every test with ``xdist_group(<its file>)`` and the Makefile runs
``--dist loadgroup``. Module fixtures rely on it: test_book.py builds the book once into
artifacts/book/ and test_browser.py starts one JupyterLab. Split over two workers, one worker's
build deletes the pages the other is reading. pytest 9.2.0 broke that grouping without an error
(pytest-dev/pytest-xdist#1386), so this runs a small suite under the same options and the same
conftest hook, and looks at which worker ran each test.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAKEFILE = (ROOT / "Makefile").read_text()
HOOK = (ROOT / "tests" / "conftest.py").read_text()


def test_the_makefile_and_conftest_still_group_by_file():
    assert "--dist loadgroup" in MAKEFILE
    assert "xdist_group(ONE_WORKER.get(name, name))" in HOOK


def test_each_file_runs_on_one_worker(tmp_path):
    (tmp_path / "conftest.py").write_text(
        "import pytest\n\n"
        "@pytest.hookimpl(tryfirst=True)\n"
        "def pytest_collection_modifyitems(config, items):\n"
        "    for item in items:\n"
        "        item.add_marker(pytest.mark.xdist_group(item.path.name))\n"
    )
    for name in ("a", "b"):
        (tmp_path / f"test_{name}.py").write_text(
            "import pytest\n\n@pytest.mark.parametrize('i', range(6))\ndef test_x(i):\n    pass\n"
        )
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    workers: dict[str, set[str]] = {}
    for worker, file in re.findall(r"\[(gw\d+)\] \[\s*\d+%\] PASSED (test_\w+\.py)::", run.stdout):
        workers.setdefault(file, set()).add(worker)
    assert set(workers) == {"test_a.py", "test_b.py"}, run.stdout[-2000:]
    split = {file: sorted(w) for file, w in workers.items() if len(w) > 1}
    assert not split, f"files split over workers (is pytest >= 9.2 installed?): {split}"


def test_the_book_runs_the_chapters_no_other_worker_holds(tmp_path, monkeypatch):
    """tests/executed.py's ``executed_all`` skips a chapter whose lock another worker holds, and waits
    for it only once nothing else is left: the book's worker runs chapters instead of waiting."""
    import fcntl

    sys.path.insert(0, str(ROOT / "tests"))
    import executed as module

    monkeypatch.setattr(module, "CACHE", tmp_path)
    monkeypatch.setattr(module, "_memo", {})
    paths = [tmp_path / f"{name}.ipynb" for name in ("a", "b", "c")]
    ran = []
    monkeypatch.setattr(module, "executed", lambda p, timeout=0: (ran.append(Path(p).stem), ({}, 0, 0))[1])
    with open(tmp_path / "c.lock", "w") as held:  # as if another worker were running chapter c
        fcntl.flock(held, fcntl.LOCK_EX)
        module.executed_all(paths)
    assert ran[:3] == ["b", "a", "c"]  # from the last, c skipped while held, then waited for
