"""Chapter 09's exercises as a learner does them: a my_tasks.py beside the notebook, run on ranks.

Exercise 1 edits one marked line of the ``gradients`` task, written into a file of the learner's own
by ``exercise.write_my_tasks``; exercise 2 runs a function from that file; exercise 3 changes ``bucket_cap_mb``
and must see the buckets change; exercise 5 runs the ``accumulate`` task with and without
``no_sync``. The ranks import ``my_tasks`` from their working directory, and read it again after an
edit.
"""

from __future__ import annotations

import inspect
import re
import textwrap
from pathlib import Path

import nbformat
import pytest
import torch

from dpteach.distributed import Ranks, single_device_gradients, tasks
from dpteach.distributed.model import shard_bounds

pytestmark = pytest.mark.slow  # two fresh interpreters importing torch

# exercise 1's answer, written from the import lines the chapter's exercise text gives
MY_TASKS = textwrap.dedent(
    """
    import torch.distributed as dist
    from dpteach.distributed.model import make_model, loss_fn
    from dpteach.distributed.train import wrap, local_shard


    def gradients(global_batch=8, hidden=16, depth=1, seed=0, shards=None):
        ddp = wrap(make_model(hidden, depth, seed))
        x, y = local_shard(global_batch, seed, shards)
        loss = ((ddp(x) - y) ** 2).sum() / (global_batch / dist.get_world_size())
        loss.backward()
        return {name: p.grad.cpu() for name, p in ddp.module.named_parameters()}


    def gradients_over_b(global_batch=8, hidden=16, depth=1, seed=0, shards=None):
        # the wrong attempt exercise 1's hint describes: the sum over B alone, the N forgotten
        ddp = wrap(make_model(hidden, depth, seed))
        x, y = local_shard(global_batch, seed, shards)
        ((ddp(x) - y) ** 2).sum().div(global_batch).backward()
        grads = {name: p.grad.cpu() for name, p in ddp.module.named_parameters()}
        return dict(grads=grads, rows=len(x), device=str(x.device), backend=dist.get_backend())


    def gradients_summed(global_batch=8, hidden=16, depth=1, seed=0, shards=None):
        # a plain sum, divided by nothing: every row weighs the same, the loss B/N times too large
        ddp = wrap(make_model(hidden, depth, seed))
        x, y = local_shard(global_batch, seed, shards)
        ((ddp(x) - y) ** 2).sum().backward()
        grads = {name: p.grad.cpu() for name, p in ddp.module.named_parameters()}
        return dict(grads=grads, rows=len(x), device=str(x.device), backend=dist.get_backend())


    def gradients_over_bn(global_batch=8, hidden=16, depth=1, seed=0, shards=None):
        # divided by B and by N: every row weighs the same; DDP divides by N once more, so 1/N^2 of the mean
        ddp = wrap(make_model(hidden, depth, seed))
        x, y = local_shard(global_batch, seed, shards)
        ((ddp(x) - y) ** 2).sum().div(global_batch * dist.get_world_size()).backward()
        grads = {name: p.grad.cpu() for name, p in ddp.module.named_parameters()}
        return dict(grads=grads, rows=len(x), device=str(x.device), backend=dist.get_backend())


    def gradients_over_4(global_batch=8, hidden=16, depth=1, seed=0, shards=None):
        # a divisor typed in: 4 rows per rank fits 8 rows on 2 ranks (the first split) and nothing else
        ddp = wrap(make_model(hidden, depth, seed))
        x, y = local_shard(global_batch, seed, shards)
        ((ddp(x) - y) ** 2).sum().div(4).backward()
        grads = {name: p.grad.cpu() for name, p in ddp.module.named_parameters()}
        return dict(grads=grads, rows=len(x), device=str(x.device), backend=dist.get_backend())


    def gradients_two_ranks(global_batch=8, hidden=16, depth=1, seed=0, shards=None):
        # the world size typed in as 2: right on 2 ranks with any rows, wrong on any other world size
        ddp = wrap(make_model(hidden, depth, seed))
        x, y = local_shard(global_batch, seed, shards)
        ((ddp(x) - y) ** 2).sum().div(global_batch / 2).backward()
        grads = {name: p.grad.cpu() for name, p in ddp.module.named_parameters()}
        return dict(grads=grads, rows=len(x), device=str(x.device), backend=dist.get_backend())


    def hi():
        return {VALUE}
    """
)


