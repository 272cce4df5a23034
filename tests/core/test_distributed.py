"""DDP on two gloo processes on loopback (chapter 09): the same mathematics, and no process left behind.

The reference is the same model on one device (STYLE 6): one DDP step must give the single-device
gradients, and so must dpteach's DataParallel. A rank that raises or hangs must reach the caller
as an exception naming it, with every rank process stopped and reaped.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

from dpteach.distributed import (
    RankFailed,
    Ranks,
    RankTimeout,
    data_parallel_gradients,
    loopback,
    single_device_gradients,
)
from dpteach.distributed.compare import dataparallel_traffic
from dpteach.distributed.launch import ENTRY, _environment, task_name
from dpteach.distributed.loopback import GLOO_IFNAME, gloo_on_loopback, loopback_interface
from dpteach.distributed.model import loss_fn, make_data, make_model, sgd_step

pytestmark = pytest.mark.slow  # each group of ranks is two fresh interpreters importing torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ranks():
    with Ranks(2, "gloo", timeout=90) as group:
        yield group.wait_ready()


def rank_children() -> list[int]:
    """PIDs of this process's children that run dpteach's rank entry point (read from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError, ValueError):
            continue  # the process ended while we looked
        if ppid == os.getpid() and ENTRY in cmdline:
            found.append(int(entry.name))
    return found


def assert_no_rank_left(group: Ranks, before: set[int]) -> None:
    """``group``'s ranks are gone; ``before``: rank processes that were running before it started."""
    assert group.alive() == [False] * group.world_size  # every rank process has exited
    for pid in group.pids:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # ... and was reaped: not even a zombie is left
    if Path("/proc/self").exists():
        assert set(rank_children()) <= before  # no new child of ours still runs a rank


def test_ddp_gradients_equal_dataparallel_and_single_device(ranks):
    out = ranks.run("gradients", global_batch=8, seed=3, echo=False)  # the course model, dpteach.course.story
    single = single_device_gradients(global_batch=8, seed=3)
    dp = data_parallel_gradients(global_batch=8, seed=3)
    assert [o["rows"] for o in out] == [4, 4]  # equal shards: each rank saw half the global batch
    assert any(g.abs().sum() > 0 for g in single.values())  # the reference is not trivially zero
    for name, reference in single.items():
        assert torch.equal(
            out[0]["grads"][name], out[1]["grads"][name]
        )  # all-reduce left every rank the same gradient
        assert_close(out[0]["grads"][name], reference)  # DDP's all-reduce mean == one device, whole batch
        assert_close(dp[name], reference)  # DataParallel's mean loss over the gathered batch == one device


def test_unequal_shards_average_per_rank_means(ranks):
    out = ranks.run("gradients", global_batch=8, seed=5, shards=[6, 2], echo=False)
    model = make_model(seed=5)
    x, y = make_data(8, seed=5)
    ((loss_fn(model(x[:6]), y[:6]) + loss_fn(model(x[6:]), y[6:])) / 2).backward()
    single = single_device_gradients(global_batch=8, seed=5)
    for name, p in model.named_parameters():
        assert_close(
            out[1]["grads"][name], p.grad
        )  # DDP averages the two ranks' mean losses, whatever their sizes
    assert any(not torch.allclose(out[0]["grads"][n], single[n]) for n in single)  # so not one device's mean


def test_autograd_grad_under_ddp_is_each_ranks_own_gradient(ranks):
    """Chapter 07: under DDP, torch.autograd.grad returns each rank's own gradient, not the average; the
    backward that follows leaves one averaged .grad on every rank."""
    first, second = ranks.run("autograd_grad", echo=False)
    for rank in (first, second):
        for a, b in zip(rank["first"], rank["own"]):
            assert_close(a, b)  # what the module alone gives on this rank's rows
    assert not all(torch.allclose(a, b) for a, b in zip(first["first"], second["first"]))  # the ranks differ
    for a, b in zip(first["grad"], second["grad"]):
        assert_close(a, b)  # .grad is DDP's average, the same on both ranks


