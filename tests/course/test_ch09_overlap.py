"""Chapter 09's overlap evidence: what separates DDP from the hand-written hook is where backward waits.

Both launch all-reduces with backward nodes still to run. DDP's hook returns a future and backward
waits on every bucket once, after its last node (``Reducer::finalize_backward``); the blocking
``all_reduce`` of ``ddp_from_scratch`` returns before the next node starts. Counted from events, with
no clock, so the counts must repeat on every run and every rank.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dpteach.distributed import Ranks, order

ROOT = Path(__file__).resolve().parents[2]


# DDP's shape: two buckets launched while backward runs, one wait at its end
ASYNCHRONOUS = (
    ("node", "A"),
    ("bucket", 0, ["x"], 4),
    ("node", "B"),
    ("node", "C"),
    ("bucket", 1, ["y"], 4),
    ("wait",),
)


def step(events):
    return {"events": events, "on_caller": True}


def test_in_flight_counts_the_nodes_between_a_launch_and_the_result():
    asynchronous = list(ASYNCHRONOUS)
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


def test_the_wait_table_sets_the_wait_points_side_by_side():
    asynchronous = step([("node", "A"), ("bucket", 0, ["x"], 4), ("node", "B"), ("node", "C"), ("wait",)])
    blocking = step([("node", "A"), ("bucket", 0, ["x"], 4), ("done", 0), ("node", "B"), ("node", "C")])
    lines = order.wait_table({"DDP": asynchronous, "ours": blocking})
    assert re.split(r"\s{2,}", lines[0].strip()) == ["DDP", "ours"]
    table = {cells[0]: cells[1:] for cells in (re.split(r"\s{2,}", r) for r in lines[1:])}
    assert table["buckets"] == ["1", "1"]
    assert table["nodes left at the first launch"] == ["2", "2"]  # both launch early ...
    assert table["backward waits for a sum"] == ["once, after its last node", "before its next node"]
    assert table["nodes run between the first launch and its wait"] == [
        "2 of 3",
        "0 of 3",
    ]  # ... only one runs on


def test_one_tensor_is_said_in_the_singular():
    (line,) = order.overlap_lines(step([("bucket", 0, ["x"], 4)]))
    assert line.startswith("bucket 0 (1 tensor, 4 bytes)")


def chapter_cells():
    import nbformat

    return nbformat.read(ROOT / "notebooks" / "09_beyond_one_process.ipynb", as_version=4).cells


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
    # the chapter's verdict on DataParallel quotes these counts: bucket 0 left with K of backward's M nodes
    why = next(c for c in chapter_cells() if "why-ddp" in c.metadata.get("tags", [])).source
    quoted = re.search(r"bucket\s+0\s+left\s+with\s+(\d+)\s+of\s+backward's\s+(\d+)\s+nodes\s+still", why)
    assert quoted, why
    assert (int(quoted[1]), int(quoted[2])) == (len(order.overlap(second)[0]["nodes"]), len(nodes))
    # every bucket but the last is launched with backward nodes still to run, the last after the last node
    assert [bool(b["nodes"]) for b in order.overlap(second)] == [True] * (len(flying) - 1) + [False]
    # the chapter prints these counts as its one table of wait points, from the same data
    table = next(c for c in chapter_cells() if "blocking-order" in c.metadata.get("tags", [])).source
    assert "order.wait_table(" in table and "came_back" not in table  # counted, no clock
    lines = order.wait_table({"DDP": second, "ours": scratch})[1:]
    printed = {cells[0]: cells[1:] for cells in (re.split(r"\s{2,}", line) for line in lines)}
    assert printed["buckets"] == ["3", "8"]  # ours: one per parameter
    assert printed["nodes left at the last launch"] == ["0", "0"]
    assert printed["nodes run between the first launch and its wait"] == [
        f"{order.in_flight_count(second)} of 12",
        "0 of 12",
    ]
    # the clock's figure, off the printed path: each bucket came back after its launch and by the wait
    for run in ddp:
        for r in run:
            s = r["steps"][1]
            assert all(b["at"] < s["came_back"][b["index"]] <= len(s["events"]) for b in order.buckets(s))


def test_rebuild_lines_say_which_step_was_cut_again():
    one = step([("grad", "b"), ("grad", "a"), ("bucket", 0, ["a", "b"], 8), ("wait",)])
    two = step([("grad", "b"), ("bucket", 0, ["b"], 4), ("grad", "a"), ("bucket", 1, ["a"], 4), ("wait",)])
    assert order.grad_order(one) == ["b", "a"]
    assert order.bucket_params(two) == [["b"], ["a"]]
    assert order.rebuild_lines([one, two, two]) == [
        "step 1: 1 bucket: a, b",
        "step 2: 2 buckets: b | a  (rebuilt)",
        "step 3: 2 buckets: b | a  (as step before)",
    ]


def test_same_on_every_rank_compares_each_rank_with_rank_0_step_by_step():
    one = step([("node", "A"), ("bucket", 0, ["x"], 4), ("wait",)])
    other = step([("node", "A"), ("bucket", 0, ["y"], 4), ("wait",)])
    same = [{"steps": [one, one]}, {"steps": [one, one]}]
    assert order.same_on_every_rank(same)
    assert not order.same_on_every_rank([{"steps": [one, one]}, {"steps": [one, other]}])  # step 2 differs
    # read: what to compare; the cuts differ here, the number of buckets does not
    differ = [{"steps": [one]}, {"steps": [other]}]
    assert not order.same_on_every_rank(differ, order.bucket_params)
    assert order.same_on_every_rank(differ, lambda s: len(order.buckets(s)))
    # the clock's came_back is not the order: by default it is not compared
    clocked = dict(one, came_back={0: 2})
    assert order.same_on_every_rank([{"steps": [one]}, {"steps": [clocked]}])


def test_the_traffic_table_counts_per_slot_and_per_rank():
    """Two small tables of what was counted, then the formula's bytes in lines of their own, said to be
    computed. The first table: the bytes one slot or one rank moves in a step, so a learner reads P
    against P: the model into each slot but slot 0 (the column's header says which slots) and the
    gradients each sends (counted: 0 on CPU slots, which sum in place), beside what a DDP rank puts into
    all-reduce (counted); what the backend then sends is "not counted", never a formula in a counted
    column. The second: the whole step, the gathered outputs on a row apart, never mixed into the
    model's bytes (the 516 bytes copied on CPU slots), with the rows whose outputs it moves, and each
    copy call count spelled out. Under them, labelled computed: a ring all-reduce's 2(N-1)P/N per rank
    (at N = 2, where it equals P, its value at N = 4 too), and on CPU slots what separate GPUs would
    send. No footnote marks. A last line says what to read across them."""
    from dpteach.distributed import compare

    dp = dict(
        copies_per_step={"broadcast": 4, "gather": 2},
        bytes_per_step={"broadcast": 260, "gather": 256},
        parameter_bytes=260,
        rows=64,
    )
    ddp = dict(allreduce_calls_per_step=1, allreduce_bytes_per_step=260, same_parameters=True)
    text = compare.traffic_table(dp, ddp, world_size=2)
    rows = text.splitlines()
    assert rows[0] == "one step: N = 2 slots or ranks, P = 260 bytes of parameters"
    per_rank, whole, formula = (block.splitlines() for block in text.split("\n\n")[1:4])
    assert re.split(r"\s{2,}", per_rank[0]) == [
        "counted, bytes per slot/rank",
        "DataParallel, each slot but 0",  # slot 0 holds the model: no copy, nothing sent
        "DDP, each rank",
    ]
    assert re.split(r"\s{2,}", whole[0]) == ["counted, per step", "DataParallel", "DDP, each rank"]
    table = {cells[0]: cells[1:] for cells in (re.split(r"\s{2,}", r) for r in per_rank[1:] + whole[1:])}
    assert rows[-1] == "so: DataParallel alone copies the model in and gathers the outputs, every step"
    assert table["model copied in"] == ["P = 260", "0"]
    # what a DDP rank hands to all-reduce, counted, is one row; what then leaves it is not counted
    assert table["gradients into all-reduce"] == ["-", "P = 260"]
    # on CPU slots the reduce moves nothing, counted; no formula stands in a counted cell
    assert table["gradients sent"] == ["0 (CPU slots)", "not counted"]
    assert not any("2(N-1)" in r for r in per_rank + whole)
    assert max(len(r) for r in rows) <= 80  # narrow enough for a notebook's output
    # the formula's lines say they are computed; at N = 2 the ring sends what the rank put in, and its
    # value at N = 4 shows the two differ; on CPU slots, what separate GPUs would send
    assert formula[0].startswith("computed, not counted: a ring all-reduce of P sends 2(N-1)P/N")
    assert formula[1] == "and receives as much: 260 bytes at N = 2; at N = 4: 390"
    assert formula[2] == "on separate GPUs each DataParallel slot would send its P to slot 0"
    assert table["outputs onto slot 0"] == ["256 bytes (all 64 rows)", "0"]  # the whole batch, not per slot
    assert table["copy calls"] == ["broadcast 4 = 4 params x 1 slot", "all_reduce 1 = 1 bucket"]
    assert whole[-1].split() == ["gather", "2", "=", "1", "per", "slot"]
    assert not any(mark in text for mark in ("†", "*"))  # no footnote marks
    assert "516" not in text and "from all" not in text  # per rank, never a total over the ranks
    # on 4 GPUs the reduce_add is counted per slot, and a ring sends 2 x 3/4 x 260 from each rank
    gpus = dict(
        copies_per_step={"broadcast": 12, "reduce_add": 6, "gather": 4},
        bytes_per_step={"broadcast": 780, "reduce_add": 780, "gather": 192},
        parameter_bytes=260,
    )
    four = compare.traffic_table(gpus, ddp, world_size=4)
    assert re.search(r"gradients into all-reduce\s+-\s+P = 260\n", four)
    assert re.search(r"gradients sent\s+P = 260\s+not counted\n", four)  # counted on GPUs
    assert "and receives as much: 390 bytes at N = 4\n" in four
    assert "at N = 4: 390" not in four and "separate GPUs" not in four  # the formula's own value says it
    assert "broadcast 12 = 4 params x 3 slots" in four and "reduce_add 6 = 2 params x 3 slots" in four
    assert "192 bytes (the whole batch)" in four  # no row count given: none invented


def test_dataparallel_traffic_names_the_rows_its_gather_moved():
    from dpteach.distributed import compare

    counted = compare.dataparallel_traffic(steps=1, global_batch=64)
    assert counted["rows"] == 64 and counted["bytes_per_step"]["gather"] == 64 * 4  # one float per row


def test_ddp_cuts_one_bucket_first_then_rebuilds_once_unless_it_finds_unused_parameters(ranks):
    default = ranks.run("bucket_order", hidden=256, depth=3, bucket_cap_mb=0.25, steps=3)[0]["steps"]
    assert len(order.buckets(default[0])) == 1  # the first step: one bucket, whatever the cap
    # rebuilt from step 1's arrival order, cut at the cap, and then kept
    assert sum(order.bucket_params(default[1]), []) == order.grad_order(default[0])
    assert len(order.buckets(default[1])) == 3 and order.bucket_params(default[2]) == order.bucket_params(
        default[1]
    )
    found = ranks.run(
        "bucket_order",
        hidden=256,
        depth=3,
        bucket_cap_mb=0.25,
        steps=3,
        find_unused_parameters=True,
        echo=False,
    )[0]
    cuts = [order.bucket_params(s) for s in found["steps"]]
    assert found["find_unused_parameters"] and len(cuts[0]) == 3  # capped from the first step ...
    assert cuts[0] == cuts[1] == cuts[2]  # ... and never rebuilt
    assert cuts[0] != order.bucket_params(default[1])  # the reverse of parameters(), cut from its front


def test_ddp_caps_the_first_rebuilt_bucket_at_1_mib_only_while_bucket_cap_mb_is_unset(ranks):
    """The chapter's rule: unset, ``bucket_cap_mb`` is 25 MiB but the first bucket (the gradients ready
    first) closes at ``dist._DEFAULT_FIRST_BUCKET_BYTES``; set by hand, even to 25, every bucket takes it.
    Hidden layers of 512 are 1,050,624 bytes each: the last two layers pass 1 MiB, the whole model does
    not pass 25 MiB, so the two settings cut step 2 differently."""
    import torch.distributed as dist

    first = dist._DEFAULT_FIRST_BUCKET_BYTES
    assert first == 1024 * 1024
    unset = ranks.run("bucket_order", hidden=512, depth=3, bucket_cap_mb=None, steps=2, echo=False)
    given = ranks.run("bucket_order", hidden=512, depth=3, bucket_cap_mb=25, steps=2, echo=False)
    cut = order.buckets(unset[0]["steps"][1])
    assert [b["params"] for b in cut] == [
        ["6.bias", "6.weight", "4.bias", "4.weight"],
        ["2.bias", "2.weight", "0.bias", "0.weight"],
    ]
    # closed by the tensor that took it to 1 MiB or past: 4.weight, 512 x 512 floats
    assert cut[0]["bytes"] >= first > cut[0]["bytes"] - 512 * 512 * 4
    assert len(order.buckets(given[0]["steps"][1])) == 1  # 25 given: the first bucket's cap is 25 MiB too


def test_the_ranks_keep_what_they_printed_in_the_last_run(ranks):
    ranks.run("hello", echo=False)
    assert len(ranks.last_outputs) == 2 and ranks.last_outputs[1].startswith("rank 1 of 2")


def test_the_chapter_shows_the_rebuild_and_checks_the_one_device_losses():
    from pathlib import Path

    import nbformat

    cells = nbformat.read(
        Path(__file__).resolve().parents[2] / "notebooks" / "09_beyond_one_process.ipynb", as_version=4
    ).cells
    tags = [t for c in cells for t in c.metadata.get("tags", [])]
    assert tags.index("bucket-rebuild") < tags.index("bucket-order")  # the cut first, then step 2's events
    rebuild = next(c for c in cells if "bucket-rebuild" in c.metadata.get("tags", []))
    # the learner sees the printed cut; its claims are checked in test_ddp_cuts_one_bucket_first_...
    assert "steps=3" in rebuild.source and "rebuild_lines" in rebuild.source
    # the prediction before it gives the sizes the cut depends on, and they are the task's model's
    from dpteach.distributed import make_model

    before = " ".join(cells[cells.index(rebuild) - 1].source.split())
    assert "bucket_cap_mb=0.25" in before and "hidden=256, depth=3" in rebuild.source
    assert "A 256 by 256 float32 weight is 262,144 bytes, the cap itself" in before
    assert "the other six tensors, 2 KiB or less" in before
    sizes = sorted(p.numel() * p.element_size() for p in make_model(256, 3).parameters())
    assert sizes[-2:] == [262_144, 262_144] == [int(0.25 * 2**20)] * 2  # two weights, each the cap
    assert len(sizes) - 2 == 6 and max(sizes[:-2]) == 2048
    # the one-device losses are checked against what rank 0 printed under torchrun's main()
    losses = next(c for c in cells if c.cell_type == "code" and "one device, step" in c.source)
    assert "ranks.last_outputs" in losses.source and "assert" in losses.source
    # the exact condition of the one-bucket first step is in the chapter (a Going-deeper block)
    prose = " ".join(c.source for c in cells if c.cell_type == "markdown")
    assert "find_unused_parameters=False" in prose and "static_graph=True" in prose
    assert "bucket_cap_mb_list" in prose


def test_the_order_figure_places_each_bucket_among_backwards_nodes_and_reads_no_clock():
    """The chapter's bucket figure is drawn from the order alone: a bar from a bucket's launch to where
    backward has its sum, measured in backward nodes, so two draws of the same events are the same
    picture. A blocking label's bars all have no length and share one row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dpteach.distributed import plots

    ddp = step(list(ASYNCHRONOUS))
    ours = step([("node", "A"), ("bucket", 0, ["x"], 4), ("done", 0), ("node", "B"), ("node", "C")])
    ours["events"] += [("bucket", 1, ["y"], 4), ("done", 1)]

    def bars(fig):  # (left, width, y) of every bar below the top row of nodes
        return sorted((p.get_x(), p.get_width(), p.get_y()) for p in fig.axes[0].patches if p.get_y() > -1)

    first, again = (plots.bucket_order({"DDP": ddp, "ours": ours}) for _ in range(2))
    assert bars(first) == bars(again)
    # DDP's bucket 0 left after node A and waited after node C: 2 nodes; bucket 1, none; ours, none
    widths = [w for _, w, _ in bars(first)]
    assert (
        sorted(widths)
        == [0, 0, 0, 2]
        == sorted(
            [len(b["ran"]) for b in order.in_flight(ddp)] + [len(b["ran"]) for b in order.in_flight(ours)]
        )
    )
    assert [t.get_text() for t in first.axes[0].get_yticklabels()] == [
        "backward",
        "DDP bucket 0",
        "DDP bucket 1",
        "ours",
    ]
    assert "clock" in first.axes[0].get_xlabel()  # "an order, not a clock"
    plt.close("all")


