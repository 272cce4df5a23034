"""Chapter 09's exercises as a learner does them: a my_tasks.py beside the notebook, run on ranks.

Exercise 1 copies the ``gradients`` task into a file of the learner's own, with the import lines
the chapter gives; exercise 2 runs a function from that file; exercise 3 changes ``bucket_cap_mb``
and must see the buckets change. The ranks import ``my_tasks`` from their working directory, and
read it again after an edit.
"""

from __future__ import annotations

import textwrap

import pytest
import torch

from dpteach.distributed import Ranks, single_device_gradients

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


def test_exercise_1_the_sum_over_b_over_n_matches_one_device_with_uneven_shards(in_a_notebook_folder):
    _, ranks = in_a_notebook_folder
    mine = ranks.run("my_tasks:gradients", global_batch=8, shards=[6, 2])
    reference = single_device_gradients(8)
    mean_loss = ranks.run("gradients", global_batch=8, shards=[6, 2])[0]["grads"]
    for name, g in reference.items():
        torch.testing.assert_close(mine[0][name], g)  # the fixed loss: one device's gradient
    assert max((mean_loss[n] - g).abs().max().item() for n, g in reference.items()) > 1e-4  # the mean: not


def test_exercise_2_a_function_in_the_file_runs_and_an_edit_is_read_again(in_a_notebook_folder):
    folder, ranks = in_a_notebook_folder
    assert ranks.run("my_tasks:hi") == [1, 1]
    (folder / "my_tasks.py").write_text(MY_TASKS.replace("{VALUE}", "2 "))  # another size: a new .pyc
    assert ranks.run("my_tasks:hi") == [2, 2]  # the ranks read the edited file, no new Ranks needed


def test_exercise_3_the_suggested_caps_give_different_buckets(in_a_notebook_folder):
    _, ranks = in_a_notebook_folder
    counts = {
        cap: len(ranks.run("buckets", bucket_cap_mb=cap)[0]["buckets"]) for cap in (25, 0.5, 0.25, 0.001)
    }
    assert counts[25] == 1  # the whole model (about 0.5 MiB) fits in one bucket: nothing to overlap
    assert len(set(counts.values())) == len(counts), counts  # every suggested cap shows a different packing
