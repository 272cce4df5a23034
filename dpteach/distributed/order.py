"""Reading the order of one backward (``tasks.bucket_order``, ``tasks.scratch_order``): buckets, what
each could overlap, and what ran before backward had its result.

The events come in the order backward produced them, with no clock, so everything here prints the
same on every run. A bucket's all-reduce is launched at its event; every backward node that starts
after that event is computation the all-reduce could run beside. Whether it does depends on when
backward waits for the result: DDP waits once, at a ``("wait",)`` event after the last node;
``ddp_from_scratch``'s blocking ``all_reduce`` returns at a ``("done", index)`` event before the next
node starts (with gloo, once the sum is back; with NCCL, at once: ``work.wait()`` makes the current
CUDA stream wait for the sum, ahead of the next node's kernels, and holds the CPU only under
``TORCH_NCCL_BLOCKING_WAIT``, ``ProcessGroupNCCL.hpp``). The last bucket is launched after the last gradient, so nothing is left for it to
overlap: its all-reduce is the step's exposed wait. The nodes between a launch and the wait are the
overlap DDP *allows*; whether the all-reduce was still running while they ran is a matter of the clock
(``came_back``), which moves between runs: on one run a bucket can come back before the next node.
"""

from __future__ import annotations

__all__ = [
    "buckets",
    "overlap",
    "in_flight",
    "event_lines",
    "overlap_lines",
    "in_flight_lines",
    "wait_table",
    "came_back_line",
    "grad_order",
    "bucket_params",
    "rebuild_lines",
    "same_on_every_rank",
]


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


def in_flight(step: dict) -> list[dict]:
    """For each bucket: the backward nodes that ran between its launch and the event at which backward
    had its result (its own ``done``, or else the step's ``wait``), and that event's position."""
    events = step["events"]
    out = []
    for b in buckets(step):
        end = next(
            i for i, e in enumerate(events) if i > b["at"] and (e == ("done", b["index"]) or e[0] == "wait")
        )
        at = [i for i in range(b["at"] + 1, end) if events[i][0] == "node"]
        out.append(
            dict(b, ran=[events[i][1] for i in at], ran_at=at, result_at=end, waited=events[end][0] == "wait")
        )
    return out


def in_flight_count(step: dict) -> int:
    """How many backward nodes ran while at least one bucket's all-reduce was in flight (each node
    counted once, however many buckets were in flight while it ran)."""
    return len({i for b in in_flight(step) for i in b["ran_at"]})


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def event_lines(step: dict) -> list[str]:
    """One line per event, numbered: what ran, in order."""
    lines = []
    for i, e in enumerate(step["events"], 1):
        if e[0] == "bucket":
            lines.append(f"{i:3d}  bucket {e[1]} launched: {', '.join(e[2])} ({e[3]:,} bytes)")
        elif e[0] == "done":
            lines.append(f"{i:3d}  bucket {e[1]}'s all_reduce returned")
        elif e[0] == "wait":
            lines.append(f"{i:3d}  backward waits for every bucket's all-reduce")
        elif e[0] == "grad":
            lines.append(f"{i:3d}  gradient ready: {e[1]}")
        else:
            lines.append(f"{i:3d}  backward node:  {e[1]}")
    return lines


def overlap_lines(step: dict) -> list[str]:
    """One line per bucket: its size and the backward work still to run when it is launched."""
    lines = []
    for b in overlap(step):
        work = _count(len(b["nodes"]), "backward node")
        if b["nodes"]:
            work += f" ({', '.join(b['nodes'])})"
        lines.append(
            f"bucket {b['index']} ({_count(len(b['params']), 'tensor')}, {b['bytes']:,} bytes): launched with {work}"
            f" still to run{'; nothing left to overlap' if not b['nodes'] else ''}"
        )
    return lines


