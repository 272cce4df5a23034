"""How fast each exercise check answers: seconds per ``exercises.check(key, *solution)``, best and median.

    .venv/bin/python scripts/bench_exercises.py [--repeats 3]

A check should be fast enough to run after every edit; the target is under 2 s (best of the repeats,
after one untimed warm-up that loads kernels). Exit status 1 when a check's best time is over it.
This was an assertion in tests/exercises/test_exercises.py; timings live here so a loaded machine cannot fail
a functional test. The machine's load average is printed with the figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dpteach import exercises  # noqa: E402
from dpteach.exercises import solutions as S  # noqa: E402
from dpteach.exercises._records import by_task  # noqa: E402

TARGET_S = 2.0
SOLUTIONS = by_task(S)  # every task's worked answer, named by its record


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"load average: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    over = []
    for key, solution in SOLUTIONS.items():
        exercises.check(key, *solution)  # warm up
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            exercises.check(key, *solution)
            times.append(time.perf_counter() - start)
        print(f"{key:<16} best {min(times):.2f} s  median {statistics.median(times):.2f} s")
        if min(times) >= TARGET_S:
            over.append(key)
    if over:
        print(f"over the {TARGET_S} s target: {', '.join(over)}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
