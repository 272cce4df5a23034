"""Chapter 09's DDP from scratch: a post-accumulate-grad hook per parameter that all-reduces and averages.

The reference is the real ``DistributedDataParallel`` on the same ranks and one device on the whole
batch (STYLE 6); a rank's own gradient, before any all-reduce, must differ from both, so the
comparison can tell whether the hooks ran.
"""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from dpteach.distributed import Ranks, single_device_gradients
from dpteach.distributed.model import loss_fn, make_data, make_model, shard_bounds

pytestmark = pytest.mark.slow  # two fresh interpreters importing torch


@pytest.fixture(scope="module")
def ranks():
    with Ranks(2, "gloo", timeout=90) as group:
        yield group.wait_ready()


@pytest.mark.parametrize("hidden, depth", [(16, 1), (8, 3)])
def test_hooks_give_ddp_gradients(ranks, hidden, depth):
    batch = 8
    mine = ranks.run("ddp_from_scratch", global_batch=batch, hidden=hidden, depth=depth)
    ddp = ranks.run("gradients", global_batch=batch, hidden=hidden, depth=depth)
    single = single_device_gradients(batch, hidden=hidden, depth=depth)
    for name in single:
        for rank in range(2):
            assert_close(mine[rank]["grads"][name], ddp[rank]["grads"][name])  # DDP's gradient on every rank
        assert torch.equal(mine[0]["grads"][name], mine[1]["grads"][name])  # the same tensor on both ranks
        assert_close(mine[0]["grads"][name], single[name])  # one device's, over the whole batch

    # without the all-reduce, rank 0 would hold its own shard's gradient: a different one
    model = make_model(hidden, depth)
    x, y = make_data(batch, 0)
    start, end = shard_bounds(batch, 2)[0]
    loss_fn(model(x[start:end]), y[start:end]).backward()
    local = dict(model.named_parameters())
    assert any(not torch.allclose(local[n].grad, single[n], atol=1e-6) for n in single)
