"""The thread evidence: which thread runs each backward node of a DataParallel step."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from dpteach.measure import threads


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def test_every_cpu_replica_runs_backward_on_the_caller_thread():
    recorded = threads.backward_threads(model(), torch.randn(6, 8), ["cpu", "cpu"])
    assert recorded.roles == {"caller thread"}
    replicas = {r.replica for r in recorded.rows}
    assert {"replica 0", "replica 1", "shared"} <= replicas
    # each replica's two Linear layers: two AddmmBackward0 nodes per replica
    addmm = [r.replica for r in recorded.rows if r.node == "AddmmBackward0"]
    assert sorted(addmm) == ["replica 0", "replica 0", "replica 1", "replica 1"]
    # the reduction onto the model: one AccumulateGrad per parameter, reached from both replicas
    assert [r.replica for r in recorded.rows if r.node == "AccumulateGrad"] == ["shared"] * 4


def test_an_input_that_requires_grad_gets_its_own_part_not_the_sum_onto_the_model():
    # the scatter's backward and the input's AccumulateGrad are reached from every replica too
    x = torch.randn(6, 8, requires_grad=True)
    recorded = threads.backward_threads(model(), x, ["cpu", "cpu"])
    parts = [(r.node, r.replica) for r in recorded.rows if r.replica in ("shared", "input")]
    assert [n for n, part in parts if part == "shared"].count("AccumulateGrad") == 4  # the parameters
    assert sorted(n for n, part in parts if part == "input") == ["AccumulateGrad", "ScatterBackward"]
    assert "gradient to the input  ScatterBackward, AccumulateGrad" in recorded.table()
    assert x.grad is not None and x.grad.shape == x.shape


def test_the_table_prints_the_same_twice():
    first = threads.backward_threads(model(), torch.randn(6, 8), ["cpu", "cpu"]).table()
    second = threads.backward_threads(model(), torch.randn(6, 8), ["cpu", "cpu"]).table()
    assert first == second
    assert "caller thread" in first and "0x" not in first  # roles, not thread ids


def test_the_caller_is_whichever_thread_called_backward():
    out = {}
    worker = threading.Thread(
        target=lambda: out.setdefault("t", threads.backward_threads(model(), torch.randn(6, 8), ["cpu"] * 3))
    )
    worker.start()
    worker.join()
    assert out["t"].roles == {"caller thread"}
    assert threads._role(worker.ident) == "another thread"  # asked here, not in the worker


def test_graph_walk_is_breadth_first_and_visits_each_node_once():
    x = torch.randn(3, requires_grad=True)
    y = (x * 2 + x).sum()
    names = [n.name() for n in threads.graph_nodes(y.grad_fn)]
    assert names[0] == "SumBackward0" and names.count("torch::autograd::AccumulateGrad") == 1


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_cuda_replicas_run_on_their_devices_autograd_threads():
    net = model().cuda()
    recorded = threads.backward_threads(net, torch.randn(6, 8, device="cuda"), [0, 1])
    assert {"autograd thread cuda:0", "autograd thread cuda:1"} <= recorded.roles
