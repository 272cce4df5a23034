"""Drawings: golden DOT text (no `dot` needed), the text fallback without Graphviz, SVG when `dot` is there.

Golden files live in tests/graph/golden/. After a deliberate change to the drawings, regenerate them with

    DPTEACH_REGEN_GOLDEN=1 python -m pytest tests/graph

and review the diff of the .dot files like any other code change. Under CI (``CI=true``, as GitHub
Actions sets it) regeneration is refused: a CI run that rewrote the goldens would compare the drawings
with themselves and pass whatever they show.
"""

from __future__ import annotations

import difflib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from dpteach.data_parallel import step
from dpteach.graph import GraphvizMissing, autograd_graph, compare_strategies, graph_diff
from dpteach.replicate import STRATEGIES as REGISTRY

GOLDEN = Path(__file__).parent / "golden"
REGEN = os.environ.get("DPTEACH_REGEN_GOLDEN") == "1"
UNDER_CI = os.environ.get("CI", "").lower() in ("true", "1")
HAS_DOT = shutil.which("dot") is not None
STRATEGIES = list(REGISTRY)
DEVICES = ["cpu", "cpu"]


def check_golden(name: str, text: str) -> None:
    """``text`` equals the reviewed golden file ``name``; with DPTEACH_REGEN_GOLDEN=1 (never under CI) it becomes it."""
    path = GOLDEN / f"{name}.dot"
    if REGEN:
        if UNDER_CI:
            pytest.fail(
                "DPTEACH_REGEN_GOLDEN=1 is refused under CI: regenerate on a workstation and commit the diff"
            )
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return
    assert path.exists(), f"no golden file {path}; create it with DPTEACH_REGEN_GOLDEN=1"
    expected = path.read_text(encoding="utf-8")
    diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True), "golden", "now"))
    # the drawing is exactly the reviewed one (regenerate with DPTEACH_REGEN_GOLDEN=1 if the change is wanted)
    assert text == expected, f"{path.name} changed:\n{diff[:4000]}"


MODELS = {
    "linear": (lambda: nn.Linear(2, 1), lambda: torch.randn(4, 2)),
    "mlp": (lambda: nn.Sequential(nn.Linear(2, 3), nn.Tanh(), nn.Linear(3, 1)), lambda: torch.randn(4, 2)),
}


def strategy_graph(model_name: str, strategy: str):
    make_model, make_x = MODELS[model_name]
    model = make_model()
    done = step(model, make_x(), DEVICES, strategy=strategy, backward=False)
    loss, replicas = done.loss, done.replicas
    return autograd_graph(loss, module=model, replicas=replicas, title=f"{model_name}, strategy={strategy!r}")


class Block(nn.Module):
    """A residual conv block: enough structure for collapse= to have modules to merge."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x):
        return torch.relu(self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))) + x)


def convnet() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        Block(4),
        Block(4),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4, 2),
    )


@pytest.mark.parametrize("model_name", list(MODELS))
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_golden_dot(model_name, strategy):
    check_golden(f"{model_name}_{strategy}", strategy_graph(model_name, strategy).dot)


def test_golden_dot_of_a_tiny_named_graph():
    w = torch.tensor(2.0, requires_grad=True)
    b = torch.tensor(0.5, requires_grad=True)
    h = w * torch.tensor(3.0)
    check_golden("tiny_named", autograd_graph((h + b) ** 2, names={"w": w, "b": b, "h": h}).dot)


def test_golden_dot_collapsed_by_module():
    model = convnet()
    done = step(model, torch.randn(2, 3, 6, 6), DEVICES, strategy="rewire", backward=False)
    loss, replicas = done.loss, done.replicas
    check_golden(
        "convnet_rewire_collapse1", autograd_graph(loss, module=model, replicas=replicas).draw(collapse=1).dot
    )


def test_golden_dot_of_the_diff():
    before, after = strategy_graph("mlp", "clone"), strategy_graph("mlp", "rewire")
    check_golden("mlp_diff_clone_rewire", graph_diff(before, after).dot)


def test_legend_lists_what_the_picture_uses():
    clone, rewire = strategy_graph("mlp", "clone").dot, strategy_graph("mlp", "rewire").dot
    # clone's picture explains dead ends and the missing edge, and has no ReduceAdd entry
    assert "dead end: the gradient stops here" in clone and "no edge: clone() made a fresh leaf" in clone
    assert "joins the replicas to the original" not in clone
    # rewire's picture explains the joining node and has no dead-end entry
    assert "joins the replicas to the original" in rewire and "dead end:" not in rewire


def test_one_cluster_per_replica_slot_and_one_for_the_original():
    dot = strategy_graph("mlp", "rewire").dot
    # a box per slot, and the original module's box holding the ReduceAdd nodes
    for name in ("cluster_replica0", "cluster_replica1", "cluster_original"):
        assert f"subgraph {name}" in dot, name
    assert "cluster_replica2" not in dot


def test_collapse_and_node_limit():
    model = convnet()
    done = step(model, torch.randn(2, 3, 6, 6), DEVICES, strategy="clone", backward=False)
    loss, replicas = done.loss, done.replicas
    g = autograd_graph(loss, module=model, replicas=replicas)
    full = g.draw(collapse=False, max_nodes=None).view.nodes
    one = g.draw(collapse=1).view.nodes
    # collapsing merges nodes, and the merged nodes account for all the nodes they stand for
    assert len(one) < len(full) and sum(n.members for n in one) == len(full)
    # a merged replica group keeps the verdict: under clone every group is a dead end
    assert all(n.dead_end for n in one if n.kind == "replica")
    few = g.draw(collapse=False, max_nodes=10).view
    # the node limit keeps 9 nodes and one that counts the rest
    assert len(few.nodes) == 10 and few.nodes[-1].id == "more" and str(len(full) - 9) in few.nodes[-1].label
    auto = g.draw(max_nodes=len(full) - 1).view
    # over the limit and not told otherwise, the drawing collapses by module and says so
    assert len(auto.nodes) < len(full) and "collapsed by module" in auto.notes[0]


@pytest.fixture
def no_dot(monkeypatch, tmp_path):
    """A machine where Graphviz's dot program is not on PATH."""
    monkeypatch.setenv("PATH", str(tmp_path))


