"""The interactive lab's widgets: the plain-Python models, and the ipywidgets views driven from Python.

Views are driven as a learner's clicks drive them (``button.click()``, ``slider.value = ...``) and
read back from their widgets' values; this needs no browser and no kernel, and behaves the same
under ipywidgets 8 and 7.7 (Colab). ``test_widgets_under_ipywidgets_7`` runs this whole file again
inside ``.venv-colab`` (``scripts/colab_like.sh``: ipywidgets 7.7.1, IPython 7.34, ipykernel 6.17.1),
and ``test_lab_notebook_in_colab_like_kernel`` runs chapter 12 in that environment's kernel.
The browser run (ipywidgets 8 in JupyterLab) is tests/release/test_browser.py.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
import xml.dom.minidom
from pathlib import Path

import pytest
import torch

from dpteach.course import story
from dpteach.replicate import FIXED, STRATEGIES
from dpteach.widgets import CostLab, GradientFlow, TrainingLab
from dpteach.widgets.charts import bar_chart, line_chart, nice_ticks
from dpteach.widgets.highlight import marked
from dpteach.widgets.pictures import decode_img, loss_curve

ROOT = Path(__file__).resolve().parents[2]
HAS_DOT = shutil.which("dot") is not None
needs_dot = pytest.mark.skipif(
    not HAS_DOT, reason="needs Graphviz's `dot` program (apt-get install graphviz)"
)


def run_python(code: str, python: str = sys.executable) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)


# ---------------------------------------------------------------------------------------------
# Importing: ipywidgets only when a widget is made
# ---------------------------------------------------------------------------------------------


def test_import_dpteach_does_not_import_ipywidgets():
    code = (
        "import sys, dpteach, dpteach.widgets as w; lab = w.TrainingLab(); lab.step(); lab.grad_rows(); "
        "w.GradientFlow('rewire'); print(sorted(m for m in sys.modules if m.split('.')[0] == 'ipywidgets'))"
    )
    done = run_python(code)
    assert done.returncode == 0, done.stderr  # the models work without touching ipywidgets
    assert done.stdout.strip() == "[]"  # ... and never import it


def test_widget_without_ipywidgets_says_what_to_install():
    code = (
        "import sys; sys.modules['ipywidgets'] = None\n"  # as if it were not installed
        "import dpteach.widgets as w\n"
        "try:\n    w.explorer()\nexcept ImportError as err:\n    print('ImportError:', err)\n"
    )
    done = run_python(code)
    assert done.returncode == 0, done.stderr
    message = done.stdout.strip()
    assert message.startswith("ImportError: ") and "pip install" in message  # says what to install
    assert message.count(". ") == 0 and message.endswith(".")  # in one sentence


def test_ipywidgets_version_is_the_expected_one():
    ipywidgets = pytest.importorskip("ipywidgets")
    expected = os.environ.get("DPTEACH_EXPECT_IPYWIDGETS")
    print(f"ipywidgets {ipywidgets.__version__}")
    if expected:
        assert ipywidgets.__version__ == expected  # the Colab-like run really ran under 7.7.1


# ---------------------------------------------------------------------------------------------
# TrainingLab: the explorer's model
# ---------------------------------------------------------------------------------------------


def test_clone_never_learns_and_its_gradients_stay_in_the_replicas():
    lab = TrainingLab("clone", slots=2, steps=5)
    lab.run()
    assert lab.step_count == 5 and lab.done  # run() stops at `steps`
    assert lab.losses == [lab.losses[0]] * 6  # the weights never moved: the same loss at every step (#19540)
    assert not lab.learned
    rows = lab.grad_rows()
    assert all(r.original is None for r in rows)  # the original's .grad is None ...
    assert all(
        len(r.replicas) == 2 and all(g is not None and g > 0 for g in r.replicas) for r in rows
    )  # ... the replicas hold them


@pytest.mark.parametrize("strategy", FIXED)
def test_fixed_strategies_train_like_one_device(strategy):
    lab = TrainingLab(strategy, slots=3, steps=8)
    lab.run()
    reference = story.train(strategy=None, steps=9)  # the course's own one-device run, independent of the lab
    torch.testing.assert_close(
        lab.losses, reference.losses, rtol=1e-4, atol=1e-6
    )  # loss curve = one device's
    torch.testing.assert_close(
        lab.reference_losses, reference.losses, rtol=1e-5, atol=1e-7
    )  # so is the lab's reference
    rows = lab.grad_rows()
    assert all(r.matches for r in rows)  # the original's gradient norms equal one device's
    assert all(g is None for r in rows for g in r.replicas)  # replicas are not leaves: they passed theirs on


def test_the_gradient_norms_agree_by_a_relative_gap_at_every_size():
    """GradRow.matches is what the status line says: a relative gap of at most MATCH, for small norms too."""
    from dpteach.widgets.training import MATCH, GradRow

    def row(reference, original):
        return GradRow("w", (2,), reference, original, ())

    assert row(0.5, 0.5 * (1 + 0.9 * MATCH)).matches and not row(0.5, 0.5 + 0.9 * MATCH).matches
    assert (
        row(2000.0, 2000.0 * (1 + 0.9 * MATCH)).matches
        and not row(2000.0, 2000.0 * (1 + 1.1 * MATCH)).matches
    )
    assert not row(0.5, None).matches and row(0.0, 0.0).matches


def test_one_slot_runs_the_module_itself_so_even_clone_learns():
    lab = TrainingLab("clone", slots=1, steps=10)
    lab.run()
    assert lab.learned and lab.replicas == []  # DataParallel with one device calls the module, no replica
    assert "None" not in lab.status()


def test_configure_resets_only_when_the_run_changes():
    lab = TrainingLab("clone", steps=5)
    lab.step()
    assert lab.configure(steps=10) is False and lab.step_count == 1  # more steps: the same run goes on
    assert lab.configure(strategy="rewire") is True and lab.step_count == 0  # another strategy: a fresh run
    with pytest.raises(ValueError, match="clone, rewire, broadcast"):  # the message lists the valid ones
        lab.configure(strategy="magic")
    assert lab.strategy == "rewire"  # a refused change leaves the settings as they were
    with pytest.raises(TypeError, match="settings are"):
        lab.configure(momentum=0.9)


def test_a_diverging_run_is_said_and_drawn():
    lab = TrainingLab("rewire", lr=1.5, steps=30)
    lab.run()
    assert not math.isfinite(lab.losses[-1])  # lr 1.5 is too large for the course model: the loss overflows
    assert "diverged" in lab.status()  # the status says why, instead of "gradients differ" (NaN != NaN)
    svg = decode_img(loss_curve(lab.losses, lab.reference_losses, lab.strategy, lab.steps))
    xml.dom.minidom.parseString(svg)  # still a valid picture
    points = " ".join(re.findall(r'points="([^"]*)"', svg)).replace(",", " ").split()
    assert all(math.isfinite(float(v)) for v in points)  # no "nan" or "inf" coordinates
    assert "drawn on its top edge" in svg  # clipped, and said so


def test_the_status_never_says_agree_alone_while_the_loss_blows_up():
    """At the slider's 0.631 both runs blow up: while their losses are finite the status says first that
    the loss is above its start, then how the gradients compare; once inf and nan come it says the run
    diverged. A run that learns (0.2) never gets the warning."""
    warning = "the loss is above its start: the learning rate is too large"
    lab = TrainingLab("rewire", slots=2, lr=10**-0.2, steps=40)
    finite = 0
    while not lab.done:
        lab.step()
        status = lab.status()
        # which step first overflows float32 rests on rounding, and so on the CPU: read it from the run
        if not (math.isfinite(lab.losses[-1]) and math.isfinite(lab.reference_losses[-1])):
            break
        finite += 1
        assert lab.losses[-1] > lab.losses[0] and warning in status, status
        assert status.index(warning) < status.index("gradient norms"), status  # said before the agreement
    assert finite >= 10  # many finite steps were checked before the overflow
    assert "diverged" in (lab.run(), lab.status())[-1]  # inf, then nan: said too
    calm = TrainingLab("rewire", slots=2, lr=0.2, steps=60)
    while not calm.done:
        calm.step()
        assert warning not in calm.status() and "agree" in calm.status(), calm.status()


def test_the_off_axis_note_names_the_steps_each_line_leaves_at():
    """A diverging run is drawn on a log axis, so its lines stay in sight until inf; the red note says
    where each turns inf and nan, and a dashed line marks the step from which the losses differ by 1%."""
    from dpteach.widgets.pictures import drift_step

    lab = TrainingLab("rewire", slots=2, lr=10**-0.2, steps=60)
    lab.run()
    svg = decode_img(loss_curve(lab.losses, lab.reference_losses, lab.strategy, lab.steps))
    notes = re.findall(r'<text class="off-axis"[^>]*>([^<]*)</text>', svg)

    def leaves(losses):  # the first inf, then the first nan, of one line
        return tuple(next(i for i, v in enumerate(losses) if test(v)) for test in (math.isinf, math.isnan))

    one, dp = leaves(lab.reference_losses), leaves(lab.losses)
    inf = min(one[0], dp[0])
    assert "(log scale)" in svg and notes[0] == "off the axis, drawn on its top edge:"
    # two runs that leave at the same steps share one line; where rounding parts them, each has its own
    said = {
        name: f"inf from step {i}, nan from {n}"
        for name, (i, n) in (("one device", one), ("DataParallel", dp))
    }
    expected = [f"both lines: {said['one device']}"] if one == dp else [f"{k}: {v}" for k, v in said.items()]
    assert notes[1:] == expected
    # on the log axis the finite losses are drawn below the top edge, each higher point a larger loss
    lines = [[float(p.split(",")[1]) for p in pts.split()] for pts in re.findall(r'points="([^"]*)"', svg)]
    top = min(min(ys) for ys in lines)
    assert all(y > top for ys in lines for y in ys[: inf - 1])
    apart = drift_step(lab.losses, lab.reference_losses)
    assert 0 < apart < inf and abs(lab.losses[apart - 1] / lab.reference_losses[apart - 1] - 1) <= 0.01
    (mark,) = re.findall(r'<text class="mark"[^>]*>([^<]*)</text>', svg)
    assert mark == f"from step {apart} the losses differ by over 1%"  # it names what it measures
    # the status line compares gradient norms at the same weights, by its own tolerance, and says which:
    # DataParallel's agree even where the runs' weights have parted; a gradient made 1% off differs
    short = TrainingLab("rewire", slots=2, lr=10**-0.2, steps=10)
    short.run()
    assert short.weight_gap() > 1
    assert short.status().endswith("gradient norms agree with one device's (relative gap ≤ 1e-4)")
    short.model[0].weight.grad.mul_(1.01)
    assert short.status().endswith("gradient norms DIFFER from one device's (relative gap > 1e-4)")
    calm = TrainingLab("rewire", slots=2, lr=0.2, steps=60)
    calm.run()  # a run that learns keeps its linear axis and has no mark
    svg = decode_img(loss_curve(calm.losses, calm.reference_losses, calm.strategy, calm.steps))
    assert "log scale" not in svg and 'class="mark"' not in svg
    split = line_chart(
        [("a", [1, 5, math.inf], "red", False), ("b", [1, 1, 1], "blue", True)], 2, "t", "x", "y", y_cap=2
    )
    assert re.findall(r'class="off-axis"[^>]*>([^<]*)<', split)[1:] == ["a: above 2 from step 1, inf from 2"]


def test_graph_of_the_current_step_shows_the_bug_and_the_fix():
    clone, rewire = TrainingLab("clone"), TrainingLab("rewire")
    assert (
        len(clone.graph.dead_ends) == 8 and len(clone.graph.unreached) == 4
    )  # 2 slots × 4 params stop; no original reached
    assert not rewire.graph.dead_ends and not rewire.graph.unreached  # every gradient reaches the original


# ---------------------------------------------------------------------------------------------
# GradientFlow: the stepper's model
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("slots", [1, 3])
def test_flow_runs_the_graph_in_an_order_backward_could(strategy, slots):
    flow = GradientFlow(strategy, slots)
    order = {s.node: i for i, s in enumerate(flow.steps)}
    assert len(order) == len(flow.steps)  # every node runs once
    ran = {n.id for n in flow.graph.nodes.values() if n.kind in ("op", "join") or n.leaf} | {"output"}
    reached = {nid for nid in ran if flow.graph.nodes[nid].reached}
    assert set(order) == reached  # exactly the graph's backward nodes and reached leaves run
    parents = {}
    for e in flow.graph.edges:
        parents.setdefault(e.dst, []).append(e.src)

    def senders(nid):  # the nodes that run and hand nid a gradient, looking through named replica parameters
        return [p for q in parents.get(nid, []) for p in ([q] if q in order else senders(q))]

    for nid in order:  # a node runs only after every node that hands it a gradient
        assert all(order[p] < order[nid] for p in senders(nid)), f"{nid} ran too early"
    assert flow.steps[-1].kind in ("original", "replica")  # it ends at a leaf


def test_flow_hands_the_real_gradients_to_the_leaves():
    for strategy in FIXED:
        flow = GradientFlow(strategy, 2)
        params = dict(flow.model.named_parameters())
        leaves = [s for s in flow.steps if s.kind == "original"]
        assert len(leaves) == 4  # every original parameter got its gradient
        for s in leaves:
            p = params[s.node.removeprefix("original.")]
            assert s.received[0].shape == tuple(
                p.shape
            )  # AccumulateGrad received a gradient shaped like the parameter
            assert s.received[0].norm == pytest.approx(p.grad.norm().item(), rel=1e-5)  # ... and it is .grad
    clone = GradientFlow("clone", 2)
    stuck = [s for s in clone.steps if s.kind == "replica"]
    assert len(stuck) == 8 and not [
        s for s in clone.steps if s.kind == "original"
    ]  # clone: only replica leaves
    assert all(not s.handoffs and "dead end" in s.text for s in stuck)  # nothing passes them on


def test_reduce_add_sums_what_the_replicas_hand_it():
    flow = GradientFlow("rewire", 3)
    joins = [s for s in flow.steps if s.kind == "join"]
    assert len(joins) == 4  # one ReduceAdd per original parameter (#20910)
    for j in joins:
        assert len(j.received) == 3  # one gradient per replica slot
        (h,) = j.handoffs
        assert (
            h.to.startswith("original.") and h.grad.shape == j.received[0].shape
        )  # one sum, to the original
        assert (
            h.grad.norm <= sum(g.norm for g in j.received) + 1e-9
        )  # a sum is no longer than its parts (triangle)
    # and the sum is the one-device gradient: the same model and batch, backward on one device
    model = story.make_model(flow.seed)
    x, y = story.make_data(seed=flow.seed)
    torch.nn.functional.mse_loss(model(x), y).backward()
    expected = {f"original.{n}": p.grad.double().norm().item() for n, p in model.named_parameters()}
    handed = {h.to: h.grad.norm for j in joins for h in j.handoffs}
    assert handed.keys() == expected.keys()
    for name, norm in handed.items():
        assert norm == pytest.approx(expected[name], rel=1e-4), (
            name
        )  # a dropped replica gradient would be short


@needs_dot
def test_flow_picture_marks_the_step_and_nothing_else():
    flow = GradientFlow("broadcast", 2)
    for i in (0, 3, len(flow) - 1):
        svg = flow.svg(i)
        xml.dom.minidom.parseString(svg.encode())  # still well-formed SVG after restyling
        marks = marked(svg)
        assert marks["current"] == {flow.steps[i].node}  # the node that runs, alone
        assert marks["edges"] == {f"{a}->{b}" for a, b in flow.steps[i].edges}  # the gradients it hands on
        assert marks["done"] == set(flow.done_before(i))  # and those that ran before it


# ---------------------------------------------------------------------------------------------
# CostLab: the cost explorer's model
# ---------------------------------------------------------------------------------------------


def test_cost_lab_counts_the_same_bytes_as_the_library():
    from dpteach.measure.costs import step_traffic
    from dpteach.widgets.cost import wide_model

    lab = CostLab(width=64, slots=3, max_repeats=1)
    costs = {c.strategy: c for c in lab.measure()}
    x, y = story.make_data()
    for strategy, cost in costs.items():
        meter = step_traffic(
            wide_model(64), x, ["cpu"] * 3, strategy, lambda out: torch.nn.functional.mse_loss(out, y)
        )
        assert cost.bytes_by_op == meter.by_op()  # the widget's bytes are dpteach.comm's count, op by op
        assert cost.median > 0 and len(cost.seconds) == 1  # timed, no more often than max_repeats
    assert lab.model_bytes == sum(p.numel() * 4 for p in wide_model(64).parameters())  # n_params is right
    assert (
        costs["clone"].bytes > costs["broadcast"].bytes
    )  # deep copies of every slot cost more than a broadcast


def test_cost_grows_with_slots_and_size():
    def total(width, slots, strategy="broadcast"):
        lab = CostLab(width=width, slots=slots, strategies=[strategy], max_repeats=1)
        return lab.measure()[0].bytes_by_op.get(strategy, 0)

    assert total(16, 1) == 0  # one slot: nothing to copy
    assert total(16, 2) < total(16, 4) < total(64, 4)  # more slots, bigger model: more bytes


# ---------------------------------------------------------------------------------------------
# Charts: numbers a test can read back
# ---------------------------------------------------------------------------------------------


def test_nice_ticks_cover_the_data_in_round_steps():
    for top in (0.0003, 0.2, 1, 7.3, 1234, 9.9e6):
        ticks = nice_ticks(top)
        step = ticks[1] - ticks[0]
        assert ticks[0] == 0 and ticks[-1] >= top > ticks[-2]  # from 0 to just past the top
        assert re.fullmatch(r"[125]", f"{step:.0e}"[0])  # steps of 1, 2 or 5 times a power of ten


def test_charts_draw_every_value():
    svg = line_chart([("a", [3, 2, 1], "red", False), ("b", [1, 1], "blue", True)], 10, "t", "x", "y")
    xml.dom.minidom.parseString(svg)  # well-formed
    points = re.findall(r'class="series" data-label="(\w)" points="([^"]*)"', svg)
    assert [(k, len(p.split())) for k, p in points] == [("a", 3), ("b", 2)]  # one point per value
    bars = bar_chart(["p", "q"], [("s", [10, 30], "red"), ("t", [5, 0], "blue")], "t", "y")
    values = re.findall(
        r'data-category="(\w)" data-stack="(\w)" data-value="([\d.]+)" x="[\d.]+" y="[\d.]+" '
        r'width="[\d.]+" height="([\d.]+)"',
        bars,
    )
    assert [(c, s, float(v)) for c, s, v, _ in values] == [
        ("p", "s", 10),
        ("p", "t", 5),
        ("q", "s", 30),
    ]  # zero: no bar
    heights = {(c, s): float(h) for c, s, _, h in values}
    assert heights[("q", "s")] == pytest.approx(
        3 * heights[("p", "s")], rel=0.01
    )  # heights proportional to values


# ---------------------------------------------------------------------------------------------
# The views, driven from Python (ipywidgets 8 here; 7.7.1 in the Colab-like run)
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def ipywidgets():
    return pytest.importorskip("ipywidgets", reason="the views need ipywidgets")


def test_explorer_step_run_and_switch(ipywidgets):
    from dpteach.widgets import explorer

    view = explorer(strategy="clone", steps=12)
    assert isinstance(view, ipywidgets.Widget)  # displays itself in Jupyter, ipywidgets 7 or 8
    assert "step 0 of 12" in view.status.value
    view.step_button.click()
    assert (
        "step 1 of 12" in view.status.value and "None" in view.status.value
    )  # a click takes a step; clone: no grad
    curve = decode_img(view.curve.value)
    dp_points = re.search(r'data-label="DataParallel[^"]*" points="([^"]*)"', curve).group(1).split()
    assert len(dp_points) == 2  # the curve shows step 0 and step 1
    assert (
        view.grads.value.count(">None</b></td>") == 4
    )  # every original parameter's .grad is None, cell by cell
    view.strategy.value = "rewire"
    assert (
        "step 0 of 12" in view.status.value and "agree with one device" in view.status.value
    )  # a fresh, fixed run
    view.run_button.click()
    assert (
        view.lab.step_count == 12 and view.run_button.disabled
    )  # run goes to `steps`, then there is nothing to run
    assert "None" not in view.grads.value
    view.slots.value = 4
    assert len(view.lab.devices) == 4 and len(view.lab.replicas) == 4  # four slots, four replicas
    assert view.grads.value.count("replica 3") == 1  # one column per replica
    assert view.error is None  # no callback failed


@needs_dot
def test_explorer_draws_the_graph_of_the_current_step(ipywidgets):
    from dpteach.widgets import explorer

    view = explorer(strategy="clone")
    svg = decode_img(view.graph.value)
    xml.dom.minidom.parseString(svg.encode())  # a real SVG picture
    assert svg.count(".grad stops here") == 8  # clone: every replica parameter is a dead end
    view.strategy.value = "broadcast"
    svg = decode_img(view.graph.value)
    assert ".grad stops here" not in svg and "BroadcastBackward" in svg  # the fix, drawn


def test_explorer_shows_a_bad_setting_instead_of_failing_silently(ipywidgets):
    from dpteach.widgets import explorer

    view = explorer()
    view.lab.configure = lambda **kw: (_ for _ in ()).throw(RuntimeError("boom"))  # a failing model
    view.slots.value = 3
    assert "RuntimeError: boom" in view.status.value and isinstance(
        view.error, RuntimeError
    )  # the learner sees it


def test_stepper_walks_forward_and_back(ipywidgets):
    from dpteach.widgets import gradient_stepper

    view = gradient_stepper(strategy="rewire", slots=2)
    assert view.position.value == 0 and view.prev_button.disabled  # starts at the output; nothing before it
    view.next_button.click()
    assert (
        view.position.value == 1 and view.flow.steps[1].label in view.status.value
    )  # next: the next node runs
    assert "MseLossBackward0" in view.handoffs.value
    view.prev_button.click()
    assert view.position.value == 0
    view.position.value = view.position.max
    assert view.next_button.disabled and "The backward pass is over" in view.status.value  # the end, said so
    view.strategy.value = "clone"
    assert view.position.value == 0 and view.position.max == len(view.flow) - 1  # a new pass, from the start
    assert view.flow.strategy == "clone"
    assert view.error is None


@needs_dot
def test_stepper_picture_follows_the_step(ipywidgets):
    from dpteach.widgets import gradient_stepper

    view = gradient_stepper(strategy="clone", slots=2)
    for _ in range(3):
        view.next_button.click()
    svg = decode_img(view.graph.value)
    assert marked(svg)["current"] == {view.flow.steps[3].node}  # the picture marks the node the text names


def fitted(html):
    """(natural width, min-width) in px of a widget's graph picture, and whether a height caps it."""
    svg_px = float(re.search(r'<svg width="([\d.]+)pt"', decode_img(html)).group(1)) * 4 / 3
    style = re.search(r'<img [^>]*style="([^"]*)"', html).group(1)
    floor = int(re.search(r"min-width:(\d+)px", style).group(1))
    return svg_px, floor, "max-height" in html


