"""Chapter 09's CPU comparison, with more rounds: four ways to run one training step, timed in turns.

    PYTHONPATH=$PWD .venv/bin/python scripts/ddp_speedup.py [--hidden 512] [--global-batch 4096] [--rounds 15]

One process of one intra-op thread, dpteach's DataParallel on two CPU slots (one thread), DDP on 2 gloo
ranks (one thread each) and one process of two intra-op threads (``compare.cpu_rounds``). Prints each
one's median step with its range over the rounds and, beside the first, the median per-round ratio
(the first's step over that one's) with its range. The defaults are the chapter's size. Run it on a
quiet machine with at least 2 cores: on a shared one the ranks and threads wait for the cores, and the
load average printed before and after says how busy it was. ``--png`` also saves the chapter's figure.
"""

from __future__ import annotations

import argparse
import os

from dpteach.distributed import Ranks, compare


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--global-batch", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--png", help="save the figure of every round here")
    args = parser.parse_args()
    print(f"cores this process may use: {len(os.sched_getaffinity(0))}; load average: {os.getloadavg()}")
    with Ranks(2, "gloo") as ranks:
        ranks.wait_ready()
        r = compare.cpu_rounds(ranks, args.hidden, args.depth, args.global_batch, args.rounds, args.repeats)
    print(*r.lines(), sep="\n")
    for kind in compare.CPU_KINDS[1:]:
        print(f"{kind}, per round:", " ".join(f"{x:.2f}x" for x in r.ratios(kind)))
    print(f"load average after: {os.getloadavg()}")
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        from dpteach.distributed import plots

        plots.cpu_rounds(r).savefig(args.png, dpi=100, bbox_inches="tight")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
