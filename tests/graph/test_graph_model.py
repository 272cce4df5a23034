"""The graph model: what autograd_graph says about a model's gradient, checked against what backward() does."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import dpteach
from dpteach.data_parallel import step
from dpteach.graph import Param, autograd_graph
from dpteach.replicate import FIXED as FIXED_STRATEGIES
from dpteach.replicate import STRATEGIES as REGISTRY

STRATEGIES = list(REGISTRY)
FIXED = list(FIXED_STRATEGIES)
DEVICES = ["cpu", "cpu"]


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(2, 3), nn.Tanh(), nn.Linear(3, 1))


def graph_of(model: nn.Module, strategy: str, devices=DEVICES, x=None):
    x = torch.randn(4, 2) if x is None else x
    done = step(model, x, devices, strategy=strategy, backward=False)
    loss, replicas = done.loss, done.replicas
    return autograd_graph(loss, module=model, replicas=replicas), loss, replicas


def names(model: nn.Module) -> list[str]:
    return [n for n, p in model.named_parameters() if p.requires_grad]


def test_clone_every_replica_parameter_is_a_dead_end():
    model = mlp()
    g, _, _ = graph_of(model, "clone")
    expected = {Param(n, slot, "cpu") for slot in range(len(DEVICES)) for n in names(model)}
    # every replica's every parameter is a leaf of its own, with no way on to the original
    assert set(g.dead_ends) == expected
    # and no path from the output reaches any original parameter (#19540)
    assert [p.name for p in g.unreached] == names(model)
    assert all(path is None for path in g.paths_to_original().values())


@pytest.mark.parametrize("strategy", FIXED)
def test_fixed_strategies_lead_every_replica_parameter_to_its_original(strategy):
    model = mlp()
    g, _, _ = graph_of(model, strategy)
    paths = g.paths_to_original()
    # one replica parameter per slot and parameter is in the graph
    assert set(paths) == {Param(n, slot, "cpu") for slot in range(len(DEVICES)) for n in names(model)}
    for param, path in paths.items():
        # the gradient of each copy ends at the original of the same name
        assert path is not None and path[-1] == f"original.{param.name}", param
        # passing through the node the strategy adds (ReduceAdd per parameter, or one Broadcast)
        assert g.nodes[path[1]].kind == "join", path
    # nothing is a dead end and nothing is unreached
    assert g.dead_ends == () and g.unreached == ()


def test_rewire_joins_each_parameter_through_one_reduce_add_node():
    model = mlp()
    g, _, _ = graph_of(model, "rewire")
    joins = [n for n in g.nodes.values() if n.kind == "join"]
    # one ReduceAdd node per original parameter, as PR #20910 builds them
    assert sorted(n.id for n in joins) == sorted(f"ReduceAddBackward[{n}]" for n in names(model))
    for n in joins:
        parents = [e.src for e in g.edges if e.dst == n.id]
        # each takes one edge from every slot's copy
        assert sorted(parents) == sorted(f"replica{s}.{n.id[18:-1]}" for s in range(len(DEVICES)))


def test_broadcast_has_one_node_for_all_parameters():
    model = mlp()
    g, _, _ = graph_of(model, "broadcast")
    joins = [n for n in g.nodes.values() if n.kind == "join"]
    # replicate.py broadcasts every parameter through one Broadcast node
    assert [n.op for n in joins] == ["BroadcastBackward"]
    # whose edges lead to every original parameter
    assert sorted(g.children(joins[0].id)) == sorted(f"original.{n}" for n in names(model))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_graph_predicts_which_grads_backward_fills(strategy):
    model = mlp()
    g, loss, replicas = graph_of(model, strategy)
    loss.backward()
    unreached = {p.name for p in g.unreached}
    for name, p in model.named_parameters():
        # an original parameter gets a .grad exactly when the graph says the gradient reaches it
        assert (p.grad is None) == (name in unreached), name
    for slot, replica in enumerate(replicas):
        for name, p in replica.named_parameters():  # "clone" replicas keep Parameters; the others do not
            # a replica's own .grad fills exactly at the dead ends
            assert (p.grad is not None) == (Param(name, slot, "cpu") in g.dead_ends), (slot, name)


@pytest.mark.parametrize("strategy", FIXED)
def test_reached_gradients_equal_one_device(strategy):
    torch.manual_seed(0)
    model, reference = mlp(), mlp()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(6, 2)
    g, loss, _ = graph_of(model, strategy, x=x)
    loss.backward()
    reference(x).pow(2).mean().backward()
    assert g.unreached == ()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        # what the graph calls reached really receives the one-device gradient
        torch.testing.assert_close(p.grad, q.grad, msg=name)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_same_model_same_nodes_edges_and_dot(strategy):
    first, _, _ = graph_of(mlp(), strategy)
    second, _, _ = graph_of(mlp(), strategy)
    # node ids come from names and walk order, never id(): two runs give the same graph
    assert list(first.nodes) == list(second.nodes) and first.edges == second.edges
    # and the same DOT text
    assert first.dot == second.dot


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_walking_after_backward_reads_no_freed_saved_tensor(strategy):
    model = mlp()
    done = step(model, torch.randn(4, 2), DEVICES, strategy=strategy, backward=False)
    loss, replicas = done.loss, done.replicas
    before = autograd_graph(loss, module=model, replicas=replicas)
    loss.backward()  # frees every saved tensor; torchviz's show_saved would raise from here on
    after = autograd_graph(loss, module=model, replicas=replicas)
    # the graph after backward is the graph before it
    assert after.dot == before.dot and after.dead_ends == before.dead_ends


def test_tied_weights():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(3, 3), nn.Linear(3, 3)
            self.b.weight = self.a.weight

        def forward(self, x):
            return self.b(torch.tanh(self.a(x)))

    model = Tied()
    x = torch.randn(4, 3)
    clone, _, _ = graph_of(model, "clone", x=x)
    # the tied weight is one original parameter, never reached under clone
    assert [p.name for p in clone.unreached] == ["a.weight", "a.bias", "b.bias"]
    # clone unties it: each replica holds two dead-end copies, named by both names
    assert {p.name for p in clone.dead_ends} == {"a.weight", "b.weight", "a.bias", "b.bias"}
    for strategy in FIXED:
        g, _, _ = graph_of(model, strategy, x=x)
        paths = g.paths_to_original()
        # every copy, under either name, leads to the one original a.weight
        assert all(
            path[-1] == "original." + ("a.weight" if p.name.endswith("weight") else p.name)
            for p, path in paths.items()
        ), paths


def test_frozen_parameter_is_neither_dead_end_nor_unreached():
    model = mlp()
    model[0].weight.requires_grad_(False)
    for strategy in STRATEGIES:
        g, _, _ = graph_of(model, strategy)
        # a parameter that asks for no gradient is not in the graph and not missed
        assert all(p.name != "0.weight" for p in (*g.dead_ends, *g.unreached, *g.originals)), strategy


def test_data_parallel_with_kept_replicas():
    model = mlp()
    dp = dpteach.DataParallel(model, DEVICES, strategy="rewire")
    with dpteach.keep_replicas(dp) as replicas:
        out = dp(torch.randn(4, 2))
    # the replicas of the forward were kept, and the method is back to the class's
    assert len(replicas) == len(DEVICES) and "replicate" not in vars(dp)
    g = autograd_graph(out, module=dp, replicas=replicas)
    # names read 0.weight, not module.0.weight, and every copy reaches its original
    assert [p.name for p in g.originals] == names(model) and g.dead_ends == () and g.unreached == ()


def test_names_and_leaves_of_a_tiny_graph():
    w = torch.tensor(2.0, requires_grad=True)
    x = torch.tensor(3.0)
    h = w * x
    loss = (h + 1) ** 2
    g = autograd_graph(loss, names={"w": w, "x": x, "h": h})
    kinds = {n.label: (n.kind, n.leaf) for n in g.nodes.values() if n.kind not in ("op", "output")}
    # w is a leaf (its AccumulateGrad writes .grad), h a named non-leaf, x needs no grad so is not there
    assert kinds == {"w": ("input", True), "h": ("tensor", False)}
    # h sits between its consumer and MulBackward0, which leads to w
    assert g.path("output", "tensor.w") == (
        "output",
        "PowBackward0_1",
        "AddBackward0_1",
        "tensor.h",
        "MulBackward0_1",
        "tensor.w",
    )


def test_outputs_without_history():
    leaf = torch.ones(2, requires_grad=True)
    g = autograd_graph(leaf, names={"p": leaf})
    # a leaf output leads straight to itself
    assert g.children("output") == ["tensor.p"]
    g = autograd_graph(torch.ones(2))
    # a tensor that needs no grad has an empty graph, and still draws
    assert list(g.nodes) == ["output"] and "output" in g.text


def test_bad_input_gets_a_clear_error():
    with pytest.raises(TypeError, match="expects a tensor"):
        autograd_graph([1, 2])
    with pytest.raises(ValueError, match="needs module="):
        autograd_graph(torch.ones(1, requires_grad=True), replicas=[mlp()])
    with pytest.raises(TypeError, match="nn.Module"):
        autograd_graph(torch.ones(1, requires_grad=True), module="model")


@settings(max_examples=20, deadline=None)
@given(depth=st.integers(1, 3), slots=st.integers(1, 3), strategy=st.sampled_from(STRATEGIES))
def test_facts_hold_for_any_mlp_and_slot_count(depth, slots, strategy):
    layers = [m for _ in range(depth) for m in (nn.Linear(2, 2), nn.Tanh())]
    model = nn.Sequential(*layers)
    g, _, _ = graph_of(model, strategy, devices=["cpu"] * slots, x=torch.randn(2 * slots, 2))
    every = {Param(n, s, "cpu") for s in range(slots) for n in names(model)}
    if strategy == "clone":
        # every copy is a dead end and every original unreached, whatever the size
        assert set(g.dead_ends) == every and len(g.unreached) == len(names(model))
    else:
        # every copy leads to its own original
        assert set(g.replica_params) == every and g.dead_ends == () and g.unreached == ()


def test_a_named_leaf_the_output_never_reaches():
    w = torch.tensor(2.0, requires_grad=True)
    w_copy = w.detach().clone().requires_grad_()  # a fresh leaf: what Module::clone() made (#19540)
    g = autograd_graph((w_copy * 3) ** 2, names={"w": w, "w_copy": w_copy})
    # the copy is reached and takes the gradient; w is drawn, alone and never reached
    assert g.nodes["tensor.w_copy"].reached and not g.nodes["tensor.w"].reached
    assert all("tensor.w" not in (e.src, e.dst) for e in g.edges)


def test_tensors_held_outside_the_registries_are_named():
    from types import SimpleNamespace

    class Members(nn.Module):
        """Forward reads a member field, as C++'s LinearImpl reads `weight` (PR #20910's failed attempt)."""

        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(1, 2))
            self.members = SimpleNamespace(weight=self.weight)

        def forward(self, x):
            return x @ self.members.weight.t()

    def fresh_members(network, devices, detach):
        replicas = dpteach.replicate(network, devices, strategy="broadcast")
        for replica in replicas:  # the registry gets the broadcast copy; the member a fresh leaf
            replica.members = SimpleNamespace(weight=network.weight.detach().clone().requires_grad_())
        return replicas

    model = Members()
    g, _, _ = graph_of(model, fresh_members)
    # the members the forward read are the dead ends, named by where they live
    assert g.dead_ends == tuple(Param("members.weight", s, "cpu") for s in range(len(DEVICES)))
    assert [p.name for p in g.unreached] == ["weight"]
    _, drawn = g._drawn_parts()
    # and the picture marks the edge they lack, to the parameter they stand in for
    assert {e.dst for e in drawn if e.status == "missing"} == {"original.weight"}


@pytest.mark.cuda
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_graph_on_cuda_slots(strategy):
    devices = ["cuda:0", "cuda:0"] if torch.cuda.device_count() < 2 else ["cuda:0", "cuda:1"]
    model = mlp().to(devices[0])
    g, loss, _ = graph_of(model, strategy, devices=devices, x=torch.randn(4, 2, device=devices[0]))
    # replica parameters carry their slot's device
    assert {p.device for p in g.replica_params} == set(devices)
    # and the facts do not depend on the device
    assert (len(g.dead_ends) == 2 * len(names(model))) == (strategy == "clone")
    loss.backward()
    # backward agrees with the graph on CUDA too
    assert all((p.grad is None) == (strategy == "clone") for p in model.parameters())
