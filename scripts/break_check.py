"""Break a dozen defining lines of the core, one at a time, in a scratch copy; report which the tests catch.

Each break is (file, the text it replaces, what replaces it, what it breaks). A break whose text is
no longer in the file is reported as "not applied" (the code moved: update the break, do not drop it).
A break counts as caught when the test run fails. Usage:

    python scripts/break_check.py [--only N] [-- PYTEST_ARGS]

The tests run with ``-x -q -m "not notebook and not browser"`` in the scratch copy unless
PYTEST_ARGS are given, so one run of all breaks takes minutes, not the whole suite per break.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

BREAKS = [
    (
        "dpteach/replicate/rewire.py",
        "output.add_(g.to(ctx.destination))",
        "output.copy_(g.to(ctx.destination))",
        "ReduceAdd keeps one replica's gradient instead of the sum",
    ),
    (
        "dpteach/replicate/rewire.py",
        "return tuple(c.detach() for c in copies)",
        "return tuple(c.detach().clone() for c in copies)",
        "(harmless control: must NOT be caught)",
    ),
    (
        "dpteach/functions.py",
        "return (None,) + ReduceAddCoalesced.apply(ctx.input_device, ctx.num_inputs, *grad_outputs)",
        "return (None,) + tuple(g.clone() for g in grad_outputs[: ctx.num_inputs])",
        "Broadcast's backward keeps slot 0's gradient only",
    ),
    (
        "dpteach/functions.py",
        "return (None, None) + Broadcast.apply(ctx.target_gpus, *grad_outputs)",
        "return (None, None) + tuple(g.detach() for g in grad_outputs for _ in ctx.target_gpus)",
        "ReduceAddCoalesced's backward is no longer differentiable (double backward)",
    ),
    (
        "dpteach/comm.py",
        "result = inputs[root] + _moved(first, dest)",
        "result = inputs[root] + 0 * _moved(first, dest)",
        "comm.reduce_add drops the second input",
    ),
    (
        "dpteach/comm.py",
        "pieces = tensor.chunk(len(slots), dim)",
        "pieces = tensor.flip(dim).chunk(len(slots), dim)",
        "comm.scatter reverses the batch",
    ),
    (
        "dpteach/parallel_apply.py",
        "torch.set_grad_enabled(grad_enabled)",
        "torch.set_grad_enabled(True)",
        "grad mode is not carried into the replica threads",
    ),
    (
        "dpteach/parallel_apply.py",
        "stack.enter_context(torch.autocast(kind, dtype=dtype, cache_enabled=cache))",
        "pass",
        "autocast is not carried into the replica threads",
    ),
    (
        "dpteach/replicate/broadcast.py",
        "buffer_copies_not_rg = broadcast_per_slot(buffers_not_rg, devices, True)",
        "buffer_copies_not_rg = [[b.clone() for b in buffers_not_rg] for _ in devices]",
        "slot 0 no longer shares buffers (BatchNorm's running stats lost)",
    ),
    (
        "dpteach/replicate/broadcast.py",
        "param_indices = {p: i for i, p in enumerate(params)}",
        "param_indices = {p: len(params) - 1 - i for i, p in enumerate(params)}",
        "replica parameters land in the wrong places",
    ),
    (
        "dpteach/replicate/rewire.py",
        "outputs = _outputs(node, node.apply(original, *copies), len(copies))",
        "outputs = [c.requires_grad_() for c in copies]",
        "rewire no longer rewires (the #19540 bug comes back)",
    ),
    (
        "dpteach/data_parallel.py",
        "return dp.gather(outputs, dp.output_device)",
        "return dp.gather(outputs[::-1], dp.output_device)",
        "gather concatenates the replicas' outputs in reverse",
    ),
    (
        "dpteach/data_parallel.py",
        "replicas = dp.replicate(dp.module, dp.device_ids[: len(inputs)])",
        "replicas = dp.replicate(dp.module, dp.device_ids[: len(inputs)])[:1] * len(inputs)",
        "every slot runs slot 0's replica",
    ),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", type=int, action="append", help="run only break N (0-based; repeatable)")
    ap.add_argument("--baseline", action="store_true", help="run once with no break: it must pass")
    ap.add_argument("pytest_args", nargs="*")
    args = ap.parse_args()
    pytest_args = args.pytest_args or [
        "-x",
        "-q",
        "-p",
        "no:cacheprovider",
        "-m",
        "not notebook and not browser",
    ]
    rows = []
    breaks = [(BREAKS[0][0], "", "", "no break: the baseline must pass")] if args.baseline else BREAKS
    for n, (rel, old, new, what) in enumerate(breaks):
        if args.only and n not in args.only:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            scratch = Path(tmp) / "copy"
            shutil.copytree(ROOT, scratch, ignore=shutil.ignore_patterns(".venv", "artifacts", "__pycache__"))
            target = scratch / rel
            text = target.read_text()
            if old and old not in text:
                rows.append((n, "not applied", what))
                print(f"[{n}] not applied: {rel} no longer has {old!r}", flush=True)
                continue
            if old:
                target.write_text(text.replace(old, new, 1))
            env = {
                "PYTHONPATH": str(scratch),
                "DPTEACH_NB_CACHE": "0",
                "PATH": os.environ["PATH"],
                "HOME": os.environ.get("HOME", "/root"),
            }
            run = subprocess.run(
                [sys.executable, "-m", "pytest", *pytest_args],
                cwd=scratch,
                env=env,
                capture_output=True,
                text=True,
            )
            caught = run.returncode != 0
            failed = [l for l in run.stdout.splitlines() if l.startswith("FAILED") or l.startswith("ERROR")]
            rows.append((n, "caught" if caught else "MISSED", what))
            print(
                f"[{n}] {'caught' if caught else 'MISSED'}: {what}"
                + (f"  ({failed[0][:120]})" if failed else ""),
                flush=True,
            )
    print()
    for n, verdict, what in rows:
        print(f"{n:2d}  {verdict:11s}  {what}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
