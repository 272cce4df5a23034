"""Chapter 08's thread table: on CPU slots it shows the order the engine ran the nodes in, and that
order is the engine's own rule; without CUDA it adds GPUs' split, run on real threads and labelled as
a simulation (``threads.threads_per_slot``).

The rule, from torch 2.13's ``engine.h`` and ``node.h``: a ready queue pops the node with the highest
sequence number first ("nodes corresponding to ops executed later are the first to be executed in
the backward pass"), AccumulateGrad nodes get the highest number, and a CPU node runs on the thread
that called ``backward()``.
"""

from __future__ import annotations

import contextlib
import heapq
import io
import re
from collections import Counter
from pathlib import Path

import nbformat
import pytest
import torch
from torch import nn

from dpteach.data_parallel import step
from dpteach.measure import threads

ROOT = Path(__file__).resolve().parents[2]
NB = nbformat.read(ROOT / "notebooks" / "08_real_gpus.ipynb", as_version=4)
TAGGED = {tag: c for c in NB.cells for tag in c.metadata.get("tags", [])}


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def engine_order(nodes: list) -> list[int]:
    """The walk indices of ``nodes`` in the order one thread runs them under the engine's rule: of the
    ready nodes, the highest sequence number first; a node is ready once every node feeding it ran."""
    where = {id(n): i for i, n in enumerate(nodes)}
    waiting = {i: 0 for i in range(len(nodes))}
    for n in nodes:
        for fn, _ in n.next_functions:
            if fn is not None:
                waiting[where[id(fn)]] += 1
    ready, order = [(-nodes[0]._sequence_nr(), 0)], []
    while ready:
        _, i = heapq.heappop(ready)
        order.append(i)
        for fn, _ in nodes[i].next_functions:
            if fn is not None:
                j = where[id(fn)]
                waiting[j] -= 1
                if waiting[j] == 0:
                    heapq.heappush(ready, (-fn._sequence_nr(), j))
    return order


def test_the_recorded_order_is_the_engines_rule():
    slots = ["cpu", "cpu"]
    recorded = threads.backward_threads(model(), torch.randn(6, 8), slots)
    assert recorded.roles == {"caller thread"}  # one thread, so the order is fixed
    assert sorted(r.ran for r in recorded.rows) == list(range(1, len(recorded.rows) + 1))
    # the same graph again, without its backward: the order the rule predicts for it
    done = step(model(), torch.randn(6, 8), slots, backward=False)
    nodes = threads.graph_nodes(done.loss.grad_fn)
    rows = {r.index: (r.node, r.replica) for r in recorded.rows}
    predicted = [rows[i] for i in engine_order(nodes)]
    assert predicted == [(r.node, r.replica) for r in recorded.in_order()]  # AccumulateGrads tie: one name


def test_the_table_shows_replica_1s_whole_backward_before_replica_0s():
    recorded = threads.backward_threads(model(), torch.randn(6, 8), ["cpu", "cpu"])
    runs = [run[0].replica for run in recorded.runs()]
    assert runs == ["-", "replica 1", "replica 0", "shared"]  # the loss and gather, 1, 0, then the sum
    table = recorded.table()
    # one line first that says it all: every node, one thread, the caller's; then the order
    first = table.splitlines()[0]
    said = "ran on the caller thread, the one that called backward(), in this order:"
    assert first == f"all {len(recorded.rows)} backward nodes {said}"
    assert table.index("replica 1") < table.index("replica 0")
    assert "loss and gather" in table and "sum onto the model" in table  # the parts in words, no legend
    assert "AccumulateGrad ×4" in table  # one per parameter, the sum onto the model
    assert table == threads.backward_threads(model(), torch.randn(6, 8), ["cpu", "cpu"]).table()


def test_what_gpus_would_show_is_labelled_and_puts_replica_k_on_cuda_k():
    recorded = threads.backward_threads(model(), torch.randn(6, 8), ["cpu"] * 3)
    text = recorded.on_gpus()
    assert text.startswith("on 3 GPUs") and "not run here" in text and "engine source" in text
    parts = r"loss and gather|sum onto the model|replica \d"
    rows = dict(re.findall(rf"^ +\d+  ({parts})\s+autograd thread cuda:(\d)", text, flags=re.M))
    assert rows == {
        "loss and gather": "0", "replica 0": "0", "replica 1": "1", "replica 2": "2", "sum onto the model": "0",
    }  # fmt: skip
    assert "caller thread runs none of them" in text


def test_the_cell_prints_both_and_the_prose_says_which_is_measured():
    scope: dict = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for tag in ("hide-input", "thread-table"):
            exec(compile(TAGGED[tag].source, f"<{tag}>", "exec"), scope)
    printed = out.getvalue()
    if not scope["on_gpu"]:  # the record, then GPUs' split run on real threads, labelled a simulation
        table, simulated = printed.split("simulated on CPU slots:")
        assert "autograd thread" not in table and "caller thread" in table
        assert "slot 1's thread (as cuda:1's)" in simulated and "replica 1" in simulated
    at = NB.cells.index(TAGGED["thread-table"])
    before, after = (" ".join(re.sub(r"<details>.*?</details>", " ", NB.cells[i].source, flags=re.S).split())
                     for i in (at - 1, at + 1))  # fmt: skip
    # the question before the table, and its answer only after it
    assert "**Predict:** whose backward nodes run first" in before and "simulates GPUs' split" in before
    assert "replica 1's forward ran last" not in before.lower()
    assert after.startswith("Replica 1's forward ran last, so its whole backward comes first")


def test_the_simulated_split_runs_each_replica_on_its_slots_thread_and_sums_as_backward_does():
    """threads_per_slot: real threads, one per slot; the caller runs no node; the gradients are the ones
    ``loss.backward()`` makes; and the counts per thread are the engine's rule (``gpu_threads``)."""
    x = torch.randn(6, 8)
    simulated = threads.threads_per_slot(model(), x, ["cpu"] * 3)
    assert simulated.simulated and "caller thread" not in simulated.roles
    assert simulated.roles == {f"slot {k}'s thread (as cuda:{k}'s)" for k in range(3)}
    by_part = {
        r.replica: {s.thread for s in simulated.rows if s.replica == r.replica} for r in simulated.rows
    }
    assert by_part["replica 2"] == {"slot 2's thread (as cuda:2's)"}
    assert by_part["-"] == by_part["shared"] == by_part["replica 0"] == {"slot 0's thread (as cuda:0's)"}
    recorded = threads.backward_threads(model(), x, ["cpu"] * 3)
    assert {
        k: v for k, v in Counter(r.thread[-9:-3] for r in simulated.rows).items()
    } == recorded.gpu_threads()
    assert sorted((r.node, r.replica) for r in simulated.rows) == sorted(
        (r.node, r.replica) for r in recorded.rows
    )
    mine, theirs = model(), model()
    threads.threads_per_slot(mine, x, ["cpu", "cpu"])
    step(theirs, x, ["cpu", "cpu"])  # the same step, one loss.backward()
    for a, b in zip(mine.parameters(), theirs.parameters()):
        torch.testing.assert_close(a.grad, b.grad)  # the split sums what backward sums
    table = simulated.table()
    assert table.startswith("simulated on CPU slots:") and "not run here" not in table
    with pytest.raises(ValueError, match="two slots or more"):
        threads.threads_per_slot(model(), x, ["cpu"])