def test_ddp_replicates_nothing_per_step(ranks):
    ddp = ranks.run("traffic", hidden=32, depth=2, global_batch=64, steps=3, echo=False)[0]
    dp = dataparallel_traffic(hidden=32, depth=2, global_batch=64, steps=3)
    n_params = len(list(make_model(32, depth=2).parameters()))
    assert (
        dp["copies_per_step"]["broadcast"] == n_params
    )  # DataParallel copies every parameter to slot 1 each step
    assert ddp["same_parameters"]  # the very same parameter storage after three steps
    assert (
        ddp["allreduce_bytes_per_step"] == dp["parameter_bytes"]
    )  # what travels is one gradient per parameter


def test_train_main_runs_as_a_task(ranks):
    assert ranks.run("dpteach.distributed.train:main", ["--steps", "2"], echo=False) == [
        0,
        0,
    ]  # replicas agree


def test_failing_rank_is_named_and_every_rank_is_stopped():
    before = set(rank_children())
    with Ranks(2, "gloo", timeout=60, preload=()) as group:
        with pytest.raises(RankFailed) as info:
            group.run("fail", on_rank=1)
        assert info.value.rank == 1  # the rank that raised, not rank 0 stuck in its barrier
        assert info.value.exc_type == "ValueError"  # the rank's own exception type, by name
        assert "rank 1 was told to fail" in str(info.value)  # its message reaches the caller
        assert "tasks.py" in info.value.traceback  # with the traceback from inside the rank
        assert_no_rank_left(group, before)
        with pytest.raises(RuntimeError, match="closed"):
            group.run("hello")  # a broken group refuses work instead of hanging


def test_hung_rank_times_out_and_every_rank_is_stopped():
    before = set(rank_children())
    with Ranks(2, "gloo", timeout=60, preload=()) as group:
        group.wait_ready()
        start = time.monotonic()
        with pytest.raises(RankTimeout) as info:
            group.run("hang", on_rank=1, timeout=1.0)
        assert time.monotonic() - start < 10  # the caller got control back, not after the hour of sleep
        assert 1 in info.value.ranks  # the silent rank is named
        assert_no_rank_left(group, before)


def test_tasks_defined_in_a_notebook_are_refused_with_the_reason():
    def in_a_cell():
        pass

    in_a_cell.__module__ = "__main__"  # what a function defined in a notebook cell looks like
    with pytest.raises(ValueError, match="mp.spawn"):
        task_name(in_a_cell)  # refused in the caller, with the reason
    with pytest.raises(AttributeError):
        task_name("no_such_task")  # a typo fails here, before any rank is asked
    name = task_name(single_device_gradients)
    assert name == "dpteach.distributed.model:single_device_gradients"  # an importable function goes by name


def test_torchrun_entry_point():
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "dpteach.distributed.train",
        "--steps",
        "3",
    ]
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    )
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr  # torchrun and both ranks exited cleanly
    assert "world size 2, backend gloo" in done.stdout  # two ranks joined one gloo group
    losses = [float(v) for v in re.findall(r"loss (\d+\.\d+)", done.stdout)]
    model, (x, y), one_device = make_model(), make_data(256), []  # story.train's run, by hand
    for _ in range(3):
        loss = loss_fn(model(x), y)
        one_device.append(loss.item())
        loss.backward()
        sgd_step(model, lr=0.2)  # story.train's SGD step (plain SGD, lr 0.2)
    assert losses == pytest.approx(one_device, abs=2e-6)  # DDP on two ranks traces one device's loss curve
    assert "parameters identical on all 2 ranks: True" in done.stdout  # DDP kept the replicas in step


