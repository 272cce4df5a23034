"""Chapter 02: the cells that read graphs by hand show what their prose says.

The cells are found by their tags and run here in a namespace holding what the chapter's earlier
cells made; where a check could pass by accident, it is also run on a case where it must not.
"""

from __future__ import annotations

import ast
import contextlib
import io
import re
from pathlib import Path

import nbformat
import pytest
import torch
from torch import nn

from dpteach import autograd_graph
from dpteach.graph import GraphvizMissing
from dpteach.graph.display import Drawing

ROOT = Path(__file__).resolve().parents[2]
CHAPTER = ROOT / "notebooks" / "02_reading_autograd_graphs.ipynb"
TAGS = [
    "dead-end",
    "walk",
    "walk-twice",
    "unreached",
    "frozen",
    "drawn",
    "same-after",
    "freed",
    "copies",
    "leaves",
    "before-after",
    "kept",
    "task1-intro",
    "fills",
    "chain-rule",
]
DETAILS = re.compile(r"<details\b.*?</details>", re.S | re.I)


def _cell(tag: str):
    (cell,) = [c for c in nbformat.read(CHAPTER, as_version=4).cells if tag in c.metadata.get("tags", [])]
    return cell


def run_cells(namespace: dict, *tags: str) -> str:
    """Run the tagged code cells, in order, in ``namespace``; what they print."""
    namespace.setdefault("torch", torch)
    namespace.setdefault("nn", nn)
    namespace.setdefault("autograd_graph", autograd_graph)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for tag in tags:
            exec(_cell(tag).source, namespace)
    return out.getvalue()


def chapter_start():
    """``w`` and ``x`` as the chapter's first cells make them."""
    return {"w": torch.tensor(2.0, requires_grad=True), "x": torch.tensor(3.0)}


@pytest.mark.parametrize("tag", TAGS)
def test_each_cell_the_tests_read_carries_its_tag_once(tag):
    assert _cell(tag).source.strip()  # _cell unpacks exactly one cell


def test_walk_names_each_leaf_it_reaches():
    lines = run_cells(chapter_start(), "walk").splitlines()
    assert [line.strip() for line in lines if "AccumulateGrad" in line] == [
        "AccumulateGrad  -> w.grad",
        "AccumulateGrad  -> b.grad",
    ]


def test_walk_finds_a_leaf_by_identity_not_by_value():
    ns = chapter_start()
    run_cells(ns, "walk")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        ns["walk"](
            ns["loss"].grad_fn, {"w": ns["w"].detach().clone(), "b": ns["b"]}
        )  # an equal tensor, not w
    assert "AccumulateGrad  (a leaf of shape ())" in out.getvalue() and "-> w.grad" not in out.getvalue()


def test_a_leaf_used_twice_shows_twice_and_is_one_node():
    ns = chapter_start()
    run_cells(ns, "walk")  # defines walk and b
    twice = run_cells(ns, "walk-twice")
    assert twice.count("-> w.grad") == 2 and twice.count("-> b.grad") == 1
    assert "both lines for w are one node: True" in twice
    w, x, b = ns["w"], ns["x"], ns["b"]
    summed = 2 * w.item() * x.item() + b.item()  # d/dw of (w*x + b)*w, both uses added
    assert summed == 13.0 and f"w's AccumulateGrad ran 1 time, on the gradient {summed}" in twice
    assert w.grad.item() == summed  # the one run wrote the sum


def test_the_title_counts_what_the_prose_says_it_counts():
    ns = {**chapter_start(), "b": torch.tensor(1.0, requires_grad=True)}
    run_cells(ns, "drawn")
    assert ns["drawn"].title == "3 backward functions, 2 leaves"  # w and b; x, a leaf too, is not counted
    assert ns["x"].is_leaf and not ns["x"].requires_grad
    prose = next(c.source for c in nbformat.read(CHAPTER, as_version=4).cells if "**The title**" in c.source)
    assert "3 backward functions and 2 leaves, the leaves that require grad" in prose
    assert "`param` in the top picture" in prose


def test_the_top_picture_counts_param_though_the_loss_never_reaches_it():
    ns = {}
    run_cells(ns, "dead-end")
    param, param_copy = ns["param"], ns["param_copy"]
    top = autograd_graph(ns["loss"], names={"param": param, "param_copy": param_copy})
    assert top.title == "2 backward functions, 2 leaves" and param.grad is None  # param_copy and param
    alone = autograd_graph(ns["loss"], names={"param_copy": param_copy})
    assert alone.title == "2 backward functions, 1 leaf"  # unnamed, param is neither drawn nor counted


def test_the_gradients_are_the_chain_rules_after_an_earlier_backward_too():
    ns = {**chapter_start(), "b": torch.tensor(1.0, requires_grad=True)}
    run_cells(ns, "drawn")
    (ns["w"] * ns["x"] + ns["b"]).backward()  # what a learner may add when changing `loss` above
    assert ns["w"].grad is not None
    assert "w.grad: tensor(42.)" in run_cells(ns, "fills", "chain-rule")


def test_unreached_lists_the_layer_the_loss_never_uses():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 1))
    batch = torch.randn(8, 2)
    graph = autograd_graph(model(batch).pow(2).mean(), module=model)
    ns = {"model": model, "batch": batch, "graph": graph}
    lines = run_cells(ns, "unreached").splitlines()
    assert lines[0] == "whole model: ()"
    assert lines[1].endswith("unreached: (original 2.weight, original 2.bias)")
    last = _cell("unreached").source.strip().splitlines()[-1]
    assert last.split("#")[0].strip() == "skipping"  # the cell draws it: the dashed boxes on a real model
    assert ns["skipping"].text.count("never reached") == 2


