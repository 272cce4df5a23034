"""Chapter 09's overlap evidence: what separates DDP from the hand-written hook is where backward waits.

Both launch all-reduces with backward nodes still to run. DDP's hook returns a future and backward
waits on every bucket once, after its last node (``Reducer::finalize_backward``); the blocking
``all_reduce`` of ``ddp_from_scratch`` returns before the next node starts. Counted from events, with
no clock, so the counts must repeat on every run and every rank.
"""

from __future__ import annotations

import pytest

from dpteach.distributed import Ranks, order


def step(events):
    return {"events": events, "on_caller": True}


def test_in_flight_counts_the_nodes_between_a_launch_and_the_result():
    asynchronous = [
        ("node", "A"),
        ("bucket", 0, ["x"], 4),
        ("node", "B"),
        ("node", "C"),
        ("bucket", 1, ["y"], 4),
        ("wait",),
    ]
    first, last = order.in_flight(step(asynchronous))
    assert first["ran"] == ["B", "C"] and first["waited"] and first["result_at"] == 5
    assert last["ran"] == [] and last["waited"]
    blocking = [("node", "A"), ("bucket", 0, ["x"], 4), ("done", 0), ("node", "B"), ("bucket", 1, ["y"], 4)]
    blocking.append(("done", 1))
    assert [b["ran"] for b in order.in_flight(step(blocking))] == [[], []]
    assert not any(b["waited"] for b in order.in_flight(step(blocking)))
    lines = order.in_flight_lines(step(asynchronous))
    assert (
        lines[0]
        == "bucket 0 (x): 2 backward nodes ran after it left and before backward waited for it at the end"
    )
    assert lines[-1] == "backward nodes run after a bucket left and before backward had its result: 2 of 3"
    # a node that runs while two buckets are in flight is counted once
    overlapping = [("bucket", 0, ["x"], 4), ("node", "B"), ("bucket", 1, ["y"], 4), ("node", "C"), ("wait",)]
    assert [b["ran"] for b in order.in_flight(step(overlapping))] == [["B", "C"], ["C"]]
    assert order.in_flight_count(step(overlapping)) == 2
    assert (
        "1 backward node ran"
        in order.in_flight_lines(step([("bucket", 0, ["x"], 4), ("node", "B"), ("wait",)]))[0]
    )


def test_came_back_is_printed_beside_each_launch():
    # a bucket back before the next event came back "after" its own launch event: no node ran while it flew
    s = {"events": [("node", "A"), ("bucket", 0, ["x"], 4), ("node", "B"), ("wait",)], "came_back": {0: 2}}
    assert order.came_back_line(s) == "bucket 0 left at event 2, back after event 2"


def test_one_tensor_is_said_in_the_singular():
    (line,) = order.overlap_lines(step([("bucket", 0, ["x"], 4)]))
    assert line.startswith("bucket 0 (1 tensor, 4 bytes)")


@pytest.fixture(scope="module")
def ranks():
    with Ranks(2, "gloo", timeout=90) as group:
        yield group.wait_ready()


def test_ddp_runs_backward_while_buckets_are_in_flight_and_the_hook_version_does_not(ranks):
    ddp = [ranks.run("bucket_order", hidden=256, depth=3, bucket_cap_mb=0.25) for _ in range(2)]
    mine = [ranks.run("scratch_order", hidden=256, depth=3) for _ in range(2)]
    # the events repeat on every run and every rank, for both
    for runs in (ddp, mine):
        events = [[s["events"] for s in r["steps"]] for run in runs for r in run]
        assert all(e == events[0] for e in events)
        assert all(s["on_caller"] for run in runs for r in run for s in r["steps"])
    second, scratch = ddp[0][0]["steps"][1], mine[0][0]["steps"][1]
    # the same backward nodes, in the same order, in both
    nodes = [e for e in second["events"] if e[0] == "node"]
    assert nodes == [e for e in scratch["events"] if e[0] == "node"]
    # ours: every all_reduce is back before the next node; one per parameter
    blocked = order.in_flight(scratch)
    assert len(blocked) == 8 and all(not b["ran"] and not b["waited"] for b in blocked)
    assert any(order.overlap(scratch)[0]["nodes"])  # yet it too launched with backward still to run
    # DDP: one wait, after the last node, and backward nodes ran while buckets were in flight
    assert second["events"][-1] == ("wait",) and [e[0] for e in second["events"]].count("wait") == 1
    flying = order.in_flight(second)
    assert all(b["waited"] for b in flying) and sum(len(b["ran"]) for b in flying) > 0
    assert [len(b["ran"]) for b in flying] == [len(b["nodes"]) for b in order.overlap(second)]
    # each bucket came back after its launch and by the wait, on every rank and run
    for run in ddp:
        for r in run:
            s = r["steps"][1]
            assert all(b["at"] < s["came_back"][b["index"]] <= len(s["events"]) for b in order.buckets(s))