def in_flight_lines(step: dict) -> list[str]:
    """One line per bucket: how many backward nodes ran after it left and before backward had its result
    (the overlap the waiting point allows, not when the all-reduce actually finished); then the total."""
    lines = []
    for b in in_flight(step):
        where = "backward waited for it at the end" if b["waited"] else "its all_reduce returned"
        lines.append(
            f"bucket {b['index']} ({', '.join(b['params'])}): {_count(len(b['ran']), 'backward node')}"
            f" ran after it left and before {where}"
        )
    nodes = sum(e[0] == "node" for e in step["events"])
    lines.append(
        f"backward nodes run after a bucket left and before backward had its result: {in_flight_count(step)}"
        f" of {nodes}"
    )
    return lines


def wait_table(steps: dict[str, dict]) -> list[str]:
    """Backward's wait points side by side, one column per named step (say DDP's and
    ``ddp_from_scratch``'s, over the same backward): its buckets, the backward nodes still to run at
    its first and at its last launch, where backward waits for the sums, and how many nodes ran between
    the first launch and backward's wait for that bucket, the nodes during which some bucket was out
    (the overlap the wait allows: ``in_flight_count``); later buckets overlap fewer. Counted from
    events, so it repeats."""
    rows = [("", list(steps))]
    rows.append(("buckets", [str(len(buckets(s))) for s in steps.values()]))
    for which, at in (("first", 0), ("last", -1)):
        left = [str(len(overlap(s)[at]["nodes"])) if buckets(s) else "-" for s in steps.values()]
        rows.append((f"nodes left at the {which} launch", left))
    rows.append(
        (
            "backward waits for a sum",
            [
                "once, after its last node"
                if all(b["waited"] for b in in_flight(s))
                else "before its next node"
                for s in steps.values()
            ],
        )
    )
    rows.append(
        (
            "nodes run between the first launch and its wait",
            [f"{in_flight_count(s)} of {sum(e[0] == 'node' for e in s['events'])}" for s in steps.values()],
        )
    )
    label = max(len(r[0]) for r in rows)
    widths = [max(len(r[1][i]) for r in rows) for i in range(len(steps))]
    return [
        "  ".join([r[0].ljust(label)] + [c.ljust(w) for c, w in zip(r[1], widths)]).rstrip() for r in rows
    ]


def came_back_line(step: dict) -> str:
    """Where each bucket's all-reduce came back, as event counts beside its launch: a clock-like figure
    (``tasks.bucket_order``'s ``came_back``) that moves between runs and ranks."""
    parts = [
        f"bucket {b['index']} left at event {b['at'] + 1}, back after event {step['came_back'][b['index']]}"
        for b in buckets(step)
        if b["index"] in step.get("came_back", {})
    ]
    return "; ".join(parts)


def grad_order(step: dict) -> list[str]:
    """The parameters in the order their gradients became ready in this step's backward."""
    return [e[1] for e in step["events"] if e[0] == "grad"]


def bucket_params(step: dict) -> list[list[str]]:
    """Each bucket's parameters, buckets in launch order: how DDP cut the gradients in this step."""
    return [b["params"] for b in buckets(step)]


def rebuild_lines(steps: list[dict]) -> list[str]:
    """One line per step: its buckets in launch order, each as its parameters, and whether the cut is
    the previous step's. DDP's ``Reducer`` rebuilds its buckets at most once, before the second forward,
    so with the default options step 2's cut differs from step 1's and every later step repeats step 2's."""
    lines, before = [], None
    for n, step in enumerate(steps, 1):
        cut = bucket_params(step)
        same = "" if before is None else ("  (as step before)" if cut == before else "  (rebuilt)")
        lines.append(
            f"step {n}: {_count(len(cut), 'bucket')}: " + " | ".join(", ".join(b) for b in cut) + same
        )
        before = cut
    return lines


def same_on_every_rank(report: list[dict], read=None) -> bool:
    """Whether every rank's steps read the same as rank 0's. ``report`` is a task's answer from every
    rank (``tasks.bucket_order``, ``tasks.scratch_order``), each with its ``steps``; ``read`` takes what
    to compare from one step, by default its events in order (``bucket_params`` compares the cuts)."""
    read = read or (lambda step: step["events"])
    first = [read(step) for step in report[0]["steps"]]
    return all([read(step) for step in rank["steps"]] == first for rank in report[1:])
