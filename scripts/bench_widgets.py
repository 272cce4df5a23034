"""How fast the lab's widgets answer: kernel-side seconds from a change to the redrawn view, medians.

    .venv/bin/python scripts/bench_widgets.py [--repeats 15] [--json out.json]

Each control is driven as a click drives it (``button.click()``, ``slider.value = ...``); the time
covers the model's work and every picture and table the view redraws (ipywidgets sends the new
values to the browser as the callback returns). The browser's own round trip, click to changed
text, is measured by tests/release/test_browser.py (``artifacts/screenshots/report.json``).

The target is 300 ms for the course's model (hidden width 16). Rows marked "course" count towards
it; exit status 1 when one of their medians is over. The machine's load average is printed with
the figures, since a shared machine is noisy: read medians, not single runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

TARGET_MS = 300.0


def timed(action, repeats: int, reset=None) -> list[float]:
    """Milliseconds of ``action()`` ``repeats`` times after one untimed warm-up; ``reset()`` untimed before each."""
    out = []
    for i in range(repeats + 1):
        if reset:
            reset()
        start = time.perf_counter()
        action()
        if i:
            out.append((time.perf_counter() - start) * 1e3)
    return out


def cycle(widget, values):
    """An action that moves ``widget`` to the next of ``values`` each call (every call is a real change)."""
    state = {"i": 0}

    def action():
        state["i"] = (state["i"] + 1) % len(values)
        widget.value = values[state["i"]]

    return action


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args(argv)
    from dpteach import widgets

    n = args.repeats
    explorer = widgets.explorer(strategy="clone", steps=10_000)
    stepper = widgets.gradient_stepper(strategy="rewire", slots=2)
    cost = widgets.cost_explorer(width=16, slots=2)
    rows = [  # (label, counts towards the 300 ms target, samples)
        ("explorer: ▶ step", True, timed(explorer.step_button.click, n)),
        ("explorer: strategy", True, timed(cycle(explorer.strategy, ["rewire", "broadcast", "clone"]), n)),
        ("explorer: slots", True, timed(cycle(explorer.slots, [2, 3, 4]), n)),
        ("explorer: learning rate", True, timed(cycle(explorer.lr, [0.1, 0.2, 0.5]), n)),
        ("explorer: ↺ reset", True, timed(explorer.reset_button.click, n)),
        ("stepper: next ▶", True, timed(stepper.next_button.click, n, reset=lambda: stepper.go(0))),
        ("stepper: slider jump", True, timed(cycle(stepper.position, [0, 10, 5, 15]), n)),
        ("stepper: strategy", True, timed(cycle(stepper.strategy, ["clone", "broadcast", "rewire"]), n)),
        ("stepper: slots", True, timed(cycle(stepper.slots, [3, 2]), n)),
        ("cost: slots (width 16)", True, timed(cycle(cost.slots, [3, 4, 2]), n)),
        ("cost: slots (width 256)", False, []),
        ("cost: slots (width 1024)", False, []),
    ]
    for k, width in ((10, 256), (11, 1024)):
        cost.width.value = width
        rows[k] = (rows[k][0], False, timed(cycle(cost.slots, [3, 4, 2]), max(3, n // 3)))
    explorer.lab.configure(steps=60)
    explorer.reset_button.click()
    run_ms = timed(explorer.run_button.click, 3, reset=explorer.reset_button.click)
    rows.append(("explorer: ▶▶ run (60 steps)", False, run_ms))

    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    print(f"widget response, kernel side, ms (median of {n}; load average {load} on {os.cpu_count()} CPUs)")
    print(f"{'control':<30} {'median':>8} {'min':>8} {'max':>8}  target")
    slow = []
    for label, course, samples in rows:
        med = statistics.median(samples)
        mark = ("ok" if med <= TARGET_MS else "OVER") if course else "-"
        if course and med > TARGET_MS:
            slow.append(label)
        print(f"{label:<30} {med:>8.1f} {min(samples):>8.1f} {max(samples):>8.1f}  {mark}")
    for view in (explorer, stepper, cost):
        assert view.error is None, view.error  # a callback that failed would time nothing real
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "load_average": load,
                    "cpus": os.cpu_count(),
                    "target_ms": TARGET_MS,
                    "rows": [
                        {"control": lb, "course": c, "median_ms": statistics.median(s), "samples_ms": s}
                        for lb, c, s in rows
                    ],
                },
                f,
                indent=1,
            )
    if slow:
        print(f"over {TARGET_MS:.0f} ms: {', '.join(slow)}")
    return 1 if slow else 0


if __name__ == "__main__":
    sys.exit(main())
