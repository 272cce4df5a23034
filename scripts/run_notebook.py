"""Execute notebooks headless as a learner's kernel would, and report time and errors.

    python scripts/run_notebook.py notebooks/01_the_bug.ipynb [--save DIR]

With --save the executed copy is written to DIR (for looking at outputs); the source notebook
is never modified. Exit status 1 if a cell failed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError
from nbclient.util import run_sync

ROOT = Path(__file__).resolve().parents[1]


def execute(
    path: Path, timeout: int = 300, attempts: int = 2, whole: float | None = None, memory: bool = False
) -> tuple[nbformat.NotebookNode, float]:
    """Run every cell of ``path`` in a fresh kernel with the notebook's folder as cwd.

    ``timeout`` is per cell; ``whole`` bounds the whole run, kernel start included (``timeout`` + 60 s
    unless given). A run that passes either limit is run again from the top in a new kernel, once
    (``attempts=2``): in clean-clone runs a kernel (ipykernel 7.4, jupyter_client 8.10) sometimes sat
    idle while the client waited for a reply that never came, the intermittent hang reported in
    microsoft/vscode-jupyter#17410, and once it did so where nbclient's per-cell timeout did not fire.
    A chapter that really hangs passes a limit twice and fails with ``CellTimeoutError``. The extras now
    pin ipykernel below 7 for that hang (pyproject.toml says why); the second attempt stays for any other.

    With ``memory=True`` a thread samples the kernel's whole process tree while it runs
    (scripts/peak_memory.py says how) and the peaks go to ``nb.metadata["dpteach_memory"]``.
    """
    os.environ.setdefault("TQDM_DISABLE", "1")
    whole = timeout + 60 if whole is None else whole
    for attempt in range(1, attempts + 1):
        nb = nbformat.read(path, as_version=4)
        client = NotebookClient(
            nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
        )
        sampler = _sample_memory(client) if memory else None
        start = time.perf_counter()
        try:
            run_sync(_within)(client, whole)
        except (CellTimeoutError, TimeoutError) as err:
            what = (
                f"a cell waited {timeout} s" if isinstance(err, CellTimeoutError) else f"it ran {whole:.0f} s"
            )
            if attempt == attempts:
                raise CellTimeoutError(f"{path.name}: {what}, twice") from err
            print(
                f"run_notebook: {path.name}: {what}; running it again in a new kernel",
                file=sys.stderr,
                flush=True,
            )
            continue
        finally:
            if sampler is not None:
                sampler.stop.set()
        if sampler is not None:
            sampler.join()
            nb.metadata["dpteach_memory"] = sampler.peaks()
        return nb, time.perf_counter() - start
    raise AssertionError("unreachable")


def _sample_memory(client: NotebookClient):
    """A memory sampler that starts on the kernel's process once nbclient has started it."""
    from peak_memory import Sampler  # beside this script; psutil comes with ipykernel

    sampler = Sampler()
    client.on_notebook_start = lambda notebook: sampler.watch(client.km.provisioner.pid)
    return sampler


async def _within(client: NotebookClient, seconds: float) -> None:
    """``client.execute()`` bounded by a wall clock; on the limit the kernel is shut down as it unwinds.

    nbclient may answer the cancellation with its own error (``DeadKernelError``, once the kernel is
    gone): past the limit, any error is the limit's."""
    start = time.monotonic()
    try:
        await asyncio.wait_for(client.async_execute(), seconds)
    except Exception as err:
        if time.monotonic() - start >= seconds:
            raise TimeoutError from err
        raise


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
