"""The DOT text dot.py writes without graphviz.Digraph.node/edge is the text those would write."""

from __future__ import annotations

import warnings

import pytest

graphviz = pytest.importorskip("graphviz")

from dpteach.graph.dot import _Statements  # noqa: E402

TRICKY = [
    "output",
    "AddmmBackward0_1",
    "original.0.weight",
    "ReduceAddBackward[0.weight]",
    "replica1.layer1.*",
    "node",
    "Node",
    "EDGE",
    "strict",
    "12",
    "-1.5",
    ".5",
    "1.",
    "a b",
    "",
    "x:y",
    "x:y:n",
    "replica 0 · cpu",
    "two\nlines",
    'say "hi"',
    "ends in \\",
    "ends in \\\\",
    "<b>html</b>",
    "<not html",
    "#e0e0e0",
    "rounded,filled",
    "fillcolor",
    "café",
    "_under",
]


@pytest.mark.parametrize("text", TRICKY)
def test_node_and_edge_lines_match_graphviz(text):
    ours, theirs = graphviz.Digraph(), graphviz.Digraph()
    attrs = {"label": text, "fillcolor": "#e0e0e0", "style": "rounded,filled", "tooltip": text}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # graphviz warns about an odd trailing backslash; so be it
        put = _Statements()
        put.node(ours, text, attrs)
        put.edge(ours, text, "output", {"color": text})
        theirs.node(text, **attrs)
        theirs.edge(text, "output", color=text)
    # the same lines, byte for byte, as graphviz's own node() and edge()
    assert ours.source == theirs.source
