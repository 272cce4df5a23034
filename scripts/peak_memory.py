"""Peak memory of a chapter, as Binder counts it: the kernel and every process it starts.

    python scripts/peak_memory.py notebooks/09_beyond_one_process.ipynb notebooks/10_the_cpp_original.ipynb

Runs each notebook in a fresh kernel (as scripts/run_notebook.py does) while a thread samples the
kernel's whole process tree every 0.1 s: the rank processes of chapter 09, the compiler and ninja of
chapter 10. Chapter 10 gets an empty C++ cache (DPTEACH_CPP_CACHE), so its compile is measured too.
Two sums are reported: RSS (each process's resident memory; counts shared libraries once per process,
an upper bound) and PSS (shared pages split among the processes that map them; what the machine
really holds, and close to what a container's memory limit sees). Writes artifacts/memory.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
MB = 1024 * 1024


class Sampler(threading.Thread):
    """Samples a process and all its children every ``every`` s, from ``watch(pid)`` until ``stop``."""

    def __init__(self, every: float = 0.1):
        super().__init__(daemon=True)
        self.every = every
        self.peak_rss = self.peak_pss = self.peak_kernel = 0
        self.peak_processes = 0
        self.stop = threading.Event()

    def watch(self, pid: int) -> None:
        self.root = psutil.Process(pid)
        self.start()

    def peaks(self) -> dict:
        return {
            "peak_pss_mb": round(self.peak_pss / MB),
            "peak_rss_mb": round(self.peak_rss / MB),
            "peak_kernel_rss_mb": round(self.peak_kernel / MB),
            "peak_processes": self.peak_processes,
        }

    def join(self, timeout: float | None = None) -> None:
        if self.is_alive():
            super().join(timeout)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            rss = pss = 0
            for proc in procs:
                try:
                    info = proc.memory_full_info()
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                rss, pss = rss + info.rss, pss + getattr(info, "pss", info.rss)
                if proc is self.root:
                    self.peak_kernel = max(self.peak_kernel, info.rss)
            self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)
            self.peak_processes = max(self.peak_processes, len(procs))
            self.stop.wait(self.every)


def measure(path: Path, timeout: int = 900) -> dict:
    """Run ``path`` headless (scripts/run_notebook.py) with its memory sampled; the peaks and the time."""
    from run_notebook import execute

    nb, seconds = execute(path, timeout=timeout, memory=True)
    return {"notebook": path.name, "seconds": round(seconds, 1), **nb.metadata["dpteach_memory"]}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=ROOT / "artifacts" / "memory.json")
    args = parser.parse_args()
    os.environ.setdefault("TQDM_DISABLE", "1")
    results = []
    with tempfile.TemporaryDirectory() as cache:
        os.environ["DPTEACH_CPP_CACHE"] = cache  # chapter 10 compiles from scratch, as on a fresh Binder
        for path in args.notebooks:
            result = measure(path.resolve())
            results.append(result)
            print(
                f"{result['notebook']}: peak {result['peak_pss_mb']} MB PSS ({result['peak_rss_mb']} MB RSS summed over "
                f"up to {result['peak_processes']} processes; kernel alone {result['peak_kernel_rss_mb']} MB) "
                f"in {result['seconds']} s",
                flush=True,
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"python": sys.version.split()[0], "cpus": os.cpu_count(), "results": results}, indent=2)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
