"""On real GPUs: the same semantics as on CPU slots, and the CUDA fast paths give identical results.

Marked `cuda` (or `multigpu`); skipped without a GPU. scripts/gpu_check.sh runs them on a GPU machine.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.testing import assert_close

import dpteach
from dpteach import comm
from dpteach.replicate import FIXED

pytestmark = pytest.mark.cuda


def test_default_devices_use_the_gpu():
    slots = dpteach.default_devices()
    assert all(d.type == "cuda" for d in slots)  # with CUDA, every slot is a GPU
    assert len(slots) >= 2


@pytest.mark.parametrize("strategy", FIXED)
def test_data_parallel_on_gpu_slots_matches_one_device(strategy):
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)).cuda()
    ref = copy.deepcopy(model)
    x = torch.randn(64, 32, device="cuda")
    dpteach.DataParallel(model, dpteach.default_devices(), strategy=strategy)(x).pow(2).mean().backward()
    ref(x).pow(2).mean().backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)  # gradients on the GPU equal one device's


def test_clone_loses_gradients_on_gpu_too():
    model = nn.Linear(8, 2).cuda()
    dpteach.DataParallel(model, dpteach.default_devices(), strategy="clone")(
        torch.randn(8, 8, device="cuda")
    ).sum().backward()
    assert model.weight.grad is None  # the bug is in the graph, not the hardware


def test_duplicate_gpu_slots_own_their_storage():
    model = nn.Linear(4, 4).cuda()
    r0, r1 = dpteach.replicate(model, ["cuda:0", "cuda:0"])
    assert r0.weight.data_ptr() == model.weight.data_ptr()  # slot 0 shares
    assert r1.weight.data_ptr() != model.weight.data_ptr()  # slot 1 on the same GPU owns its copy


def test_scatter_from_cpu_to_gpu_slots_and_back():
    x = torch.randn(8, 3)
    pieces = dpteach.scatter(x, ["cuda:0", "cuda:0"])
    assert all(p.is_cuda for p in pieces)  # every piece went to its GPU slot
    back = dpteach.gather(pieces, "cpu")
    assert_close(back, x)  # the round trip through the GPU loses nothing


def test_comm_agrees_between_cpu_and_gpu():
    tensors = [torch.randn(5, 3), torch.randn(7)]
    gpu = [t.cuda() for t in tensors]
    out = comm.reduce_add_coalesced([gpu, [t * 2 for t in gpu]])
    for o, t in zip(out, tensors):
        assert_close(o.cpu(), 3 * t)  # the same sums as on CPU


@pytest.mark.multigpu
def test_nccl_fast_paths_equal_the_device_agnostic_ones():
    n = torch.cuda.device_count()
    slots = [torch.device("cuda", i) for i in range(n)]
    tensors = [torch.randn(100, 7, device="cuda:0"), torch.randint(0, 5, (33,), device="cuda:0")]
    fast = comm.broadcast_coalesced(tensors, slots)
    slow = [[t.to(d) for t in tensors] for d in slots]
    for f, s in zip(fast, slow):
        for a, b in zip(f, s):
            assert a.device == b.device and torch.equal(a.cpu(), b.cpu())  # identical copies
    groups = [[torch.randn(50, device=d)] for d in slots]
    fast_sum = comm.reduce_add_coalesced(groups, slots[0])[0]
    slow_sum = sum(g[0].to(slots[0]) for g in groups)
    assert_close(fast_sum, slow_sum)  # NCCL's sum equals the sum by hand


@pytest.mark.multigpu
def test_against_torch_data_parallel():
    n = torch.cuda.device_count()
    model = nn.Linear(10, 5).cuda()
    x = torch.randn(20, 10, device="cuda")
    ours = dpteach.DataParallel(model, list(range(n)))(x)
    theirs = nn.DataParallel(model, device_ids=list(range(n)))(x)
    assert_close(ours, theirs)  # the drop-in computes what PyTorch's computes


def test_the_course_story_runs_on_gpu_slots():
    from dpteach.course import story

    devices = dpteach.default_devices()
    assert story.train("rewire", devices, steps=20).learned  # chapter 01/03's loop on the GPU
    assert not story.train("clone", devices, steps=5).learned
    assert story.one_step("broadcast", devices).matches
