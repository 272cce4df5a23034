"""The double-backward picture (chapter 07): what create_graph=True recorded, in a box of its own, and notes."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F

import dpteach
from dpteach.graph.legend import legend_label

DEVICES = ["cpu", "cpu"]


def penalty_graph():
    torch.manual_seed(0)
    small = torch.nn.Linear(2, 1, bias=False)
    replicas = dpteach.replicate(small, DEVICES)
    x, y = torch.randn(4, 2), torch.randn(4, 1)
    out = dpteach.gather(
        dpteach.parallel_apply(replicas, [(p,) for p in dpteach.scatter(x, DEVICES)], devices=DEVICES), "cpu"
    )
    loss = F.mse_loss(out, y)
    grads = torch.autograd.grad(loss, list(small.parameters()), create_graph=True)
    penalty = grads[0].pow(2).sum()
    names = {"grad weight": grads[0]}
    marked = dpteach.autograd_graph(
        penalty, module=small, replicas=replicas, names=names, create_graph=(loss, grads)
    )
    plain = dpteach.autograd_graph(penalty, module=small, replicas=replicas, names=names)
    forward = dpteach.autograd_graph(loss, module=small, replicas=replicas)
    return marked, plain, forward


def test_recorded_nodes_are_what_the_first_backward_added():
    marked, plain, forward = penalty_graph()
    ops = {n.id: n.op for n in marked.nodes.values() if n.kind in ("op", "join")}
    recorded_ops = sorted(ops[i] for i in marked.recorded)
    # the first backward's records: Broadcast's backward, Gather's, MseLoss's, and the matmul backward's ops
    assert "ReduceAddCoalescedBackward" in recorded_ops and "ScatterBackward" in recorded_ops
    assert "MseLossBackwardBackward0" in recorded_ops
    # nothing of the forward graph is marked, nor the penalty's own ops above the gradient
    forward_ops = {n.op for n in forward.nodes.values() if n.kind in ("op", "join")}
    assert not {"GatherBackward", "BroadcastBackward"} & set(recorded_ops)
    assert {"GatherBackward", "BroadcastBackward"} <= forward_ops
    assert not {"PowBackward0", "SumBackward0"} & set(recorded_ops)
    # the same forward graph and penalty ops are there, unmarked, in the penalty's graph
    assert set(ops.values()) - set(recorded_ops) >= {"GatherBackward", "BroadcastBackward", "PowBackward0"}
    # without create_graph= nothing is marked, and the nodes are the same
    assert plain.recorded == frozenset() and set(plain.nodes) == set(marked.nodes)


def test_recorded_box_legend_and_notes_in_the_dot_text():
    pytest.importorskip("graphviz")
    marked, plain, _ = penalty_graph()
    drawing = marked.draw(notes={"ReduceAddCoalescedBackward_1": "the check stops rewire here"})
    dot = drawing.dot
    # a box of its own, labelled, holding ReduceAddCoalesced; the note beside that node
    assert "subgraph cluster_recorded" in dot and "recorded by the first backward" in dot
    box = dot[dot.index("subgraph cluster_recorded") :]
    box = box[: box.index("}\n\tsubgraph") if "}\n\tsubgraph" in box else len(box)]
    assert "ReduceAddCoalescedBackward_1" in box and "note_0" in box and "stops rewire here" in box
    # the legend names the recorded nodes' colour; the plain drawing has neither box nor entry
    assert "recorded by the first backward (create_graph=True)" in legend_label(drawing.view)
    assert "cluster_recorded" not in plain.draw().dot and "create_graph" not in legend_label(
        plain.draw().view
    )
    # ReduceAddCoalesced is not drawn as a ReduceAdd/Broadcast join: its fill is the recorded one
    line = next(
        line for line in dot.splitlines() if line.strip().startswith("ReduceAddCoalescedBackward_1 [")
    )
    assert "#ffe9a8" in line and "#ffb74d" not in line


def test_a_note_on_a_node_the_drawing_lacks_is_an_error():
    marked, _, _ = penalty_graph()
    with pytest.raises(KeyError, match="NoSuchNode"):
        marked.draw(notes={"NoSuchNode": "x"})


@pytest.mark.skipif(shutil.which("dot") is None, reason="needs Graphviz's dot program")
def test_compact_names_keep_a_backward_of_a_backward_whole():
    marked, _, _ = penalty_graph()
    dot = marked.draw(compact=True).dot
    # MseLossBackwardBackward0 would shorten to "MseLossBackward", the first-order node's name
    assert "label=MseLossBackwardBackward0" in dot and "label=Mm " in dot


def test_the_text_form_says_what_was_recorded_and_shows_the_note():
    marked, plain, _ = penalty_graph()
    text = marked.draw(notes={"ReduceAddCoalescedBackward_1": "rewire stops here"}).text
    line = next(line for line in text.splitlines() if "ReduceAddCoalescedBackward" in line)
    # without dot, the same facts in words: the node was recorded, and the note follows it
    assert "recorded by the first backward" in line and "note: rewire stops here" in text
    assert "recorded by the first backward" not in plain.text


def test_a_note_can_name_its_node_as_the_box_prints_it():
    marked, _, _ = penalty_graph()
    # the name in the box (full or compact) finds the same node as its id
    for name in ("ReduceAddCoalescedBackward", "ReduceAddCoalesced"):
        assert marked.draw(notes={name: "x"}).view.remarks == {"ReduceAddCoalescedBackward_1": "x"}
    # a name several nodes print is refused, with their ids to choose from
    with pytest.raises(KeyError, match="TBackward0_"):
        marked.draw(notes={"TBackward0": "x"})