def test_without_dot_shows_text_and_one_sentence(no_dot):
    g = strategy_graph("mlp", "clone")
    bundle = g._repr_mimebundle_()
    # no picture, no exception: the text form, then how to get dot
    assert set(bundle) == {"text/plain"}
    assert "replica 1 · 0.weight · cpu" in bundle["text/plain"] and "DEAD END" in bundle["text/plain"]
    assert "Graphviz's `dot` program was not found" in bundle["text/plain"]
    assert g._repr_svg_() is None
    # asked for explicitly, the picture raises with the same sentence
    with pytest.raises(GraphvizMissing, match="apt-get install graphviz"):
        g.svg()
    # the DOT text needs no dot program
    assert g.dot.startswith("digraph")


def test_without_the_graphviz_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "graphviz", None)  # `import graphviz` now raises ImportError
    g = strategy_graph("mlp", "rewire")
    bundle = g._repr_mimebundle_()
    # the text form and the install hint, never an exception
    assert set(bundle) == {"text/plain"} and "pip install graphviz" in bundle["text/plain"]
    assert "ReduceAddBackward[0.weight]" in bundle["text/plain"]


def test_diff_and_comparison_without_dot(no_dot):
    torch.manual_seed(0)
    model = MODELS["mlp"][0]()
    comparison = compare_strategies(model, torch.randn(4, 2), DEVICES)
    bundle = comparison._repr_mimebundle_()
    # side by side becomes one text after another, with the hint
    assert set(bundle) == {"text/plain"} and "=== strategy 'rewire' ===" in bundle["text/plain"]
    assert "was not found" in bundle["text/plain"]
    diff_text = comparison.diff("clone", "rewire")._repr_mimebundle_()["text/plain"]
    # the diff's text lists the edges the fix added
    assert "+ replica0.0.weight → ReduceAddBackward[0.weight]" in diff_text


@pytest.mark.skipif(not HAS_DOT, reason="Graphviz's dot program is not installed")
def test_svg_when_dot_is_there(tmp_path):
    g = strategy_graph("mlp", "rewire")
    svg = g._repr_svg_()
    # dot drew it, labels and legend included
    assert svg.lstrip().startswith("<?xml") or "<svg" in svg[:500]
    assert "ReduceAddBackward" in svg and "legend" in svg
    assert g._repr_mimebundle_()["image/svg+xml"] == svg
    png = g.save(str(tmp_path / "rewire.png"))
    # a PNG file was written
    assert Path(png).read_bytes()[:4] == b"\x89PNG"


