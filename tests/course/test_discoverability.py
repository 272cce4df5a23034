"""What a newcomer meets first: tab completion, the way to a step's replicas, and the messages of
common slips (a bare device string, a tensor with no history, a misspelt strategy)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import dpteach
from dpteach.graph.autograd import no_history


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 4), nn.Tanh(), nn.Linear(4, 1))


def test_dir_lists_public_names_and_wings_and_nothing_stray():
    names = dir(dpteach)
    for wanted in ("autograd_graph", "graph_diff", "keep_replicas", "DataParallel", "replicate"):
        assert wanted in names
    for wing in ("graph", "widgets", "exercises", "course", "measure", "cpp", "distributed"):
        assert wing in names, wing
    stray = [
        n for n in names if not n.startswith("__") and n not in dpteach.__all__ and n not in dpteach._LAZY
    ]
    assert stray == [], f"dir(dpteach) shows names that are not public: {stray}"
    assert "annotations" not in names and "submodules" not in names


def test_every_name_dir_lists_resolves():
    for name in dir(dpteach):
        assert getattr(dpteach, name) is not None, name  # a lazy wing or graph function imports on first use


def test_keep_replicas_at_top_level_gives_replicas_for_autograd_graph():
    model = _model()
    dp = dpteach.DataParallel(model, ["cpu", "cpu"], strategy="clone")
    with dpteach.keep_replicas(dp) as replicas:
        loss = dp(torch.randn(8, 2)).pow(2).mean()
    assert len(replicas) == 2
    graph = dpteach.autograd_graph(loss, module=model, replicas=replicas)
    assert len(graph.dead_ends) == 8  # under "clone" each of 4 parameters in 2 replicas is a dead end
    assert len(graph.unreached) == 4
    assert "keep_replicas" in dpteach.DataParallel.__doc__


@pytest.mark.parametrize(
    "call",
    [
        lambda m: dpteach.DataParallel(m, "cpu"),
        lambda m: dpteach.replicate(m, "cpu"),
        lambda m: dpteach.data_parallel(m, torch.randn(4, 2), "cpu"),
    ],
)
def test_bare_device_string_is_refused_with_the_fix(call):
    with pytest.raises(TypeError, match=r"\['cpu', 'cpu'\]"):
        call(_model())


def test_bare_torch_device_is_refused_too():
    with pytest.raises(TypeError, match="list of slots"):
        dpteach.DataParallel(_model(), torch.device("cpu"))


def test_no_history_under_no_grad_is_explained_in_one_line():
    model = _model()
    with torch.no_grad():
        out = model(torch.randn(3, 2))
    graph = dpteach.autograd_graph(out, module=model)
    assert graph.no_history and "no_grad" in graph.no_history and "\n" not in graph.no_history
    assert graph._repr_mimebundle_() == {"text/plain": graph.no_history}  # no empty picture
    assert str(graph) == graph.no_history


def test_no_history_names_leaf_inference_and_requires_grad():
    assert "leaf" in no_history([torch.randn(2, requires_grad=True)])
    assert "requires_grad=False" in no_history([torch.randn(2)])
    with torch.inference_mode():
        made = torch.randn(2) * 2
    assert "inference_mode" in no_history([made])


def test_a_graph_with_history_has_no_explanation():
    model = _model()
    graph = dpteach.autograd_graph(model(torch.randn(3, 2)).sum(), module=model)
    assert graph.no_history is None
    assert graph.title.startswith("the gradient reaches 4 of 4")


def test_unknown_strategy_says_did_you_mean():
    with pytest.raises(ValueError, match="did you mean 'rewire'"):
        dpteach.DataParallel(_model(), ["cpu", "cpu"], strategy="rewired")
    with pytest.raises(ValueError, match="did you mean 'broadcast'"):
        dpteach.replicate(_model(), ["cpu", "cpu"], strategy="brodcast")


def test_unrelated_strategy_name_gets_no_guess():
    with pytest.raises(ValueError) as err:
        dpteach.replicate(_model(), ["cpu", "cpu"], strategy="zzz")
    assert "did you mean" not in str(err.value) and "'clone', 'rewire', 'broadcast'" in str(err.value)