@needs_dot
@pytest.mark.parametrize("strategy", ["clone", "rewire"])
def test_stepper_graph_fits_a_jupyterlab_page_without_sideways_scrolling(ipywidgets, strategy):
    from dpteach.graph.compare import MIN_LABEL_PX
    from dpteach.widgets import gradient_stepper

    view = gradient_stepper(strategy=strategy, slots=2)
    natural, floor, capped = fitted(view.graph.value)
    assert "width:100%" in view.graph.value and not capped  # scaled to the output's width, no height cap
    node_px = 10 * 4 / 3  # the nodes' 10 pt labels
    assert node_px * floor / natural >= MIN_LABEL_PX - 0.05  # it shrinks no further than readable labels
    assert floor <= 984  # so in a 1,000 px window (984 px of page) it never scrolls sideways


@needs_dot
@pytest.mark.parametrize("slots", [2, 8])
def test_explorer_graph_scales_to_the_output_and_scrolls_only_past_readable_labels(ipywidgets, slots):
    """The explorer's graph is fitted as the stepper's is: no 720 px box that cut the graph off; with 8
    replicas it stops shrinking where its labels are MIN_LABEL_PX tall and scrolls sideways from there."""
    from dpteach.graph.compare import MIN_LABEL_PX
    from dpteach.widgets import explorer

    view = explorer(strategy="rewire", slots=slots)
    natural, floor, capped = fitted(view.graph.value)
    assert "width:100%" in view.graph.value and not capped and "overflow-x:auto" in view.graph.value
    assert f"max-width:{round(natural)}px" in view.graph.value  # never enlarged past its own size
    assert abs(10 * 4 / 3 * floor / natural - MIN_LABEL_PX) < 0.05
    assert (floor <= 984) == (slots == 2)  # two slots fit a 1,000 px window; eight scroll sideways
    # where it scrolls, it opens at its middle (title, output node): a marker centred over the picture
    assert "scroll-initial-target:nearest" in view.graph.value and "justify-self:center" in view.graph.value