def test_the_order_figure_names_backwards_nodes_in_words():
    """The top row reads without knowing autograd's class names: a Linear, its weight's transpose, Tanh,
    the loss; a node the figure has no words for keeps its op's name."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dpteach.distributed import plots

    names = ["MseLossBackward0", "AddmmBackward0", "TBackward0", "TanhBackward0", "ReluBackward0"]
    s = step([("node", n) for n in names] + [("bucket", 0, ["x"], 4), ("wait",)])
    fig = plots.bucket_order({"DDP": s})
    shown = [t.get_text() for t in fig.axes[0].texts][: len(names)]
    assert shown == ["MSE\nloss", "Linear\nx·Wᵀ+b", "transpose\nof W", "Tanh", "Relu"]
    plt.close(fig)


def test_the_bucket_model_is_printed_before_the_prediction_that_names_its_tensors():
    """The prediction before the bucket cut names tensors (``6.bias``, a 256 by 256 weight): the cell
    before it prints the task's model, ``make_model(256, 3)``, with each tensor's name, shape and bytes."""
    import contextlib
    import io

    from dpteach.distributed import make_model

    cells = chapter_cells()
    tags = [c.metadata.get("tags", []) for c in cells]
    shown = next(i for i, t in enumerate(tags) if "bucket-model" in t)
    rebuild = next(i for i, t in enumerate(tags) if "bucket-rebuild" in t)
    assert shown == rebuild - 2 and cells[rebuild - 1].cell_type == "markdown"  # model, prediction, cut
    assert "make_model(256, 3)" in cells[shown].source
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(cells[shown].source, {"make_model": make_model})
    text = printed.getvalue()
    assert str(make_model(256, 3)) in text  # the module, as the task builds it
    for name, p in make_model(256, 3).named_parameters():  # each name the buckets will list, with its bytes
        line = next(line for line in text.splitlines() if line.split()[:1] == [name])
        assert str(tuple(p.shape)) in line and f"{p.numel() * p.element_size():,} bytes" in line
    assert text.count("262,144 bytes") == 2  # "A 256 by 256 float32 weight is 262,144 bytes"


def test_the_traffic_prose_says_what_the_table_counts_on_cpu_slots():
    """On CPU slots dpteach's DataParallel still copies the model into slot 1 (storage of its own), and
    sums the gradients on slot 0 with no copy: the table's "model copied in" is P, its "gradients
    sent" 0, and the prose under it says both, not that CPU slots send nothing."""
    from dpteach.distributed import compare

    dp = compare.dataparallel_traffic(steps=1, devices=("cpu", "cpu"))
    assert dp["bytes_per_step"]["broadcast"] == dp["parameter_bytes"] == 260  # the model, into slot 1
    assert "reduce_add" not in dp["bytes_per_step"]  # no gradient copied onto slot 0
    ddp = dict(allreduce_calls_per_step=1, allreduce_bytes_per_step=260, same_parameters=True)
    rows = compare.traffic_table(dp, ddp, world_size=2).splitlines()
    assert re.split(r"\s{2,}", next(r for r in rows if r.startswith("model copied in")))[1] == "P = 260"
    sent = re.split(r"\s{2,}", next(r for r in rows if r.startswith("gradients sent")))[1]
    assert sent == "0 (CPU slots)"
    cells = chapter_cells()
    table = next(c for c in cells if c.cell_type == "code" and "compare.traffic_table(" in c.source)
    prose = " ".join(
        re.sub(r"<details>.*?</details>", " ", cells[cells.index(table) + 1].source, flags=re.S).split()
    )
    assert "CPU slots still get the model copied in" in prose and "send no gradients" in prose
    assert "separate GPUs each send $P$ to slot 0" in prose and "send nothing" not in prose