@pytest.fixture(scope="module")
def in_a_notebook_folder(tmp_path_factory):
    """A folder holding my_tasks.py, as the learner's notebook folder would; ranks started there."""
    folder = tmp_path_factory.mktemp("notebook")
    (folder / "my_tasks.py").write_text(MY_TASKS.replace("{VALUE}", "1"))
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)  # the ranks inherit the caller's working directory, as from a notebook's kernel
        mp.syspath_prepend(str(folder))  # a kernel imports from its folder too
        with Ranks(2, "gloo", timeout=90) as ranks:
            yield folder, ranks.wait_ready()


CHAPTER = Path(__file__).resolve().parents[2] / "notebooks" / "09_beyond_one_process.ipynb"


def exercise_text(number: int) -> str:
    """The chapter's exercise ``number``, as the learner reads it."""
    nb = nbformat.read(CHAPTER, as_version=4)
    cell = next(c for c in nb.cells if c.cell_type == "markdown" and c.source.startswith("## Exercises"))
    found = re.search(rf"^{number}\. (.*?)(?=^\d+\. |\Z)", cell.source, re.S | re.M)
    assert found, f"no exercise {number} in chapter 09"
    return " ".join(found[1].split())


def test_exercise_1_the_template_edited_in_its_marked_line_passes_the_check(in_a_notebook_folder, capsys):
    """The chapter's calls, as worded: ``write_my_tasks()`` writes ``tasks.gradients`` with its imports and
    one line marked ``# EDIT``; unedited, ``check_uneven_shards`` says what to change; with the marked
    line fixed, it says "Correct". The shards it uses split every world size the chapter may have."""
    from dpteach.distributed import exercise

    folder, ranks = in_a_notebook_folder
    text = exercise_text(1)
    for call in ("`write_my_tasks()`", "`print(check_uneven_shards(ranks))`", "`# EDIT`"):
        assert call in text, call
    # the exercises' one import line, above exercise 1, brings every check the exercises name
    cells = nbformat.read(CHAPTER, as_version=4).cells
    exercises = next(c for c in cells if c.cell_type == "markdown" and c.source.startswith("## Exercises"))
    assert "`from dpteach.distributed.exercise import *`" in exercises.source.split("1. **")[0]
    names = ("write_my_tasks", "check_uneven_shards", "check_bucket_sizes", "check_accumulate")
    assert set(names) <= set(exercise.__all__)
    path = exercise.write_my_tasks(folder / "my_tasks_ex1.py")
    source = path.read_text()
    assert inspect.getsource(tasks.gradients).split("\n")[0] in source  # the task as the chapter runs it
    (marked,) = [line for line in source.splitlines() if "# EDIT" in line]  # one line to edit
    exercise.write_my_tasks(path)  # a second call keeps the learner's edits
    assert "is there already" in capsys.readouterr().out
    unedited = exercise.check_uneven_shards(ranks, task="my_tasks_ex1:gradients")
    assert "Correct" not in unedited and "Change the marked line" in unedited
    assert unedited.splitlines()[-1].startswith("Rows weighed unevenly: ")  # the kind of problem, first
    fixed = "    loss = ((ddp(x) - y) ** 2).sum() / (global_batch / dist.get_world_size())"
    path.write_text(source.replace(marked, fixed) + "\n# edited\n")  # another size: a new .pyc
    capsys.readouterr()
    passed = exercise.check_uneven_shards(ranks, task="my_tasks_ex1:gradients")
    assert passed.endswith("Correct: one device's gradient on every rank, with uneven shards.")
    # one text, in the order it ran: the first split's table, the line naming the second, its table
    assert capsys.readouterr().out == ""
    lines = passed.splitlines()
    (at,) = [i for i, line in enumerate(lines) if line.startswith("first split correct; checking a second")]
    assert 0 < at < len(lines) - 2, passed
    for world_size in (2, 3, 4):  # the check's shards must split every world size
        shards = [6, 2] + [4] * (world_size - 2)
        shard_bounds(sum(shards), world_size, shards)  # raises on a bad split