def test_bucket_order_is_the_same_on_every_run_and_overlaps_from_the_second_step(ranks):
    """DDP's buckets as events, no clock: step 1 one bucket after the last gradient; then the rebuilt
    buckets leave in index order, in reverse parameter order, all but the last before backward ends."""
    from dpteach.distributed import order

    runs = [ranks.run("bucket_order", hidden=256, depth=3, bucket_cap_mb=0.25) for _ in range(2)]
    events = [[s["events"] for s in r["steps"]] for run in runs for r in run]
    assert all(e == events[0] for e in events)  # every run, every rank
    first, second = runs[0][0]["steps"]
    assert all(s["on_caller"] for r in runs[0] for s in r["steps"])  # one thread runs each rank's backward
    assert len({r["pid"] for r in runs[0]}) == 2  # a process per rank
    (only,) = order.overlap(first)
    assert only["nodes"] == [] and only["at"] == len(first["events"]) - 2  # nothing left to overlap
    assert first["events"][-1] == ("wait",)  # then backward waits for it
    rebuilt = order.overlap(second)
    names = [name for name, _ in make_model(256, 3).named_parameters()]
    assert [b["index"] for b in rebuilt] == list(range(len(rebuilt))) and len(rebuilt) > 1
    assert [p for b in rebuilt for p in b["params"]] == [
        n for layer in reversed(range(0, len(names), 2)) for n in (names[layer + 1], names[layer])
    ]  # the order backward produced them: last layer first, each bias before its weight
    assert all(b["nodes"] for b in rebuilt[:-1]) and rebuilt[-1]["nodes"] == []
    cap = int(0.25 * 2**20)
    assert all(b["bytes"] >= cap for b in rebuilt[:-1])  # a bucket closes once it holds its cap


def test_the_bucket_clock_marks_where_backwards_last_node_had_run(ranks):
    """``buckets`` notes when backward's last node had run (an engine callback queued at the last bucket,
    before DDP's finalize_backward): after every gradient and every launch, before backward returns.
    The figure draws it as a dotted line, with the wait from there to the dashed line shaded."""
    import matplotlib

    matplotlib.use("Agg")
    from dpteach.distributed import plots

    for report in ranks.run("buckets", echo=False):
        done = report["nodes_done"]
        assert max(report["ready"].values()) <= done <= report["backward"]
        assert all(b["sent"] <= done for b in report["buckets"])  # every bucket left before the wait
    fig = plots.buckets(report)
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert "backward's last node done" in labels and any(label.startswith("no node left") for label in labels)
    xs = sorted(
        line.get_xdata()[0] for line in fig.axes[0].get_lines() if line.get_linestyle() in (":", "--")
    )
    assert xs == pytest.approx([done * 1e3, report["backward"] * 1e3])


def test_rounds_summary_gives_figures_and_no_verdict():
    from dpteach.distributed.compare import Rounds

    # ratios 0.91x .. 5.05x: the summary reports the median and both ends, read from the rounds
    wide = Rounds(single=(0.91, 1.0, 5.05), ddp=(1.0, 1.0, 1.0), ranks=2)
    text = wide.summary()
    assert "median 1.00x over 3 rounds" in text and "from 0.91x to 5.05x" in text
    assert "DDP on 2 ranks 1000.0 ms" in text and "one process 1000.0 ms" in text  # seconds shown in ms
    # however far apart the rounds are, it passes no judgement on the machine or on either side
    for word in ("busy", "faster", "slower", "wins", "noise", "quiet"):
        assert word not in text.lower(), word


# gloo's network interface. Without GLOO_SOCKET_IFNAME gloo binds to what the host name resolves to,
# which need not be reachable; every rank of Ranks (and of a one-machine torchrun) is on this machine,
# so they get the loopback interface, unless the user named an interface. Checked through the
# environment the rank sees, not through any network's behaviour.


def test_the_loopback_interface_is_found_by_name(monkeypatch):
    expected = {"linux": "lo", "darwin": "lo0"}.get(sys.platform)
    if expected:
        assert loopback_interface() == expected
    for listed, found in (
        ([(1, "lo0"), (2, "en0")], "lo0"),
        ([(1, "lo"), (2, "eth0")], "lo"),
        ([(2, "eth0")], None),
    ):
        monkeypatch.setattr(loopback.socket, "if_nameindex", lambda listed=listed: listed)
        assert loopback_interface() == found

    def cannot_list():
        raise OSError("no interfaces")

    monkeypatch.setattr(loopback.socket, "if_nameindex", cannot_list)
    assert loopback_interface() is None
    env = {}
    assert gloo_on_loopback(env) is None and env == {}  # no loopback found: gloo is left to choose


