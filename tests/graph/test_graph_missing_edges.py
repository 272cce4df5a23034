"""Clone's missing edges are drawn from one replica only, so each copy can be traced to its original.

Drawn from every replica, the dotted lines fanned out of two boxes side by side, crossed between
them, and no line could be followed from a copy to its original. Every replica's dead ends are the
same, so the picture draws one replica's (the legend says which) and the text form keeps them all.
"""

from __future__ import annotations

import re

import torch
from torch import nn

import dpteach
from dpteach.data_parallel import step
from dpteach.graph import autograd_graph
from dpteach.replicate import ReduceAdd

DEVICES = ["cpu", "cpu", "cpu"]


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 3), nn.Tanh(), nn.Linear(3, 1))


def missing_lines(dot: str) -> list[tuple[str, str]]:
    return re.findall(r'"?(replica\d[\w.]*)"? -> "?(original[\w.]*)"? \[arrowhead=tee', dot)


def test_clone_draws_the_missing_edges_of_one_replica_in_module_order():
    model = mlp()
    done = step(model, torch.randn(6, 2), DEVICES, strategy="clone", backward=False)
    loss, replicas = done.loss, done.replicas
    g = autograd_graph(loss, module=model, replicas=replicas)
    names = [name for name, _ in model.named_parameters()]
    lines = missing_lines(g.draw().dot)
    # one line per original, all from the last slot, in module order
    assert lines == [(f"replica2.{n}", f"original.{n}") for n in names]
    assert "drawn for replica 2 only, every replica is the same" in g.draw().dot
    # the text form still names every dead end's missing edge
    assert g.text.count("⊣ no edge to") == len(DEVICES) * len(names)


def test_replicas_that_differ_keep_every_missing_edge():
    model = mlp()
    replicas = dpteach.replicate(model, DEVICES, strategy="clone")
    # rewire 0.weight in slot 0 only: its dead ends are no longer the same as the other slots'
    (out,) = ReduceAdd.apply(model[0].weight, replicas[0][0].weight.detach())
    del replicas[0][0]._parameters["weight"]
    replicas[0][0].weight = out
    x = torch.randn(6, 2)
    pieces = dpteach.scatter(x, DEVICES)
    outs = dpteach.parallel_apply(replicas, [(p,) for p in pieces], devices=DEVICES)
    g = autograd_graph(dpteach.gather(outs, "cpu").sum(), module=model, replicas=replicas)
    dot = g.draw().dot
    assert len(missing_lines(dot)) == len(g.dead_ends) == len(list(model.parameters())) * len(DEVICES) - 1
    assert "drawn for replica" not in dot
