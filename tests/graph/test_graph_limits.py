"""A drawing never keeps a notebook waiting on ``dot``: truncated pictures stay small, ``dot`` has a time limit."""

import shutil
import time

import pytest
import torch

pytest.importorskip("graphviz")

from dpteach.graph import autograd_graph, display  # noqa: E402
from dpteach.graph.view import MAX_NODES  # noqa: E402

needs_dot = pytest.mark.skipif(not shutil.which("dot"), reason="needs Graphviz's dot program")


def loop_graph(steps: int = 100):
    w = torch.randn(3, requires_grad=True)
    b = torch.randn(3, requires_grad=True)
    y = torch.randn(3)
    for _ in range(steps):
        y = y * w + b
    return autograd_graph(y.sum(), names={"w": w, "b": b})


def test_a_truncated_loop_keeps_few_edges_into_the_more_node():
    drawing = loop_graph().draw()
    view = drawing.view
    assert len(view.nodes) == MAX_NODES and view.nodes[-1].id == "more"
    into_more = [e for e in view.edges if e.dst == "more"]
    # every kept Mul/Add node leads to w or b, which the walk reaches last: one edge each was the
    # fan-in dot took minutes over
    assert 1 <= len(into_more) <= 3
    assert "drawn nodes lead into them" in view.nodes[-1].label
    # nothing here belongs to a module: the note does not claim a collapse that merged nothing
    assert not any("collapsed" in note for note in view.notes)
    assert any("left out" in note for note in view.notes)


@needs_dot
def test_a_loop_of_100_steps_shows_as_a_picture_in_seconds():
    graph = loop_graph()
    start = time.perf_counter()
    bundle = graph._repr_mimebundle_()
    seconds = time.perf_counter() - start
    assert "image/svg+xml" in bundle, bundle.get("text/plain", "")[-300:]
    assert seconds < display.DOT_SECONDS  # it took 0.1-0.2 s here; before, 327 s


@needs_dot
def test_dot_past_its_time_limit_gives_the_text_form_and_says_why(monkeypatch):
    monkeypatch.setattr(display, "DOT_SECONDS", 1e-4)
    graph = loop_graph(10)
    bundle = graph._repr_mimebundle_()
    assert set(bundle) == {"text/plain"}
    assert "did not lay this drawing out within" in bundle["text/plain"]
    assert "MulBackward0" in bundle["text/plain"]  # the text form itself
    with pytest.raises(display.LayoutTooSlow):
        graph.svg()


@needs_dot
def test_a_gpt2_small_step_under_rewire_draws_in_under_two_seconds(monkeypatch):
    transformers = pytest.importorskip("transformers")
    from dpteach.data_parallel import step

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config()).eval()  # GPT-2 small, no weights read
    ids = torch.randint(0, model.config.vocab_size, (2, 8))
    done = step(
        model,
        ids,
        ["cpu", "cpu"],
        strategy="rewire",
        loss_fn=lambda o: o.logits.pow(2).mean(),
        backward=False,
    )
    laid_out = []  # the node count of every drawing dot is asked to lay out
    render = display._render

    def counting(digraph_maker, fmt):
        laid_out.append(len(digraph_maker.__self__.view.nodes))
        return render(digraph_maker, fmt)

    monkeypatch.setattr(display, "_render", counting)
    start = time.perf_counter()
    graph = autograd_graph(done.loss, module=model, replicas=done.replicas)
    bundle = graph._repr_mimebundle_()
    seconds = time.perf_counter() - start
    assert len(graph.nodes) > 10 * MAX_NODES  # a real model's graph, far past the limit
    assert "image/svg+xml" in bundle, bundle.get("text/plain", "")[-300:]
    assert laid_out and max(laid_out) <= MAX_NODES
    assert seconds < 2.0, f"graph + drawing took {seconds:.2f} s"