def test_a_ranks_environment_puts_gloo_on_loopback_unless_the_user_set_an_interface(monkeypatch):
    lo = loopback_interface()
    if lo is None:
        pytest.skip("this machine lists no interface named lo or lo0")
    monkeypatch.delenv(GLOO_IFNAME, raising=False)
    assert _environment(0, 2, 29500, "gloo", 60.0, 1, ())[GLOO_IFNAME] == lo
    monkeypatch.setenv(GLOO_IFNAME, "")  # empty counts as unset, for torch as for us
    assert _environment(0, 2, 29500, "gloo", 60.0, 1, ())[GLOO_IFNAME] == lo
    monkeypatch.setenv(GLOO_IFNAME, "eth7")
    assert _environment(1, 2, 29500, "nccl", 60.0, 1, ())[GLOO_IFNAME] == "eth7"  # the user's value wins


def test_every_rank_sees_the_interface_it_was_given(ranks):
    expected = os.environ.get(GLOO_IFNAME) or loopback_interface()
    assert ranks.run("os:getenv", GLOO_IFNAME, echo=False) == [expected, expected]


def test_a_users_interface_reaches_the_rank_and_gloo_reads_it(monkeypatch):
    monkeypatch.setenv(
        GLOO_IFNAME, "dpteach-none0"
    )  # no such interface: gloo must refuse to create its device
    with Ranks(1, "gloo", timeout=60, preload=()) as group:
        with pytest.raises(RankFailed, match="dpteach-none0"):
            group.wait_ready()


TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.mark.parametrize(
    "given, on_loopback",
    [
        ({}, True),  # run directly: a world of one, on this machine
        ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}, True),  # torchrun on one machine
        ({"RANK": "9", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"}, False),  # two machines: not ours to pick
        ({"RANK": "1", "WORLD_SIZE": "2"}, False),  # another launcher, which says nothing about machines
    ],
)
def test_train_puts_gloo_on_loopback_only_when_every_rank_is_on_this_machine(monkeypatch, given, on_loopback):
    from dpteach.distributed import train

    lo = loopback_interface()
    if lo is None:
        pytest.skip("this machine lists no interface named lo or lo0")
    for name in (*TORCHRUN_VARIABLES, GLOO_IFNAME):
        monkeypatch.delenv(name, raising=False)  # and restored afterwards, whatever train sets
    for name, value in given.items():
        monkeypatch.setenv(name, value)
    train._prepare_environment()
    assert os.environ.get(GLOO_IFNAME) == (lo if on_loopback else None)
    monkeypatch.setenv(GLOO_IFNAME, "eth7")
    train._prepare_environment()
    assert os.environ[GLOO_IFNAME] == "eth7"  # the user's value wins


def test_cpu_rounds_times_the_four_ways_in_turns_and_draws_every_round(ranks):
    """``cpu_rounds`` returns, for every way of running the step, one median per round (no clock is
    checked: only the shape, and that the ratios are the baseline's seconds over each's); the figure draws
    a dot per round per way beside the baseline, and a median bar for each."""
    import matplotlib

    matplotlib.use("Agg")
    from dpteach.distributed import compare, plots

    result = compare.cpu_rounds(ranks, hidden=8, depth=2, global_batch=8, rounds=2, repeats=1)
    assert tuple(result.seconds) == compare.CPU_KINDS and result.baseline == compare.CPU_KINDS[0]
    assert all(len(s) == 2 and all(t > 0 for t in s) for s in result.seconds.values())
    base = result.seconds[result.baseline]
    assert result.ratios("DDP, 2 ranks") == tuple(b / d for b, d in zip(base, result.seconds["DDP, 2 ranks"]))
    lines = result.lines()
    # a heading, a step per way; a heading, a ratio per way beside the baseline, with what its range shows
    assert lines[0].startswith("median step over 2 rounds") and len(lines) == 2 * len(compare.CPU_KINDS) + 1
    readings = lines[len(compare.CPU_KINDS) + 2 :]
    assert len(readings) == 3
    assert all(line.endswith(result.reading(k)) for line, k in zip(readings, compare.CPU_KINDS[1:]))
    fig = plots.cpu_rounds(result)
    ax = fig.axes[0]
    dots = [line for line in ax.get_lines() if line.get_marker() == "o"]
    assert [len(d.get_ydata()) for d in dots] == [2, 2, 2]  # three ways beside the baseline, 2 rounds each
    assert [t.get_text() for t in ax.get_xticklabels()] == list(compare.CPU_KINDS[1:])