def test_cost_explorer_answers_a_slider(ipywidgets):
    from dpteach.widgets import cost_explorer

    view = cost_explorer(width=16, slots=2)
    before = view.lab.rows()
    view.slots.value = 4
    after = view.lab.rows()
    assert [r[1] for r in after] > [r[1] for r in before]  # more slots: more bytes, for every strategy
    for _strategy, nbytes, _, _ in after:
        assert f"{nbytes:,}" in view.table.value  # the table shows the counted bytes
    charts = view.charts.value
    # the bars are the bytes, which repeat; a time is never drawn, only written in the table as "this run"
    assert charts.count("data:image/svg+xml") == 1
    svg = decode_img(charts)
    assert "µs" not in svg and "time" not in svg and "bytes copied per step" in svg
    # this run's times: folded under the ranking's table, never a column of it
    ranking, _, times = view.table.value.partition("<details>")
    assert "µs" not in ranking and "show this run" in times and "µs" in times
    view.width.value = 64
    assert view.lab.width == 64 and "4,417 parameters" in view.status.value
    assert view.error is None


def test_cost_explorer_takes_a_budget_and_can_leave_the_model_out(ipywidgets):
    from dpteach.widgets import cost_explorer

    view = cost_explorer(width=16, slots=2, budget_s=0.2, modelled=False)
    assert view.lab.budget_s == 0.2  # the budget reaches the lab that times the steps
    assert "DDP" not in view.table.value and view.assumed.value == ""  # counts only, no DP-vs-DDP model
    default = cost_explorer(width=16, slots=2)  # chapter 12's: the model as one labelled line under the bytes
    assert "DDP" not in default.table.value and "modelled, 2 x A100-SXM: DDP" in default.assumed.value


