"""Pictures that compare cleanly: every replica laid out alike, the originals in module order, and the
strategy comparison two to a row at one scale. The positions come from dot itself
(``dot -Tplain``), so these fail if dot is left to reorder or mirror a box again."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import torch
from torch import nn

from dpteach.data_parallel import step
from dpteach.graph import autograd_graph, compare_strategies

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="needs Graphviz's dot program")
DEVICES = ["cpu", "cpu", "cpu"]


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 3), nn.Tanh(), nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))


def positions(dot_text: str) -> dict[str, tuple[float, float]]:
    """Node name -> (x, y) as dot lays it out."""
    laid = subprocess.run(
        ["dot", "-Tjson"], input=dot_text, capture_output=True, text=True, check=True
    ).stdout
    out = {}
    for obj in json.loads(laid).get("objects", []):
        if "pos" in obj and "nodes" not in obj:  # a node, not a cluster
            x, y = obj["pos"].split(",")
            out[obj["name"]] = (float(x), float(y))
    return out


def rows(pos: dict[str, tuple[float, float]], prefix: str) -> list[list[str]]:
    """The names (prefix dropped) of one replica's parameters, row by row from the top, left to right."""
    mine = {n.removeprefix(prefix): xy for n, xy in pos.items() if n.startswith(prefix)}
    by_y: dict[float, list[str]] = {}
    for name, (_x, y) in mine.items():
        by_y.setdefault(round(y, 2), []).append(name)
    return [sorted(names, key=lambda n: mine[n][0]) for _, names in sorted(by_y.items(), reverse=True)]


@needs_dot
@pytest.mark.parametrize("strategy", ["clone", "rewire", "broadcast"])
@pytest.mark.parametrize("compact", [False, True])
def test_replicas_alike_and_originals_in_module_order(strategy, compact):
    model = mlp()
    done = step(model, torch.randn(6, 2), DEVICES, strategy=strategy, backward=False)
    loss, replicas = done.loss, done.replicas
    g = autograd_graph(loss, module=model, replicas=replicas)
    pos = positions(g.draw(compact=compact).dot)
    layouts = [rows(pos, f"replica{s}.") for s in range(len(DEVICES))]
    assert layouts[0] and all(layout == layouts[0] for layout in layouts), layouts
    order = [name for name, _ in model.named_parameters()]
    originals = sorted((n for n in pos if n.startswith("original.")), key=lambda n: pos[n][0])
    assert [n.removeprefix("original.") for n in originals] == order
    for slot in range(len(DEVICES)):  # compact pictures too: on rows by depth, their lines looped back
        # each replica's copies left to right in module order too, on one row, so each copy's line to
        # its original runs beside the others' instead of across them (2.bias used to stand leftmost)
        copies = [f"replica{slot}.{name}" for name in order]
        assert sorted(copies, key=lambda n: pos[n][0]) == copies, [(n, pos[n]) for n in copies]
        assert len({round(pos[n][1], 2) for n in copies}) == 1, [(n, pos[n]) for n in copies]
    joins = [f"ReduceAddBackward[{name}]" for name in order]
    if strategy == "rewire":  # one ReduceAdd above each original, in the same order (2.bias's stood first)
        assert sorted(joins, key=lambda n: pos[n][0]) == joins, [(n, pos[n]) for n in joins]


def test_strategy_comparison_is_two_to_a_row_with_one_scale():
    pytest.importorskip("graphviz")
    if shutil.which("dot") is None:
        pytest.skip("needs Graphviz's dot program")
    model = mlp()
    comparison = compare_strategies(model, torch.randn(6, 2), DEVICES[:2])
    html = comparison.html()
    import re

    from dpteach.graph.compare import MIN_LABEL_PX, PER_ROW
    from dpteach.graph.dot import COMPACT_NODE

    columns = [int(w) for w in re.findall(r"minmax\(0,(\d+)fr\)", html)]
    natural = [int(w) for w in re.findall(r"max-width:(\d+)px", html)]
    # two columns for three pictures; one <img> per picture, each scaled to its column
    assert PER_ROW == 2 and len(columns) == PER_ROW and len(natural) == len(comparison) == 3
    assert html.count("width:100%;height:auto") == len(comparison)
    # each column as wide as the widest picture in it: every picture gets one scale
    assert columns == [max(natural[j::PER_ROW]) for j in range(PER_ROW)]
    # below the width where labels would shrink under MIN_LABEL_PX, the grid scrolls instead
    min_width = int(re.search(r"min-width:(\d+)px", html).group(1))
    font_px = float(COMPACT_NODE["fontsize"]) * 4 / 3
    assert font_px * (min_width - 6 * (len(columns) - 1)) / sum(columns) >= MIN_LABEL_PX - 0.05
    assert "overflow-x:auto" in html


def test_chapter_03_comparison_fits_notebook_width_with_readable_labels():
    pytest.importorskip("graphviz")
    if shutil.which("dot") is None:
        pytest.skip("needs Graphviz's dot program")
    import re

    from dpteach.course.story import make_data, make_model
    from dpteach.graph.compare import MIN_LABEL_PX
    from dpteach.graph.dot import COMPACT_NODE

    x, _ = make_data()
    html = compare_strategies(make_model(), x, DEVICES[:2]).html()  # chapter 03's model, on two slots
    row = sum(int(w) for w in re.findall(r"minmax\(0,(\d+)fr\)", html))
    font_px = float(COMPACT_NODE["fontsize"]) * 4 / 3
    # in a 1,000 px window (984 px of page, one 6 px gap) the labels are MIN_LABEL_PX or taller, no scrolling
    assert int(re.search(r"min-width:(\d+)px", html).group(1)) <= 984
    assert font_px * (984 - 6) / row >= MIN_LABEL_PX


