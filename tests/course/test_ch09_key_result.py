"""Chapter 09 shows its key result early, and what it prints is what its prose says.

The key result: on every rank, DDP's gradients are one device's to rounding, and the ranks hold
identical tensors. It is the code cell tagged ``key-result``, among the chapter's first five cells,
after the list of what the learner will be able to do. Its printed comparison comes from
``dpteach.distributed.compare``, whose helpers are checked here against their own definitions.
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import nbformat
import pytest
import torch

from dpteach.distributed import compare, single_device_gradients

CHAPTER = Path(__file__).resolve().parents[2] / "notebooks" / "09_beyond_one_process.ipynb"


def cells():
    return nbformat.read(CHAPTER, as_version=4).cells


def key_result():
    nb = cells()
    at = [i for i, c in enumerate(nb) if "key-result" in c.metadata.get("tags", [])]
    assert len(at) == 1, f"cells tagged 'key-result': {at}"
    return nb, at[0]


def test_the_key_result_is_among_the_first_five_cells_after_what_the_learner_will_be_able_to_do():
    nb, at = key_result()
    assert at < 5 and nb[at].cell_type == "code", f"the key result is cell {at}"
    opening = " ".join(c.source for c in nb[:at] if c.cell_type == "markdown")
    assert re.search(r"you can:\n\n- ", opening)  # what the learner will be able to do comes first, as a list
    assert "## The key result" in opening  # and the result is announced as such
    assert "against_one_device" in nb[at].source  # printed with its provenance, by compare.py


@pytest.mark.slow  # the cell starts the chapter's ranks: fresh interpreters importing torch
def test_the_key_results_output_is_what_the_prose_says():
    nb, at = key_result()
    prose = " ".join(nb[at + 1].source.split())
    assert nb[at + 1].cell_type == "markdown"
    # what the cell prints, not a tolerance it does not print
    assert "the printed gap is a float32 step or two" in prose and "the ranks agree bit for bit" in prose
    assert "1e-6" not in prose
    printed, scope = io.StringIO(), {}
    try:
        with contextlib.redirect_stdout(printed):
            exec(nb[at].source, scope)  # the cell as a learner runs it
    finally:
        if "ranks" in scope:
            scope["ranks"].close()
    header, *lines = printed.getvalue().strip().splitlines()
    world, batch, out = scope["world_size"], scope["global_batch"], scope["out"]
    backend, device = out[0]["backend"], out[0]["device"]
    rows = " + ".join([str(batch // world)] * world)
    assert (
        header == f"DDP on {world} ranks ({backend}, {device}), {rows} rows, "
        f"against one device (cpu), all {batch} rows:"
    )
    assert len(lines) == 2 * world - 1
    reference = single_device_gradients(batch)  # the reference again, computed here
    for rank, line in enumerate(lines[:world]):
        own = max((out[rank]["grads"][n] - g).abs().max().item() for n, g in reference.items())
        if own == 0:
            assert line == f"  DDP, rank {rank} and one device: identical, bit for bit"
            continue
        found = re.fullmatch(
            rf"  largest \|DDP, rank {rank} - one device\|: (\S+) \(in \S+\), ([12]) float32 steps? there",
            line,
        )
        assert found, line  # "a float32 step or two"
        assert float(found[1]) == pytest.approx(own, rel=0.05)  # printed to two figures
        assert own < 1e-6  # rounding only: far below the 6 + 2 split's gap
    for rank, line in enumerate(lines[world:], 1):
        assert line == f"  rank 0 and rank {rank}: identical, bit for bit"  # "the ranks agree bit for bit"
        assert all(torch.equal(out[0]["grads"][n], out[rank]["grads"][n]) for n in reference)


# each section of the chapter (its ``## `` heading, up to the summary) and the words of the goal that
# covers it: the list of what the learner will be able to do names every part of the chapter
GOALS = {
    "The key result": "check its gradients against one device's",
    "DDP: a process per replica": "what its **all-reduce** computes",
    "The same program under torchrun": "with `torchrun`",
    "DataParallel, DDP and one device": "when that is one device's gradient, what keeps ranks in",
    "When a rank fails": "why one failing rank stops them all",
    "DDP from scratch": "build DDP from a hook and an all-reduce",
    "Buckets": "read when its buckets leave and where backward waits",
    "What each moves per step": "what DataParallel moves every step that DDP does not",
    "Step time": "why a timing whose spread covers",
}


def test_the_goals_list_covers_every_section():
    nb = cells()
    goals = " ".join(nb[2].source.split())
    sections = [
        line[3:]
        for c in nb
        if c.cell_type == "markdown"
        for line in c.source.splitlines()
        if line.startswith("## ") and line[3:] not in ("Summary", "Exercises")
    ]
    for section in sections:
        known = [k for k in GOALS if section.startswith(k)]
        assert known, f"section {section!r} has no goal in GOALS: name it in the chapter's goals"
        assert GOALS[known[0]] in goals, (section, GOALS[known[0]])


def test_the_all_reduce_demo_prints_the_mean_the_text_names():
    """The text says DDP multiplies by 1/N and all-reduces: the mean. The demo prints each rank's sum
    and, divided by N, the mean of what the ranks held."""
    nb = cells()
    demo = next(c for c in nb if c.cell_type == "code" and 'ranks.run("all_reduce")' in c.source)
    before = " ".join(nb[nb.index(demo) - 1].source.split())
    assert "$1/N$" in before and "their mean" in before and "sum and mean" in before

    class Ranks:  # what tasks.all_reduce returns on each of 3 ranks: (held, the sum)
        def run(self, task):
            held = [torch.tensor([r + 1.0, 10.0 * (r + 1)]) for r in range(3)]
            return [(h, sum(held)) for h in held]

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(demo.source, {"ranks": Ranks(), "world_size": 3})
    lines = printed.getvalue().splitlines()
    assert lines[0] == "rank 0: holds [1.0, 10.0] -> all_reduce(SUM): [6.0, 60.0] -> / 3: [2.0, 20.0]"
    assert len(lines) == 3 and all(line.endswith("/ 3: [2.0, 20.0]") for line in lines)


A = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.0])}


def test_largest_difference_is_the_largest_absolute_difference_and_where_it_is():
    other = {"w": torch.tensor([1.0, 2.5]), "b": torch.tensor([-1.0])}
    assert compare.largest_difference(A, other) == ("b", 1.0)  # |0 - (-1)| beats |2 - 2.5|
    assert compare.largest_difference(A, A)[1] == 0.0
    with pytest.raises(ValueError, match="different tensors"):
        compare.largest_difference(A, {"w": A["w"]})
    with pytest.raises(ValueError, match="shapes"):  # no broadcasting a (1,) against a (2,)
        compare.largest_difference(A, {"w": A["w"], "b": torch.zeros(2)})


def test_steps_apart_counts_the_floats_between_where_the_gap_is_largest():
    one = torch.tensor([0.5, 1.0])
    up = torch.nextafter(one, torch.tensor(2.0))
    two_up = torch.nextafter(up, torch.tensor(2.0))
    assert compare.steps_apart(torch.stack([one[0], two_up[1]]), one) == 2  # 2 steps of 2^-23 at 1.0
    assert compare.steps_apart(torch.stack([up[0], one[1]]), one) == 1  # 1 step of 2^-24 at 0.5
    line = compare.difference_line("a", {"w": torch.stack([one[0], two_up[1]])}, "b", {"w": one})
    assert line == "largest |a - b|: 2.4e-07 (in w), 2 float32 steps there"


def test_identical_means_bit_for_bit_in_the_same_dtype():
    assert compare.identical(A, {n: t.clone() for n, t in A.items()})
    assert not compare.identical(A, {"w": A["w"] + 1e-7, "b": A["b"]})
    assert not compare.identical(A, {n: t.double() for n, t in A.items()})  # equal values, other dtype


def test_the_lines_say_where_the_numbers_came_from():
    ranks = [
        dict(grads=A, rows=6, device="cuda:0", backend="nccl"),
        dict(grads={"w": A["w"], "b": torch.tensor([0.5])}, rows=2, device="cuda:1", backend="nccl"),
    ]
    assert compare.on_ranks(ranks) == "DDP on 2 ranks (nccl, cuda:0, cuda:1), 6 + 2 rows"
    assert compare.one_device(A, rows=8) == "one device (cpu), all 8 rows"
    assert compare.difference_line("x", A, "y", A) == "x and y: identical, bit for bit"
    reference = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.25])}
    assert compare.against_one_device(ranks, reference, rows=8).splitlines() == [
        "DDP on 2 ranks (nccl, cuda:0, cuda:1), 6 + 2 rows, against one device (cpu), all 8 rows:",
        "  largest |DDP, rank 0 - one device|: 2.5e-01 (in b)",
        "  largest |DDP, rank 1 - one device|: 2.5e-01 (in b)",
        "  largest |rank 0 - rank 1|: 5.0e-01 (in b)",
    ]


def test_a_constant_factor_is_named_and_an_uneven_difference_is_not():
    x = {"w": torch.tensor([1.0, -2.0]), "b": torch.tensor([0.5])}
    half = {n: 0.5 * t for n, t in x.items()}
    assert compare.constant_factor(half, x) == pytest.approx(0.5)
    assert compare.difference_line("h", half, "x", x).endswith(
        "everywhere 0.5 times x's: off by a constant factor"
    )
    uneven = {"w": x["w"] * 0.5, "b": x["b"] * 2.0}
    assert compare.constant_factor(uneven, x) is None
    assert "constant factor" not in compare.difference_line("u", uneven, "x", x)
    # rounding is not a factor: below 1e-5 apart, nothing is read into the difference
    near = {n: t * (1 + 1e-7) for n, t in x.items()}
    assert "constant factor" not in compare.difference_line("n", near, "x", x)


@pytest.mark.slow  # two fresh interpreters importing torch
def test_one_batch_more_on_one_rank_hangs_it_until_the_timeout_and_the_sampler_evens_the_batches():
    """The chapter shows the hang its heading names: the cell tagged ``uneven-batches`` runs
    ``extra_step`` under a short timeout and starts fresh ranks after it. Even step counts return on
    every rank; one backward more leaves only that rank without an answer, the others' answers kept on
    the timeout, and every rank is stopped.
    The cure the chapter prints, ``DistributedSampler``, gives every rank as many samples."""
    from torch.utils.data import DistributedSampler

    from dpteach.distributed import Ranks, RankTimeout

    nb = cells()
    demo = next(c for c in nb if "uneven-batches" in c.metadata.get("tags", []))
    assert '"extra_step"' in demo.source and "timeout=" in demo.source and "except RankTimeout" in demo.source
    assert (
        "err.answered" in demo.source and "err.ranks" in demo.source
    )  # who answered, with what, and who not
    # the timeout stops every rank: the chapter goes on with ranks started before the hang, which import
    # torch while these wait out the timeout
    lines = demo.source.splitlines()
    (start,) = [i for i, line in enumerate(lines) if line.startswith("fresh = Ranks(world_size)")]
    assert start < lines.index("try:") and lines[-1] == "ranks = fresh"
    with Ranks(2, "gloo", timeout=90) as ranks:
        assert ranks.run("extra_step", on_rank=-1, steps=2, echo=False) == [2, 2]  # even counts: no hang
        with pytest.raises(RankTimeout) as info:
            ranks.run("extra_step", on_rank=0, steps=2, timeout=2, echo=False)
        assert info.value.ranks == [0]  # rank 1 answered; rank 0 waits in an all-reduce of its own
        assert info.value.answered == {1: 2}  # what the chapter prints: rank 1 ran its two steps
        assert ranks.alive() == [False, False]
    sampler = next(c for c in nb if c.cell_type == "code" and "DistributedSampler(range(10)" in c.source)
    assert nb.index(demo) < nb.index(sampler)  # the hang first, then the cure
    shares = [list(DistributedSampler(range(10), num_replicas=3, rank=r, shuffle=False)) for r in range(3)]
    assert {len(s) for s in shares} == {4} and sorted(sum(shares, [])) == sorted([*range(10), 0, 1])


@pytest.mark.slow  # two fresh interpreters importing torch
def test_ddp_join_lets_the_rank_with_one_batch_more_finish():
    """The cure the chapter runs after the hang: the same uneven task under ``ddp.join()`` returns on
    every rank, rank 0 having run its extra step, and the chapter's cell runs it between the hang and
    the sampler."""
    from dpteach.distributed import Ranks

    nb = cells()
    joined = next(c for c in nb if "uneven-join" in c.metadata.get("tags", []))
    hang = next(c for c in nb if "uneven-batches" in c.metadata.get("tags", []))
    sampler = next(c for c in nb if c.cell_type == "code" and "DistributedSampler(range(10)" in c.source)
    assert nb.index(hang) < nb.index(joined) < nb.index(sampler) and "join=True" in joined.source
    with Ranks(2, "gloo", timeout=60) as ranks:
        assert ranks.run("extra_step", on_rank=0, steps=2, join=True, echo=False) == [3, 2]
        ran = ranks.run("extra_step", on_rank=0, steps=2, join=True, gradients=True, echo=False)
    # rank 0's third step: rank 1 puts zeros into its all-reduce and DDP still multiplies by 1/2
    # (divide_by_initial_world_size=True), so the step's gradient is half rank 0's own, as the prose says
    assert [r["steps"] for r in ran] == [3, 2] and "gradients=True" in joined.source
    for name, own in ran[0]["own"].items():
        torch.testing.assert_close(ran[0]["last"][name], own / 2, rtol=0, atol=0)
    prose = " ".join(nb[nb.index(joined) + 1].source.split())
    assert "cures the hang, not the gradient" in prose and "half rank 0's own gradient" in prose
    assert "divide_by_initial_world_size=True" in prose  # the default the half comes from, in the fold


@pytest.mark.slow  # fresh interpreters importing torch
def test_the_gap_to_one_device_is_summation_order_as_the_prose_says():
    """The prose after the key result says the gap is summation order: one device sums all 8 rows at
    once, DDP each rank's rows and then the ranks' results, and the orders round differently. So each
    rank's mean gradient, divided by the 2 ranks and added in float32 here, is DDP's bit for bit, and
    the largest gap is a float32 step or two, as the prose says (where it falls, and so whether it is
    one step or two, depends on the machine's kernels)."""
    from dpteach.distributed import Ranks, loss_fn, make_data, make_model

    nb, at = key_result()
    prose = " ".join(nb[at + 1].source.split())
    assert "summation order" in prose
    assert "gap is a float32 step or two" in prose and "doubles at each power of two" in prose
    assert "about 1.5e-8 from 0.125 to 0.25, 3.0e-8 from 0.25 to 0.5" in prose
    with Ranks(2, "gloo") as ranks:
        ddp = ranks.run("gradients", global_batch=8, echo=False)[0]["grads"]
    single = single_device_gradients(8)

    def mean_gradient(rows):  # one rank's own mean loss, backward on one device
        model = make_model()
        x, y = make_data(8)
        loss_fn(model(x[rows]), y[rows]).backward()
        return {name: p.grad for name, p in model.named_parameters()}

    halves = mean_gradient(slice(0, 4)), mean_gradient(slice(4, 8))
    for name, g in ddp.items():
        assert torch.equal(halves[0][name] / 2 + halves[1][name] / 2, g), name  # DDP's order, by hand
    name, gap = compare.largest_difference(ddp, single)
    assert 1 <= compare.steps_apart(ddp[name], single[name]) <= 2 and gap < 1e-7  # a float32 step or two
    for low, spacing in ((0.125, 1.5e-8), (0.25, 3.0e-8)):  # the prose's spacings, to two figures
        near = torch.tensor(low)
        assert f"{(torch.nextafter(near, torch.tensor(1.0)) - near).item():.1e}" == f"{spacing:.1e}"
