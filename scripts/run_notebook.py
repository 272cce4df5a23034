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
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parents[1]


def execute(path: Path, timeout: int = 300) -> tuple[nbformat.NotebookNode, float]:
    """Run every cell of ``path`` in a fresh kernel with the notebook's folder as cwd."""
    nb = nbformat.read(path, as_version=4)
    os.environ.setdefault("TQDM_DISABLE", "1")
    client = NotebookClient(
        nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    start = time.perf_counter()
    client.execute()
    return nb, time.perf_counter() - start


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