def test_exercise_1_the_sum_over_b_over_n_matches_one_device_with_uneven_shards(in_a_notebook_folder):
    _, ranks = in_a_notebook_folder
    mine = ranks.run("my_tasks:gradients", global_batch=8, shards=[6, 2])
    reference = single_device_gradients(8)
    mean_loss = ranks.run("gradients", global_batch=8, shards=[6, 2])[0]["grads"]
    for name, g in reference.items():
        torch.testing.assert_close(mine[0][name], g)  # the fixed loss: one device's gradient
    assert max((mean_loss[n] - g).abs().max().item() for n, g in reference.items()) > 1e-4  # the mean: not


def test_exercise_1_the_sum_over_b_alone_is_named_a_constant_factor_as_the_hint_says(in_a_notebook_folder):
    """The hint quotes what the comparison prints for a loss divided by B alone: every gradient 1/N of
    one device's, which ``difference_line`` names as a constant factor, and the check as an extra 1/N."""
    from dpteach.distributed import compare, exercise

    _, ranks = in_a_notebook_folder
    results = ranks.run("my_tasks:gradients_over_b", global_batch=8, shards=[6, 2])
    printed = compare.against_one_device(results, single_device_gradients(8), rows=8)
    factor = f"everywhere {1 / ranks.world_size:.4g} times one device's: off by a constant factor"
    assert all(factor in line for line in printed.splitlines()[1 : 1 + ranks.world_size]), printed
    verdict = exercise.check_uneven_shards(ranks, task="my_tasks:gradients_over_b").splitlines()[-1]
    assert verdict.startswith("Extra 1/N: ") and "Scale your loss by dist.get_world_size()" in verdict
    nb = nbformat.read(CHAPTER, as_version=4)
    exercises = next(c for c in nb.cells if c.cell_type == "markdown" and c.source.startswith("## Exercises"))
    assert "`everywhere 0.5 times one device's`" in exercises.source  # the hint quotes it, for 2 ranks


def test_exercise_1_a_loss_off_by_any_constant_is_told_the_factor_to_fix_it_by(in_a_notebook_folder):
    """Every row weighs the same but the loss is a constant times too large or too small: the check
    names the factor, computed from the gradients, and the way to undo it. A plain sum over 2 ranks and
    8 rows is B/N = 4 times one device's mean; a sum divided by B x N is 1/N^2 = 1/4 of it, too small,
    and not the 1/N case the check names apart (scale by dist.get_world_size())."""
    from dpteach.distributed import exercise

    _, ranks = in_a_notebook_folder
    n, shards = ranks.world_size, [6, 2] + [4] * (ranks.world_size - 2)
    b = sum(shards)
    summed = exercise.check_uneven_shards(ranks, task="my_tasks:gradients_summed").splitlines()[-1]
    factor = f"{b / n:.3g}"
    assert summed.startswith("Constant factor: ")  # the kind of problem, first
    assert f"every gradient is {factor} times one device's" in summed, summed
    assert (
        "too large" in summed and f"Change the marked line to divide it by {factor}, written from" in summed
    ), summed
    assert "dist.get_world_size()" in summed  # not a typed-in divisor, which the next split refuses
    small = exercise.check_uneven_shards(ranks, task="my_tasks:gradients_over_bn").splitlines()[-1]
    assert f"every gradient is {1 / n:.3g} times one device's" not in small  # 1/N has its own advice
    assert small.startswith("Constant factor: ")
    assert f"every gradient is {1 / n**2:.3g} times one device's" in small, small
    assert "too small" in small and f"multiply it by {n**2:.3g}, written from" in small, small
    assert "Correct" not in summed + small