def test_cost_explorer_can_show_counts_only(ipywidgets):
    """``timed=False`` (chapter 06): the same counted bytes, and no time anywhere, in status, table, charts."""
    from dpteach.widgets import cost_explorer

    view = cost_explorer(width=16, slots=2, modelled=False, timed=False)
    timed = cost_explorer(width=16, slots=2, modelled=False)
    assert not view.lab.timed and timed.lab.timed  # the default still times (chapter 12)
    assert [r[:3] for r in view.lab.rows()] == [r[:3] for r in timed.lab.rows()]  # the same counts
    assert all(r[3] is None for r in view.lab.rows()) and view.lab.reference is None
    shown = view.status.value + view.table.value
    assert "µs" not in shown and "time per step" not in shown and "nothing timed" in view.status.value
    assert view.charts.value.count("data:image/svg+xml") == 1  # the bytes chart alone
    assert "time per step" in timed.table.value


# ---------------------------------------------------------------------------------------------
# The same, under ipywidgets 7.7.1 (what Colab ships)
# ---------------------------------------------------------------------------------------------


def colab_python() -> str:
    """The Colab-like environment's python, built by scripts/colab_like.sh if missing; skips if it cannot be."""
    if os.environ.get("DPTEACH_EXPECT_IPYWIDGETS"):
        pytest.skip("already inside the Colab-like run")
    try:
        done = subprocess.run(
            ["bash", str(ROOT / "scripts" / "colab_like.sh")],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**os.environ, "DPTEACH_TORCH_FROM": sys.executable},  # link this torch (link_torch.py)
            timeout=1800,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        pytest.skip(f"could not build .venv-colab with scripts/colab_like.sh: {err}")
    if done.returncode != 0:
        pytest.skip(
            f"could not build .venv-colab (scripts/colab_like.sh failed; offline?):\n{done.stderr[-2000:]}"
        )
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.slow
def test_widgets_under_ipywidgets_7(tmp_path):
    python = colab_python()
    report = tmp_path / "junit.xml"
    env = {**os.environ, "DPTEACH_EXPECT_IPYWIDGETS": "7.7.1"}
    done = subprocess.run(
        [
            python,
            "-m",
            "pytest",
            str(Path(__file__)),
            "-q",
            "-p",
            "no:cacheprovider",
            "-k",
            "not under_ipywidgets_7 and not colab_like_kernel",
            f"--junitxml={report}",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=900,
    )
    assert done.returncode == 0, (
        done.stdout[-4000:] + done.stderr[-2000:]
    )  # every widget test passes under 7.7.1
    suite = xml.dom.minidom.parse(str(report)).getElementsByTagName("testsuite")[0]
    ran, skipped = int(suite.getAttribute("tests")), int(suite.getAttribute("skipped"))
    assert ran >= 20 and (skipped == 0 or not HAS_DOT)  # ... and really ran, views included (none skipped)


@pytest.mark.slow
@pytest.mark.notebook
def test_lab_notebook_in_colab_like_kernel(tmp_path, monkeypatch):
    """Chapter 12 runs top to bottom in a kernel of the Colab-like environment (IPython 7.34, ipykernel 6.17.1)."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    python = colab_python()
    spec = tmp_path / "kernels" / "colab-like"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(
        '{"argv": ["%s", "-m", "ipykernel_launcher", "-f", "{connection_file}"], "display_name": "colab-like", '
        '"language": "python"}' % python
    )
    monkeypatch.setenv("JUPYTER_PATH", f"{tmp_path}{os.pathsep}{os.environ.get('JUPYTER_PATH', '')}")
    path = ROOT / "notebooks" / "12_the_lab.ipynb"
    nb = nbformat.read(path, as_version=4)
    # the chapter does not print the version, so the test asks the kernel itself
    probe = nbformat.v4.new_code_cell('import ipywidgets; print("ipywidgets", ipywidgets.__version__)')
    nb.cells.insert(0, probe)
    nbclient.NotebookClient(
        nb, timeout=300, kernel_name="colab-like", resources={"metadata": {"path": str(path.parent)}}
    ).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]  # no cell failed
    views = [o for o in outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert len(views) >= 3  # the three widgets were displayed, as ipywidgets 7 displays them
    version = "".join(o.get("text", "") for o in probe.outputs)
    assert "ipywidgets 7.7.1" in version  # the kernel really had ipywidgets 7.7.1


@pytest.mark.parametrize("strategy, slots", [("broadcast", 2), ("rewire", 3)])
def test_a_join_names_whose_gradient_each_received_one_is(strategy, slots):
    """Each gradient a join receives is labelled 'replica i · name', and is that replica's share of the loss."""
    flow = GradientFlow(strategy, slots)
    model = story.make_model(flow.seed)
    x, y = story.make_data(seed=flow.seed)
    share = {}  # replica i's gradient: d loss / d param through its chunk of the batch only
    for i, (xi, yi) in enumerate(zip(x.chunk(slots), y.chunk(slots))):
        model.zero_grad()
        ((model(xi) - yi) ** 2).sum().div(y.numel()).backward()  # mse_loss's mean is over the whole batch
        share.update(
            {f"replica {i} · {n}": p.grad.double().norm().item() for n, p in model.named_parameters()}
        )
    joins = [s for s in flow.steps if s.kind == "join"]
    received = [g for j in joins for g in j.received]
    assert sorted(g.source for g in received) == sorted(share)  # every replica parameter, once
    for g in received:
        assert g.norm == pytest.approx(share[g.source], rel=1e-5), g.source
    if (
        strategy == "broadcast"
    ):  # one node: the sentence names the originals in module order, as the graph does
        names = [f"original {n}" for n, _ in model.named_parameters()]
        assert ", ".join(names) in joins[0].text
        assert [g.source for g in joins[0].received][: len(names)] == [
            f"replica 0 · {n.removeprefix('original ')}" for n in names
        ]


def test_cost_status_gives_the_times_it_measured():
    from dpteach.widgets.cost import MIN_TIMED

    lab = CostLab(width=16, slots=2)
    lab.measure()
    text = lab.status()
    timed = [*lab.costs, lab.reference]
    if all(len(c.seconds) < MIN_TIMED for c in timed):  # a busy machine: one sentence on how to get times
        assert text.count("for a spread") == 1 and f"in {lab.budget_s:g} s;" in text
        more = f"budget_s={max(1, 4 * lab.budget_s):g})"  # a larger budget than this one
        assert f"cost_explorer({more}" in text  # the call a learner makes
    else:
        for c in lab.costs:  # each strategy's time, and one device's, as the table shows them
            assert f"{c.strategy!r} {c.shown(lab.budget_s)}" in text
        assert f"one device {lab.reference.shown(lab.budget_s)}" in text


def test_cost_times_are_shown_only_with_a_spread():
    from dpteach.widgets.cost import MIN_TIMED, StrategyCost

    few = StrategyCost("rewire", {}, (0.001,))
    assert "µs" not in few.shown() and "1 step in" in few.shown()  # one step: no median, no spread
    assert (
        few.shown(0.05) == "timed 1 step in 0.05 s; for a spread, time at least 5: cost_explorer(budget_s=1)"
    )
    # always a larger budget than this one, in the call chapters 06 and 12 make
    assert few.shown(1.0).endswith("cost_explorer(budget_s=4)")
    enough = StrategyCost("rewire", {}, (0.001, 0.002, 0.003, 0.004, 0.005)[:MIN_TIMED])
    assert "median of 5, middle half" in enough.shown()
    lab = CostLab(width=16, slots=2, budget_s=0.0)  # a budget for one round only
    lab.measure()
    assert "median of 1" not in lab.status() and "median of 1" not in "\n".join(lab.report())


def test_an_untimed_lab_times_nothing(monkeypatch):
    from dpteach.widgets import cost

    def no_timing(*args, **kwargs):
        raise AssertionError("an untimed lab called the timer")

    monkeypatch.setattr(cost, "time_in_turns", no_timing)
    lab = CostLab(width=16, slots=2, timed=False)
    lab.measure()
    assert [c.seconds for c in lab.costs] == [()] * len(lab.strategies) and lab.reference_s is None
    assert "nothing timed" in lab.status() and "µs" not in lab.status()
    report = "\n".join(lab.report())
    assert "bytes copied per step" in report and "this machine's time" not in report


def test_cost_report_shows_the_models_line_and_its_table_its_assumptions():
    """The report ends in the model's one labelled line; modelled_lines() holds its table and assumptions."""
    from dpteach.measure import costmodel
    from dpteach.widgets.cost import us

    lab = CostLab(width=16, slots=2, budget_s=0.0)
    lab.measure()
    assert lab.report()[-1] == lab.modelled_line()
    # the report's line is the ranking in words; its figures are modelled_figures() (the explorer's hover)
    assert lab.modelled_line() == (
        "modelled, not measured, 2 x A100-SXM: DDP wins; most of DataParallel's step is assumed thread starts"
    )
    line = lab.modelled_figures()
    # each wrapper's modelled step without the assumed starts, then the starts added on: never one sum
    without = lab.without_thread_starts()
    assert line == (
        f"modelled, 2 x A100-SXM: DDP {us(without['DDP'])} < DataParallel {us(without['DataParallel'])} "
        f"+ {us(2 * costmodel.PYTHON_THREAD_S)} assumed thread starts "
        "(a model of 337 parameters, tiny for a GPU: only the ranking means anything)"
    )  # the model's size beside its figures, so a fraction of a µs never reads as a real GPU step
    text = "\n".join(lab.modelled_lines())
    assert lab.tiny() in text  # and in the table's head
    assert (
        "assumed thread starts" in text and f"assumed: {us(costmodel.PYTHON_THREAD_S)} to start each" in text
    )
    assert "modelled, not measured" in text and "FP32 peak" in text
    assert "strategy 'broadcast'" in text  # which of dpteach's strategies the model's DataParallel is


def test_cost_report_lines_fit_a_notebook_output():
    """Every line of the report fits REPORT_WIDTH characters: no wall of 200-character lines, at the widest
    model on the most slots, and with the sentence that says too few steps fitted the budget."""
    from dpteach.widgets.cost import REPORT_WIDTH

    for lab in (CostLab(width=1024, slots=8, budget_s=0.0), CostLab(width=16, slots=1, budget_s=0.0)):
        lab.measure()
        long = [line for line in [*lab.report(), *lab.modelled_lines()] if len(line) > REPORT_WIDTH]
        assert not long, long
    from dpteach.widgets.cost import WIDTHS

    for width in WIDTHS:  # the model's line, at every setting of the explorer: no measuring needed
        for slots in range(1, 9):
            assert len(CostLab(width=width, slots=slots).modelled_line()) <= REPORT_WIDTH, (width, slots)


def test_cost_model_figures_say_what_they_leave_out_in_one_unit():
    """The modelled step of a small model is a few µs, less than what the model leaves out: every text that
    shows it says so (cost.LEFT_OUT: costmodel's omissions, with both packing copies), and every time is in µs, without powers of ten. The table's
    columns are the model's totals, its assumed thread starts, and the totals without them."""
    from dpteach.measure import costmodel
    from dpteach.widgets.cost import LEFT_OUT, us
    from dpteach.widgets.tables import cost_table

    lab = CostLab(width=256, slots=4, budget_s=0.0)
    lab.measure()
    modelled = " ".join(" ".join(lab.modelled_lines()).split())  # wrapped lines, read as one text
    assert LEFT_OUT in modelled and LEFT_OUT in lab.assumption_line()
    assert "only its ranking means anything" in modelled
    assert LEFT_OUT in CostLab(width=16, slots=1).assumption_line()
    for text in (modelled, lab.assumption_line(), lab.modelled_line(), cost_table(lab)):
        assert " ms" not in text and not re.search(r"\de-\d", text), text
    without = lab.without_thread_starts()
    for strategy, p in lab.modelled().items():
        rows = [w for w in map(str.split, lab.modelled_lines()) if w[0][:-1].isdigit() and w[1] == strategy]
        (row,) = rows  # its table row: rank, wrapper, per step, assumed thread starts, without them
        starts = sum(part.name.startswith("start thread") for part in p.parts)
        assert " ".join(row[2:4]) == us(p.total_s) and " ".join(row[-2:]) == us(without[strategy])
        assert (starts == 0) == ("none" in row), row  # DDP starts no thread; DataParallel one per replica
        if starts:
            assert f"{starts} x {us(costmodel.PYTHON_THREAD_S)}" in " ".join(row)


def test_the_bytes_charts_legend_names_operations_and_their_bars():
    """The colours are operations': "rewire" copies by clone as "clone" does, so the legend says which bars
    each operation's colour fills, never a bare name that reads as a strategy's."""
    from dpteach.widgets.pictures import cost_charts

    lab = CostLab(width=16, slots=2, budget_s=0.0)
    lab.measure()
    svg = decode_img(cost_charts(lab.costs, lab.model_bytes, lab.slots, lab.reference_s))
    stacks = set(re.findall(r'data-stack="([^"]*)"', svg))
    assert stacks == {"clone op: clone, rewire bars", "broadcast op: broadcast bar", "gather op: every bar"}


def test_a_one_slot_bytes_chart_says_there_are_no_copies():
    from dpteach.widgets.pictures import cost_charts

    for slots in (1, 2):
        lab = CostLab(width=16, slots=slots, budget_s=0.0)
        lab.measure()
        svg = decode_img(cost_charts(lab.costs, lab.model_bytes, lab.slots, lab.reference_s))
        assert ('class="empty"' in svg and "no copies" in svg) == (slots == 1), slots


@pytest.mark.parametrize(
    "seconds, text",
    [
        (3.94e-6, "3.94 µs"),
        (5.12e-9, "0.005 µs"),
        (4e-4, "400 µs"),
        (3.48e-3, "3,480 µs"),
        (15.143e-3, "15,100 µs"),
        (0.9996e-6, "1.00 µs"),
        (1e-13, "< 0.001 µs"),
    ],
)
def test_times_print_in_microseconds_with_three_figures(seconds, text):
    from dpteach.widgets.cost import us

    assert us(seconds) == text


@pytest.mark.parametrize("make", ["explorer", "gradient_stepper", "cost_explorer"])
def test_each_widget_carries_a_still_for_front_ends_without_widgets(ipywidgets, make):
    """A saved copy read without a kernel (nbviewer, a headless run, an untrusted notebook) shows the
    bundle's text/html, the widget as first shown, not the bare repr; a widget manager draws the widget."""
    from dpteach import widgets
    from dpteach.widgets._ipywidgets import WIDGET_VIEW

    view = getattr(widgets, make)(**({"budget_s": 0.0} if make == "cost_explorer" else {}))
    bundle = view._repr_mimebundle_()
    assert WIDGET_VIEW in bundle  # the live widget, as before
    still = bundle["text/html"]
    assert "<img " in still and "A still of the widget" in still  # its pictures
    if make == "explorer":  # a fresh explorer's still shows step 0, as the live widget starts
        assert "step 0 of 60" in still and "at step 0, as it was shown" in still
        assert "step 0 of 60" in view.status.value and view.lab.step_count == 0
        assert bundle["text/plain"].startswith("DataParallelExplorer: step 0 of 60")
    elif make == "gradient_stepper":  # a fresh stepper's still shows step 0 too: the chapter asks under it
        assert f"step 0 of {len(view.flow) - 1}" in still and "at step 0, as it was shown" in still
        assert view.position.value == 0
    else:
        assert view.status.value in still  # its status line, as first shown
    assert "A still of the widget" in still and "children=" not in bundle["text/plain"]
    assert bundle["text/plain"].startswith(type(view).__name__ + ": ") and "<" not in bundle["text/plain"]


def test_a_still_shows_the_step_the_widget_is_at_and_fits_the_page(ipywidgets):
    """A still shows what the widget holds when shown: step 0 fresh, the learner's step after stepping; its
    graph has no floor on its width (pictures.fitted_img's min-width), so it shrinks to the page."""
    from dpteach import widgets

    view = widgets.gradient_stepper(strategy="rewire", slots=2)
    assert "min-width:" in view.graph.value  # the live widget keeps its floor and scrolls
    fresh = view._repr_mimebundle_()
    assert fresh["text/plain"].startswith(f"GradientStepper: step 0 of {len(view.flow) - 1}")
    assert "min-width:" not in fresh["text/html"] and "max-width:100%" in fresh["text/html"]
    view.go(3)
    assert "at step 3, as it was shown" in view._repr_mimebundle_()["text/html"]
    explorer = widgets.explorer(strategy="clone", slots=8, steps=2)
    explorer.step_button.click()
    still = explorer._repr_mimebundle_()["text/html"]
    assert "at step 1, as it was shown" in still and "min-width:" not in still
