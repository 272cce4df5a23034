"""Run every chapter headless for the GPU check: each in a fresh kernel, each saved even when it fails.

    python scripts/gpu_notebooks.py OUTDIR [--cell-timeout 120] [--budget 300] [notebooks ...]

Writes OUTDIR/NAME.ipynb (executed, with outputs up to the failing cell) for every chapter it ran, and
prints one line per chapter (status, seconds, slowest cells) and the error of each failure. A chapter
whose turn comes after ``--budget`` seconds is skipped, not started, and no cell runs past ``--deadline``,
so the whole run stays bounded.
Exit status 1 if any chapter failed or was skipped.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]


def run(path: Path, out: Path, cell_timeout: int) -> tuple[str, float, str]:
    """Execute ``path``; save the executed copy to ``out`` whatever happens; (status, seconds, detail)."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, timeout=cell_timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    start = time.perf_counter()
    status, detail = "ok", ""
    try:
        client.execute()
    except Exception as err:  # CellExecutionError, CellTimeoutError, a dead kernel: keep what ran
        status, detail = f"FAIL ({type(err).__name__})", str(err)[-2500:] or traceback.format_exc()[-2500:]
    seconds = time.perf_counter() - start
    nbformat.write(nb, out / path.name)
    return status, seconds, detail


def slowest(path: Path, n: int = 3) -> str:
    """The ``n`` slowest cells of an executed notebook, from nbclient's timing metadata."""
    from datetime import datetime

    nb = nbformat.read(path, as_version=4)
    times = []
    for i, cell in enumerate(nb.cells):
        t = cell.get("metadata", {}).get("execution", {})
        if "iopub.execute_input" in t and "shell.execute_reply" in t:
            a, b = (
                datetime.fromisoformat(t[k].replace("Z", "+00:00"))
                for k in ("iopub.execute_input", "shell.execute_reply")
            )
            times.append(((b - a).total_seconds(), i))
    return ", ".join(f"cell {i} {s:.1f} s" for s, i in sorted(times, reverse=True)[:n])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("notebooks", nargs="*", type=Path)
    parser.add_argument("--cell-timeout", type=int, default=120, help="seconds one cell may take")
    parser.add_argument(
        "--budget", type=float, default=300.0, help="no chapter starts after this many seconds"
    )
    parser.add_argument(
        "--deadline",
        type=float,
        default=None,
        help="seconds after which no cell may still run (default: budget + cell timeout)",
    )
    args = parser.parse_args()
    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.pop("MPLBACKEND", None)  # figures are drawn inline, as a learner sees them
    chapters = args.notebooks or sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
    args.out.mkdir(parents=True, exist_ok=True)
    start, bad = time.perf_counter(), 0
    deadline = args.deadline if args.deadline is not None else args.budget + args.cell_timeout
    for path in chapters:
        if time.perf_counter() - start > args.budget:
            print(f"SKIP {path.name}: the {args.budget:.0f} s budget is spent", flush=True)
            bad += 1
            continue
        left = deadline - (time.perf_counter() - start)  # a late chapter's cells get only what is left
        status, seconds, detail = run(path, args.out, max(10, int(min(args.cell_timeout, left))))
        print(
            f"{status:<6} {path.name}: {seconds:.1f} s; slowest: {slowest(args.out / path.name)}", flush=True
        )
        if detail:
            bad += 1
            print("    " + detail.replace("\n", "\n    "), flush=True)
    print(
        f"{len(chapters) - bad} of {len(chapters)} chapters ran clean in {time.perf_counter() - start:.0f} s"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