@pytest.mark.parametrize("task", ["gradients_over_4", "gradients_two_ranks"])
def test_exercise_1_a_divisor_fixed_to_the_first_split_fails_on_the_second(in_a_notebook_folder, task):
    """A loss divided by 4 (the first split's rows per rank) or by global_batch / 2 (its world size) gives
    one device's gradient on 8 rows over 2 ranks; the check's second split, 6 + 2 + 1 rows on 3 fresh
    gloo ranks, finds the gradient off by a constant there and names the problem a fixed divisor."""
    from dpteach.distributed import exercise

    _, ranks = in_a_notebook_folder
    first = ranks.run(f"my_tasks:{task}", global_batch=8, shards=[6, 2])
    for name, g in single_device_gradients(8).items():
        torch.testing.assert_close(first[0]["grads"][name], g)  # the first split alone would pass it
    verdict = exercise.check_uneven_shards(ranks, task=f"my_tasks:{task}").splitlines()[-1]
    assert verdict.startswith("Fixed divisor: ") and "Correct" not in verdict, verdict
    # the factor it names is the gradient's own on the second split: 9 rows, 3 ranks, divisor d: 9 / (3 d)
    d = {"gradients_over_4": 4, "gradients_two_ranks": 9 / 2}[task]
    assert f"every gradient {9 / (3 * d):.3g} times one device's" in verdict, verdict


def test_exercise_2_a_function_in_the_file_runs_and_an_edit_is_read_again(in_a_notebook_folder):
    folder, ranks = in_a_notebook_folder
    assert ranks.run("my_tasks:hi") == [1, 1]
    (folder / "my_tasks.py").write_text(MY_TASKS.replace("{VALUE}", "2 "))  # another size: a new .pyc
    assert ranks.run("my_tasks:hi") == [2, 2]  # the ranks read the edited file, no new Ranks needed


def test_exercise_3_the_suggested_caps_give_different_buckets(in_a_notebook_folder):
    _, ranks = in_a_notebook_folder
    from dpteach.distributed import order

    assert "`bucket_order`" in exercise_text(3)
    counts = {  # step 2's buckets: DDP rebuilds them after step 1
        cap: len(order.buckets(ranks.run("bucket_order", bucket_cap_mb=cap)[0]["steps"][1]))
        for cap in (25, 0.5, 0.25, 0.001)
    }
    assert counts[25] == 1  # the whole model (530,436 bytes) fits in one bucket: nothing to overlap
    assert len(set(counts.values())) == len(counts), counts  # every suggested cap shows a different packing
    # the exercise gives the model's exact bytes, just over 0.5 MiB, so a cap of 0.5 cannot hold it all
    model = sum(b["bytes"] for b in order.buckets(ranks.run("bucket_order", bucket_cap_mb=25)[0]["steps"][1]))
    assert model == 530_436 > 0.5 * 2**20 and "530,436 bytes" in exercise_text(3)
    assert counts[0.5] == 2 and "524,288 bytes" in exercise_text(3)