def test_a_wide_graph_scales_to_the_cell():
    pytest.importorskip("graphviz")
    if shutil.which("dot") is None:
        pytest.skip("needs Graphviz's dot program")
    model = mlp()
    done = step(model, torch.randn(6, 2), DEVICES, strategy="clone", backward=False)
    loss, replicas = done.loss, done.replicas
    bundle = autograd_graph(loss, module=model, replicas=replicas)._repr_mimebundle_()
    # JupyterLab shows text/html before image/svg+xml: an <img> no wider than the cell
    assert 'style="max-width:100%;height:auto"' in bundle["text/html"]
    assert bundle["text/html"].count("<img") == 1 and "image/svg+xml" in bundle


def test_stepper_caption_wraps_inside_the_picture():
    import re
    from html import unescape

    from dpteach.widgets.highlight import CHAR_PT, caption, legend_line

    svg = '<svg width="300pt" height="200pt"\n viewBox="0.00 0.00 300.00 200.00" xmlns="x"><g/></svg>'
    out = caption(svg, legend_line())
    lines = [unescape(t) for t in re.findall(r"<tspan[^>]*>(.*?)</tspan>", out)]
    # every word is there, every line fits the 300 pt picture, and the viewBox grew by as many lines
    words = [w for w in " ".join(lines).split() if w != "·"]  # a break between entries drops the dot
    assert words == [w for w in legend_line().split() if w != "·"] and len(lines) > 1
    assert all(6 + len(line) * CHAR_PT <= 300 for line in lines)
    top, height = (float(v) for v in re.search(r'viewBox="[-\d.]+ ([-\d.]+) [\d.]+ ([\d.]+)"', out).groups())
    ys = [float(y) for y in re.findall(r'<tspan x="[-\d.]+" y="([-\d.]+)"', out)]
    assert top < ys[0] < ys[-1] < 0 and height > 200


def _holding(tensors: dict[str, torch.Tensor], order: list[str]) -> nn.Module:
    """Chapter 10's helper: a module holding these tensors (not copies), in ``order`` (the model's own)."""
    root = nn.Module()
    for name in order:
        *path, key = name.split(".")
        module = root
        for part in path:
            module = module._modules.setdefault(part, nn.Module())
        module._parameters[key] = tensors[name]
    return root


@needs_dot
@pytest.mark.parametrize("strategy", ["clone", "rewire"])
def test_cpp_replicas_drawn_like_python(strategy):
    """Chapter 10: the C++ step's graph, drawn with Python's drawing, puts every node where Python's does."""
    from dpteach import cpp

    if cpp.compiler() is None:
        pytest.skip("no C++ compiler found: chapter 10's extension cannot be built")
    if cpp.load(progress=False)[0] is None:
        pytest.skip("chapter 10's extension did not build here")
    torch.manual_seed(0)
    model, x, devices = nn.Linear(3, 2), torch.randn(6, 3), DEVICES[:2]
    cpp_step = (cpp.clone_step if strategy == "clone" else cpp.rewire_step)(model, x, devices)
    order = [name for name, _ in model.named_parameters()]
    cpp_graph = autograd_graph(
        cpp_step.output,
        module=_holding(cpp_step.params, order),
        replicas=[_holding(params, order) for params in cpp_step.replica_params],
    )
    done = step(model, x, devices, strategy=strategy, loss_fn=lambda out: out, backward=False)
    loss, replicas = done.loss, done.replicas
    py_graph = autograd_graph(loss, module=model, replicas=replicas)
    cpp_pos, py_pos = positions(cpp_graph.draw().dot), positions(py_graph.draw().dot)
    for slot in range(len(devices)):
        # each replica's parameters in the same rows and the same left-to-right order as Python's
        assert rows(cpp_pos, f"replica{slot}.") == rows(py_pos, f"replica{slot}."), slot
    originals = sorted((n for n in cpp_pos if n.startswith("original.")), key=lambda n: cpp_pos[n][0])
    # the originals in the model's order (C++ hands its tensors back sorted by name: bias first)
    assert [n.removeprefix("original.") for n in originals] == order


@needs_dot
def test_a_hand_rewired_replica_keeps_module_order():
    """Chapter 03's step 2: 0.weight rewired by hand, the rest still dead ends. A second crossing
    pass of dot once moved the copies against their tied row (2.bias first, the originals too)."""
    from dpteach.replicate import ReduceAdd

    model = mlp()
    replicas = dpteach_replicate(model)
    outputs = ReduceAdd.apply(model[0].weight, *[r[0].weight.detach() for r in replicas])
    for replica, out in zip(replicas, outputs):
        del replica[0]._parameters["weight"]
        replica[0].weight = out
    loss = gather_loss(replicas)
    pos = positions(autograd_graph(loss, module=model, replicas=replicas).draw().dot)
    order = [name for name, _ in model.named_parameters()]
    for prefix in ["original."] + [f"replica{s}." for s in range(len(DEVICES))]:
        names = [prefix + name for name in order]
        assert sorted(names, key=lambda n: pos[n][0]) == names, [(n, pos[n]) for n in names]


def dpteach_replicate(model):
    import dpteach

    return dpteach.replicate(model, DEVICES, strategy="clone")


def gather_loss(replicas):
    import dpteach

    torch.manual_seed(1)
    pieces = dpteach.scatter(torch.randn(6, 2), DEVICES)
    outputs = dpteach.parallel_apply(replicas, [(p,) for p in pieces], devices=DEVICES)
    return dpteach.gather(outputs, DEVICES[0]).pow(2).mean()
