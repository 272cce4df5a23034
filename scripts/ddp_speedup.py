"""DDP with 2 gloo ranks of one intra-op thread each against one process of one thread, on CPU.

    PYTHONPATH=$PWD .venv/bin/python scripts/ddp_speedup.py [--hidden 1024] [--rounds 15]

Prints each round's ratio (one process's step time over DDP's) and their median and spread. Run it
on a quiet machine with at least 2 cores: on a shared one the ranks wait for the cores.
"""

from __future__ import annotations

import argparse
import os

from dpteach.distributed import Ranks, compare


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--global-batch", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"cores this process may use: {len(os.sched_getaffinity(0))}; load average: {os.getloadavg()}")
    with Ranks(2, "gloo") as ranks:
        ranks.wait_ready()
        r = compare.ddp_rounds(ranks, args.hidden, args.depth, args.global_batch, args.rounds, args.repeats)
    print("per round:", " ".join(f"{x:.2f}x" for x in r.ratios))
    print(r.summary())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