def test_exercise_5_no_sync_gives_one_devices_gradient_with_one_all_reduce_instead_of_two(
    in_a_notebook_folder,
):
    """The calls exercise 5 gives, run as worded: with ``no_sync`` and without, one device's gradient;
    with it the ranks all-reduce one bucket once per step, without it once per micro-batch."""
    from dpteach.distributed import compare

    _, ranks = in_a_notebook_folder
    text = exercise_text(5)
    call = re.search(r'`results = (ranks\.run\("accumulate"[^`]+)`', text)[1]
    assert "`no_sync=False`" in text and 'each rank\'s `"allreduces"`' in text
    scope = {"ranks": ranks, "global_batch": 4 * ranks.world_size}
    single = single_device_gradients(scope["global_batch"])
    synced = eval(call, scope)
    unsynced = eval(call.replace(")", ", no_sync=False)"), scope)
    for results in (synced, unsynced):
        printed = compare.against_one_device(results, single, rows=scope["global_batch"])
        assert "constant factor" not in printed
        for r in results:
            for name, g in single.items():
                torch.testing.assert_close(r["grads"][name], g)  # one device's gradient, both ways
    # the course model fits in one bucket: one all-reduce per step under no_sync, one per micro-batch without
    assert [r["allreduces"] for r in synced] == [1] * ranks.world_size
    assert [r["allreduces"] for r in unsynced] == [2] * ranks.world_size
    nb = nbformat.read(CHAPTER, as_version=4)
    exercises = next(c for c in nb.cells if c.cell_type == "markdown" and c.source.startswith("## Exercises"))
    answer = " ".join(exercises.source.split("Answer 5")[1].split())
    assert "1 all-reduce per rank" in answer and "each backward all-reduces: 2" in answer


def test_exercise_3_the_check_passes_the_answer_and_rejects_a_wrong_count_with_what_to_change(
    in_a_notebook_folder,
):
    """Exercise 3's check runs bucket_order at each cap: Answer 3's numbers pass; a wrong one is told
    the idea first, then how to count, and only from the third miss DDP's numbers."""
    from dpteach.distributed import exercise

    _, ranks = in_a_notebook_folder
    assert "check_bucket_sizes(ranks," in exercise_text(3)
    exercise._misses.clear()
    answer = {25: (1, 0), 0.5: (2, 3), 0.001: (4, 7)}  # Answer 3: one, two, four buckets
    assert exercise.check_bucket_sizes(ranks, answer).splitlines()[-1].startswith("Correct")
    wrong = {**answer, 0.5: (1, 3)}
    first = exercise.check_bucket_sizes(ranks, wrong).splitlines()[-1]
    second = exercise.check_bucket_sizes(ranks, wrong).splitlines()[-1]
    third = exercise.check_bucket_sizes(ranks, wrong).splitlines()[-1]
    assert first.startswith("Not yet") and "closes once it holds the cap" in first and "2 bucket" not in first
    assert "walk the gradients" in second and "0.5 MiB" in second and "made 2" not in second
    assert "DDP made 2 bucket(s)" in third and "Answer 3" in third
    # incomplete or malformed predictions are told the form, not run
    assert exercise.check_bucket_sizes(ranks, {25: (1, 0)}).startswith("Not yet: give one prediction per cap")
    assert "two whole numbers" in exercise.check_bucket_sizes(ranks, {**answer, 25: (1.0, 0)})


def test_exercise_5_the_check_passes_the_answer_and_rejects_wrong_counts_or_a_wrong_verdict(
    in_a_notebook_folder,
):
    from dpteach.distributed import exercise

    _, ranks = in_a_notebook_folder
    assert "check_accumulate(ranks," in exercise_text(5)
    exercise._misses.clear()
    answer = {2: (1, 2), 4: (1, 4)}
    assert exercise.check_accumulate(ranks, answer, one_device=True).splitlines()[-1].startswith("Correct")
    # the 2-micro-batch counts carried over to 4: wrong, and the hint names the idea first
    first = exercise.check_accumulate(ranks, {2: (1, 2), 4: (1, 2)}, one_device=True).splitlines()
    assert "4 micro-batches: your (1, 2) (no_sync, without): not what the ranks did" in first
    assert first[-1].startswith("Not yet") and "(1, 4)" not in first[-1]
    wrong_verdict = exercise.check_accumulate(ranks, answer, one_device=False).splitlines()[-1]
    assert "one bucket" in wrong_verdict and "linear" in wrong_verdict
    third = exercise.check_accumulate(ranks, answer, one_device=False).splitlines()[-1]
    assert "(1, 4) with 4" in third and "Answer 5" in third
    assert "True or False" in exercise.check_accumulate(ranks, answer, one_device=1)