def test_the_graph_after_backward_is_the_one_before():
    ns = chapter_start()
    run_cells(ns, "walk", "drawn")  # walk, b, then the drawn loss (h + b) ** 2
    before, dot = run_cells(ns, "same-after"), ns["drawn"].dot
    ns["loss"].backward()
    after = run_cells(ns, "same-after")
    assert after == before and "AccumulateGrad  -> w.grad" in after and "PowBackward0" in after
    names = {"w": ns["w"], "x": ns["x"], "b": ns["b"], "h": ns["h"]}
    assert autograd_graph(ns["loss"], names=names).dot == dot  # the prose: autograd_graph works after it too
    assert autograd_graph(ns["loss"] * 2, names=names).dot != dot  # and the comparison can fail


def test_backward_freed_the_saved_tensor_and_kept_the_saved_number():
    ns = {**chapter_start(), "b": torch.tensor(1.0, requires_grad=True)}
    run_cells(ns, "drawn", "fills")  # (h + b) ** 2, then its backward()
    lines = run_cells(ns, "freed").splitlines()
    assert lines[0] == "the exponent it saved, a plain number, is kept: 2"
    assert lines[1].startswith(
        "the tensor it saved is freed: Trying to backward through the graph a second time"
    )
    message = lines[1].split(": ", 1)[1]
    with pytest.raises(RuntimeError) as again:  # the prose: a second backward() stops with that message
        ns["loss"].backward()
    assert str(again.value).startswith(message.rstrip("."))
    ns = {**chapter_start(), "b": torch.tensor(1.0, requires_grad=True)}
    run_cells(ns, "drawn")  # no backward yet: the saved tensor is still there, so nothing prints as freed
    assert "freed" not in run_cells(ns, "freed")


def _count(graph, kind: str) -> int:
    return sum(line.lstrip(" │├└─") == kind for line in graph.text.splitlines())  # past the tree marks


def test_the_frozen_weight_drops_out_of_the_count_and_takes_its_transpose_with_it():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 1))
    batch = torch.randn(8, 2)
    whole = autograd_graph(model(batch).pow(2).mean(), module=model)
    ns = {"model": model, "batch": batch}
    assert run_cells(ns, "frozen").strip() == "unreached: ()"
    frozen = ns["frozen"]
    assert len(list(model.parameters())) == 4 and model[0].weight.requires_grad  # frozen for the cell only
    assert whole.title.endswith("4 of 4 parameters") and frozen.title.endswith("3 of 3 parameters")
    assert _count(whole, "TBackward0") == 2 and _count(frozen, "TBackward0") == 1  # 0.weight's is gone
    assert "0.weight" in whole.text and "0.weight" not in frozen.text


def test_the_copies_give_the_gradient_to_param_only_through_the_differentiable_one():
    ns = {}
    lines = run_cells(ns, "copies", "kept").splitlines()
    assert lines[0].endswith("param.grad None")  # the dead end: param got nothing
    assert lines[1] == "through param_clone: param.grad tensor(36.)"
    assert ns["param_copy"].grad is not None and ns["param_copy"].is_leaf


def test_the_dead_end_and_the_kept_copy_sit_in_one_row():
    ns = {}
    run_cells(ns, "copies", "before-after")
    html = ns["pair"].data
    assert html.count("<img ") == 2 and "grid-template-columns" in html
    assert 'alt="dead end: param.detach().clone()"' in html and 'alt="kept: param.clone()"' in html
    assert "never reached" in ns["left"].text and "never reached" not in ns["right"].text


def test_the_pair_prints_its_text_without_graphviz(monkeypatch):
    def missing(self):
        raise GraphvizMissing("no dot here")

    monkeypatch.setattr(Drawing, "html", missing)
    ns = {}
    printed = run_cells(ns, "copies", "before-after")
    assert ns["pair"] is None
    assert "dead end: param.detach().clone()" in printed and "kept: param.clone()" in printed


def test_task_1_intro_keeps_reduce_add_and_member_fields_in_a_fold():
    text = _cell("task1-intro").source
    main, folds = DETAILS.sub(" ", text), "".join(DETAILS.findall(text))
    assert "ReduceAdd" not in main and "member field" not in main
    assert "another GPU" in main  # the plain reason every slot after slot 0 owns its memory
    assert "`.to` returns the tensor itself" in main  # why param.to(device) fails that requirement here
    assert "clone.py" not in main and "detach=False" not in main  # the stub's asides sit in a fold
    x = torch.ones(2)
    assert x.to(x.device) is x  # the sentence holds: on its own device .to hands back the tensor itself
    assert "ReduceAdd" in folds and "chapter 03" in folds.lower() and "chapter 04" in folds.lower()


def _assigned(source: str) -> set[str]:
    """The names a cell's top-level statements assign (``a = ...``, ``first, second = ...``)."""
    names = set()
    for node in ast.parse(source).body:
        for target in getattr(node, "targets", []):
            names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    return names


def test_exercise_1_names_its_tensors_afresh_and_its_check_passes_the_answer():
    cells = nbformat.read(CHAPTER, as_version=4).cells
    at = cells.index(_cell("leaves"))
    earlier = set().union(*(_assigned(c.source) for c in cells[:at] if c.cell_type == "code"))
    ns = {}
    run_cells(ns, "leaves")
    names = set(ns["your_answer"])
    assert names and not names & earlier, f"{names & earlier} already named a tensor earlier in the chapter"
    from dpteach.course import checks

    truth = {k: ns[k].is_leaf for k in names}
    assert checks.leaves(truth, {k: ns[k] for k in names}).ok
    answer = next(c.source for c in cells[at:] if "<summary>Answer</summary>" in c.source)
    assert all(f"`{k}`" in answer or f"{k}: {truth[k]}" in answer for k in names)  # the answer uses them
