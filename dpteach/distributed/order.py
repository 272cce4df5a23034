"""Reading the order of one DDP backward (``tasks.bucket_order``): buckets, and what each could overlap.

The events come in the order backward produced them, with no clock, so everything here prints the
same on every run. A bucket's all-reduce is launched at its event; every backward node that starts
after that event is computation the all-reduce can run beside. The last bucket is launched after the
last gradient, so nothing is left for it to overlap: its all-reduce is the step's exposed wait.
"""

from __future__ import annotations

__all__ = ["buckets", "overlap", "event_lines", "overlap_lines"]


def buckets(step: dict) -> list[dict]:
    """The buckets of one step, in launch order: index, parameters, bytes, position among the events."""
    return [
        dict(index=e[1], params=e[2], bytes=e[3], at=i)
        for i, e in enumerate(step["events"])
        if e[0] == "bucket"
    ]


def overlap(step: dict) -> list[dict]:
    """For each bucket: the backward nodes (and gradients) that run after its launch, by name."""
    events = step["events"]
    out = []
    for b in buckets(step):
        later = events[b["at"] + 1 :]
        out.append(
            dict(
                b,
                nodes=[e[1] for e in later if e[0] == "node"],
                grads=[e[1] for e in later if e[0] == "grad"],
            )
        )
    return out


def event_lines(step: dict) -> list[str]:
    """One line per event, numbered: what ran, in order."""
    lines = []
    for i, e in enumerate(step["events"], 1):
        if e[0] == "bucket":
            lines.append(f"{i:3d}  bucket {e[1]} launched: {', '.join(e[2])} ({e[3]:,} bytes)")
        elif e[0] == "grad":
            lines.append(f"{i:3d}  gradient ready: {e[1]}")
        else:
            lines.append(f"{i:3d}  backward node:  {e[1]}")
    return lines


def overlap_lines(step: dict) -> list[str]:
    """One line per bucket: its size and the backward work still to run when it is launched."""
    lines = []
    for b in overlap(step):
        work = f"{len(b['nodes'])} backward node{'s' * (len(b['nodes']) != 1)}"
        if b["nodes"]:
            work += f" ({', '.join(b['nodes'])})"
        lines.append(
            f"bucket {b['index']} ({len(b['params'])} tensors, {b['bytes']:,} bytes): launched with {work}"
            f" still to run{'; nothing left to overlap' if not b['nodes'] else ''}"
        )
    return lines