@pytest.mark.skipif(not HAS_DOT, reason="Graphviz's dot program is not installed")
def test_comparison_draws_three_pictures_side_by_side():
    torch.manual_seed(0)
    comparison = compare_strategies(MODELS["mlp"][0](), torch.randn(4, 2), DEVICES)
    html = comparison._repr_mimebundle_()["text/html"]
    # one image per strategy in one grid row
    assert html.count("<img") == 3 and "display:grid" in html
    # and its summary says which strategy has dead ends
    assert "clone: 8 dead ends" in repr(comparison) and "rewire: 0 dead ends" in repr(comparison)


def test_import_dpteach_does_not_import_graphviz():
    code = (
        "import sys, dpteach, torch; g = dpteach.autograd_graph(torch.ones(1, requires_grad=True) * 2); "
        "g.text; assert 'graphviz' not in sys.modules, 'graphviz imported'"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    # the core and the text form need torch alone
    assert result.returncode == 0, result.stderr


def test_compact_drawing_for_side_by_side():
    g = strategy_graph("mlp", "clone")
    dot = g.draw(compact=True, legend=False).dot
    # names only, no status lines and no legend; the colours still mark the dead ends
    assert "dead end:" not in dot and "cluster_legend" not in dot and "#ef9a9a" in dot
    assert 'label="0.weight"' in dot
    n = len(list(MODELS["mlp"][0]().parameters()))
    # the short title keeps the verdict
    assert g.short_title.endswith(f"0/{n} originals reached, {len(DEVICES) * n} dead ends")


def test_legend_html_lists_the_entries_of_all_pictures():
    from dpteach.graph.legend import legend_html

    views = [strategy_graph("mlp", s).draw().view for s in STRATEGIES]
    html = legend_html(views)
    # the union: clone's dead ends and rewire's ReduceAdd in one legend
    assert "dead end" in html and "joins the replicas" in html and "#19540" in html


def test_png_format(monkeypatch):
    from dpteach.graph import display, set_jupyter_format

    with pytest.raises(ValueError, match="svg"):
        set_jupyter_format("gif")
    monkeypatch.setitem(display._FORMAT, "jupyter", "svg")
    assert set_jupyter_format("png") == "svg"
    g = strategy_graph("linear", "rewire")
    if HAS_DOT:
        bundle = g._repr_mimebundle_()
        # PNG for front ends that crop SVG, and no SVG alongside it
        assert "image/png" in bundle and "image/svg+xml" not in bundle and g._repr_svg_() is None
    else:
        assert set(g._repr_mimebundle_()) == {"text/plain"}


@pytest.mark.multigpu
def test_each_gpu_gets_its_own_tint():
    model = MODELS["mlp"][0]().to("cuda:0")
    done = step(
        model, torch.randn(4, 2, device="cuda:0"), ["cuda:0", "cuda:1"], strategy="rewire", backward=False
    )
    loss, replicas = done.loss, done.replicas
    dot = autograd_graph(loss, module=model, replicas=replicas).dot
    from dpteach.graph.legend import device_tint

    # the two slots' boxes are tinted by their devices, and the tints differ
    assert device_tint("cuda:0") != device_tint("cuda:1")
    assert f'fillcolor="{device_tint("cuda:0")}"' in dot and f'fillcolor="{device_tint("cuda:1")}"' in dot


def test_big_drawings_leave_out_the_original_box():
    from dpteach.graph.view import MAX_NODES

    model = nn.Sequential(*[nn.Linear(2, 2) for _ in range(30)])
    done = step(model, torch.randn(4, 2), DEVICES, strategy="rewire", backward=False)
    loss, replicas = done.loss, done.replicas
    g = autograd_graph(loss, module=model, replicas=replicas)
    big = g.draw(collapse=False, max_nodes=None)
    assert len(big.view.nodes) > MAX_NODES
    # every node is drawn, the replicas keep their boxes, the original module's box (slow for dot) is left out
    assert "subgraph cluster_replica1" in big.dot and "cluster_original" not in big.dot
    # while the default drawing collapses to under the limit and keeps it
    assert len(g.draw().view.nodes) <= MAX_NODES and "cluster_original" in g.dot


def test_golden_regeneration_is_refused_under_ci(monkeypatch, tmp_path):
    monkeypatch.setattr(sys.modules[__name__], "REGEN", True)
    monkeypatch.setattr(sys.modules[__name__], "UNDER_CI", True)
    monkeypatch.setattr(sys.modules[__name__], "GOLDEN", tmp_path)
    with pytest.raises(pytest.fail.Exception, match="refused under CI"):
        check_golden("anything", "digraph {}")
    assert not list(tmp_path.iterdir())  # nothing was written
