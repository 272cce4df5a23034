"""An ordinary DDP script from a notebook: write it to a file, then run it under torchrun.

Colab has no terminal, so chapter 09 runs ``torchrun`` from a cell. torchrun is the module
``torch.distributed.run``; :func:`torchrun` starts it with the kernel's own Python, so the ranks
import the same torch and dpteach as the notebook.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["write_script", "torchrun"]


def write_script(text: str, name: str = "ddp_minimal.py") -> Path:
    """Write ``text`` to ``name`` in the temporary folder; print the terminal command that runs it."""
    path = Path(tempfile.gettempdir()) / name
    path.write_text(text)
    print(f"in a terminal:  torchrun --standalone --nproc-per-node 2 {path}")
    return path


def torchrun(*args: str, timeout: float = 60) -> int:
    """``torchrun --standalone ARGS``, as a terminal would run it; the job's exit status (0: every rank
    finished). The ranks' lines are printed grouped by rank (they arrive in any order); a failed job's
    errors and torchrun's report follow them, as a terminal shows."""
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = run.stdout.splitlines()
    print(*sorted(lines, key=lambda line: line[:6] if line.startswith("rank ") else ""), sep="\n")
    if run.returncode:
        print(run.stderr)
    return run.returncode
