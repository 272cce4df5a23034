"""Execute notebooks headless as a learner's kernel would, and report time and errors.

    python scripts/run_notebook.py notebooks/01_the_bug.ipynb [--save DIR]

With --save the executed copy is written to DIR (for looking at outputs); the source notebook
is never modified. Exit status 1 if a cell failed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError

ROOT = Path(__file__).resolve().parents[1]


def execute(path: Path, timeout: int = 300, attempts: int = 2) -> tuple[nbformat.NotebookNode, float]:
    """Run every cell of ``path`` in a fresh kernel with the notebook's folder as cwd.

    ``timeout`` is per cell. A cell that times out is run again from the top in a new kernel, once
    (``attempts=2``): in a clean-clone run, one kernel (ipykernel 7.4, jupyter_client 8.10) sat idle
    while the client waited for a reply that never came, the intermittent hang reported in
    microsoft/vscode-jupyter#17410. A chapter that really hangs times out twice and fails.
    """
    os.environ.setdefault("TQDM_DISABLE", "1")
    for attempt in range(1, attempts + 1):
        nb = nbformat.read(path, as_version=4)
        client = NotebookClient(
            nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
        )
        start = time.perf_counter()
        try:
            client.execute()
        except CellTimeoutError:
            if attempt == attempts:
                raise
            print(
                f"run_notebook: {path.name}: a cell waited {timeout} s; running it again in a new kernel",
                file=sys.stderr,
                flush=True,
            )
            continue
        return nb, time.perf_counter() - start
    raise AssertionError("unreachable")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--save", type=Path, help="folder for the executed copies")
    args = parser.parse_args()
    failed = 0
    for path in args.notebooks:
        try:
            nb, seconds = execute(path)
        except CellExecutionError as err:
            print(f"FAIL {path}: {str(err)[-3000:]}")
            failed += 1
            continue
        print(f"ok   {path}: {seconds:.1f} s")
        if args.save:
            args.save.mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, args.save / path.name)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
