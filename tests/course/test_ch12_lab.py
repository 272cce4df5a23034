"""Chapter 12's claims about what its widgets show, checked here instead of in the learner's notebook.

The chapter says: under "rewire" a ReduceAddBackward (and its original's AccumulateGrad) runs in between
the replicas' nodes when each replica's forward runs in a new thread of its own (torch's parallel_apply),
and after all of them when the replicas run on one thread (dpteach's CPU slots, so the stepper); under "broadcast" the one BroadcastBackward runs after every replica node; the
stepper's summary counts the steps it shows; the explorer's texts follow the strategy and the numbers.
"""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path

import nbformat
import pytest
import torch

from dpteach.widgets import CostLab, GradientFlow, TrainingLab
from dpteach.widgets.flow import join_order
from dpteach.widgets.tables import grad_table
from dpteach.widgets.training import slot_devices

ROOT = Path(__file__).resolve().parents[2]


def tagged(cells, tag: str) -> str:
    """The source of the one markdown cell that carries ``tag``."""
    (source,) = [c.source for c in cells if c.cell_type == "markdown" and tag in c.metadata.get("tags", [])]
    return source


def fold(source: str, title: str) -> str:
    """The text of the one ``<details>`` block of ``source`` whose summary is ``title``, on one line."""
    (block,) = [b for b in source.split("<details>") if b.startswith(f"<summary>{title}</summary>")]
    return " ".join(block.split("</details>")[0].removeprefix(f"<summary>{title}</summary>").split())


def section_3(cells) -> str:
    """Section 3's text: its heading cell, then the folds under its explorer (what you should see, asides)."""
    (heading,) = [c.source for c in cells if c.source.startswith("## 3. What the copies cost")]
    return heading + "\n\n" + tagged(cells, "cost-seen")


def positions(steps, kind):
    return [i for i, step in enumerate(steps) if step.kind == kind]


def test_on_cpu_slots_rewire_joins_and_broadcast_wait_for_every_replica_node():
    if slot_devices(2)[0].type != "cpu":
        pytest.skip("on GPUs each replica runs on a thread of its own: the chapter's CPU order")
    rewire = GradientFlow("rewire", slots=2).steps[1:]
    broadcast = GradientFlow("broadcast", slots=2).steps[1:]
    assert min(positions(rewire, "join")) > max(positions(rewire, "op"))
    assert min(positions(rewire, "original")) > max(positions(rewire, "op"))
    (join,) = positions(broadcast, "join")
    assert max(positions(broadcast, "op")) < join < min(positions(broadcast, "original"))


@pytest.mark.parametrize("threaded", [True, False])
def test_where_reduce_add_runs_follows_the_thread_the_replicas_ran_on(threaded):
    if slot_devices(2)[0].type != "cpu":
        pytest.skip("on GPUs each device's nodes run on a thread of their own: the chapter's CPU order")
    found = join_order(threaded)
    joins, ops = found.joins, found.ops
    assert len(joins) == 4 and len(ops) == 10
    if threaded:
        assert min(joins) < max(ops)  # in between the replicas' nodes
        assert min(found.order[i]._sequence_nr() for i in ops) == 0  # a new thread counts from 0 (node.h)
    else:
        assert min(joins) > max(ops)  # after all of them
    # the chapter numbers these as the stepper does: same model, same loss, same order on one thread
    if not threaded:
        flow = GradientFlow("rewire", slots=2)
        assert [i + 1 for i in joins] == [i for i, s in enumerate(flow.steps) if s.kind == "join"]


def test_on_cpu_the_chapter_says_the_replicas_take_turns():
    """CPU slots' forwards take turns on the caller's thread (test_parallel_apply.py); autograd runs every
    CPU replica's backward on the thread that called backward() (test_threads.py)."""
    cells = nbformat.read(ROOT / "notebooks" / "12_the_lab.ipynb", as_version=4).cells
    cost = section_3(cells)
    text = " ".join(cost.split())
    assert "take turns" in text and "the one thread that called `backward()`" in text
    # the turns are dpteach's choice (its shared generator), not torch's parallel_apply's
    assert (
        "one after the other on the calling thread" in text and "`parallel_apply` runs them at once" in text
    )
    assert "splitting the batch over cores pays" not in text


def test_only_the_forward_is_split_over_threads_and_the_backward_runs_on_the_caller():
    """Section 3's fold: threads split only the forward; every CPU node of the backward runs on the thread
    that called backward(), and torch's parallel_apply needs an accelerator. Thread identity, recorded on a
    hook in every replica's forward and every backward node of one step, repeats on every run."""
    import threading

    from dpteach import DataParallel
    from dpteach.course import story
    from dpteach.measure.threads import graph_nodes

    devices = slot_devices(2)
    if any(d.type != "cpu" for d in devices):
        pytest.skip("on GPUs the backward runs on the engine's device threads")
    model, (x, y) = story.make_model(), story.make_data()
    caller, forward, backward = threading.get_ident(), [], []
    hooks = [m.register_forward_hook(lambda *_: forward.append(threading.get_ident())) for m in model]
    out = DataParallel(model, devices)(x)
    for h in hooks:
        h.remove()
    loss = torch.nn.functional.mse_loss(out, y)
    for node in graph_nodes(loss.grad_fn):
        node.register_prehook(lambda *_: backward.append(threading.get_ident()))
    loss.backward()
    assert len(forward) == 2 * len(model) and set(forward) == {caller}  # dpteach's CPU slots: no thread
    assert backward and set(backward) == {caller}
    cells = nbformat.read(ROOT / "notebooks" / "12_the_lab.ipynb", as_version=4).cells
    cost = section_3(cells)
    text = " ".join(cost.split())
    assert "`parallel_apply`'s threads split only the forward" in text
    assert "On GPUs autograd's own threads, one per device, split the backward (worked out" in text
    if not torch.accelerator.is_available():  # the errors the fold quotes, from torch's own parallel_apply
        from torch.nn.parallel import parallel_apply

        modules, inputs = [torch.nn.Linear(2, 1)] * 2, [torch.zeros(1, 2)] * 2
        for devices, error, given in [
            (None, RuntimeError, "given GPU numbers or no devices"),
            ([0, 1], RuntimeError, "given GPU numbers or no devices"),
            ([torch.device("cpu")] * 2, ValueError, "given CPU devices"),
        ]:
            with pytest.raises(error) as raised:
                parallel_apply(modules, inputs, devices=devices)
            assert f'"{raised.value}" {given}' in text, (devices, str(raised.value))


def test_summary_counts_the_backward_steps_the_stepper_shows():
    flow = GradientFlow("clone", slots=2)
    assert flow.summary().startswith(f"{len(flow) - 1} backward steps")  # the stepper's last is "step N of N"


def test_join_sentence_names_where_each_strategys_node_comes_from():
    rewire = [s.text for s in GradientFlow("rewire", slots=2).steps if s.kind == "join"]
    broadcast = [s.text for s in GradientFlow("broadcast", slots=2).steps if s.kind == "join"]
    assert rewire and all("PR #20910" in t and "Broadcast" not in t for t in rewire)
    assert broadcast and all("PR #20910" not in t and "Broadcast" in t for t in broadcast)


@pytest.mark.parametrize("strategy", ["clone", "rewire", "broadcast"])
def test_every_stepper_sentence_is_short(strategy):
    """The stepper's status line is one sentence a learner reads at a glance (the numbers are in its table):
    at most 25 words at every step, with up to the 4 slots its slider offers."""
    for slots in range(1, 5):
        for step in GradientFlow(strategy, slots=slots).steps:
            assert len(step.text.split()) <= 25, (slots, step.text)


def test_grad_table_header_follows_the_numbers():
    lab = TrainingLab("rewire", slots=2, lr=0.2, steps=5)
    assert "norm agrees with one device's" in grad_table(lab) and "ReduceAddBackward" in grad_table(lab)
    lab = TrainingLab("broadcast", slots=2, lr=0.2, steps=5)
    assert "BroadcastBackward" in grad_table(lab)
    lab = TrainingLab("rewire", slots=2, lr=1.5, steps=30)
    lab.run()
    assert not math.isfinite(lab.losses[-1])
    assert "equals one device's" not in grad_table(lab) and "no longer finite" in grad_table(lab)


def test_a_large_learning_rate_grows_both_losses_together_at_first():
    lab = TrainingLab("rewire", slots=2, lr=10**-0.2, steps=60)  # the explorer's slider notch 0.631
    for _ in range(4):
        lab.step()
    assert lab.losses[-1] > 3 * lab.losses[0]  # it blows up ...
    assert all(abs(a - b) <= 1e-3 * max(1.0, b) for a, b in zip(lab.losses, lab.reference_losses))  # together


def test_cost_lab_times_one_device_too():
    cost = CostLab(width=64, slots=2)
    cost.measure()
    assert cost.reference_s is not None and cost.reference_s > 0


@pytest.fixture
def ipywidgets():
    return pytest.importorskip("ipywidgets", reason="the views need ipywidgets")


def test_the_widgets_after_a_click(ipywidgets):
    from dpteach import widgets

    clicked = widgets.explorer(strategy="clone", slots=2, lr=0.2, steps=60)
    clicked.step_button.click()
    assert "step 1 of 60" in clicked.status.value and ".grad is None" in clicked.status.value
    assert clicked.lab.losses[-1] == clicked.lab.losses[0] > clicked.lab.reference_losses[-1]
    clicked.strategy.value = "rewire"
    clicked.run_button.click()
    assert (
        "step 60 of 60" in clicked.status.value
        and "gradient norms agree with one device's" in clicked.status.value
    )
    assert all(abs(a - b) < 1e-5 for a, b in zip(clicked.lab.losses, clicked.lab.reference_losses))

    walk = widgets.gradient_stepper(strategy="rewire", slots=2)
    walk.next_button.click()
    assert "step 1 of" in walk.status.value
    kinds = [s.kind for s in walk.flow.steps]
    assert kinds.count("join") == 4 and all(len(s.received) == 2 for s in walk.flow.steps if s.kind == "join")
    assert kinds[-1] == "original" and "replica" not in kinds
    assert GradientFlow("clone", slots=2).steps[-1].kind == "replica"
    walk.go(len(walk.flow) - 1)
    assert f"step {len(walk.flow) - 1} of {len(walk.flow) - 1}" in walk.status.value
    assert f"{len(walk.flow) - 1} backward steps" in walk.status.value

    priced = widgets.cost_explorer(width=64, slots=2)
    priced.slots.value = 3
    moved = {
        c.strategy: sum(c.bytes_by_op.values()) - c.bytes_by_op.get("gather", 0) for c in priced.lab.costs
    }
    assert "3 slots" in priced.status.value
    m = priced.lab.model_bytes
    assert moved == {"broadcast": 2 * m, "clone": 3 * m, "rewire": 3 * m}


def test_the_cost_section_says_the_budget_the_explorer_times_in(ipywidgets):
    """Section 3 says the explorer times five steps within a budget of 1 s, and says so when they do not
    fit: the lab's MIN_TIMED and max_repeats, and the default budget of CostLab and of the widget."""
    import inspect

    from dpteach import widgets
    from dpteach.widgets.cost import BUDGET_S, MIN_TIMED

    lab = CostLab()
    assert lab.budget_s == BUDGET_S and MIN_TIMED == lab.max_repeats == 5
    assert inspect.signature(widgets.cost_explorer).parameters["budget_s"].default == BUDGET_S
    cells = nbformat.read(ROOT / "notebooks" / "12_the_lab.ipynb", as_version=4).cells
    cost = section_3(cells)
    text = " ".join(cost.split())
    assert "five steps" in text and f"do not fit in {BUDGET_S:g} s" in text and "says so" in text
    assert "at least five" not in text
    few = CostLab(width=16, slots=2, budget_s=0.0)  # a budget too small for five: said, no time shown
    few.measure()
    assert "timed 1 step in 0 s" in few.status() and "µs" not in few.status().split("this machine:")[-1]


def test_cost_lab_before_measuring_says_to_call_measure():
    lab = CostLab(width=16, slots=2)
    assert "call measure()" in lab.status() and "call measure()" in "\n".join(lab.report())


def test_the_models_ranking_without_its_assumed_thread_starts():
    """The model's totals without DataParallel's thread starts are what it gives with PYTHON_THREAD_S at 0;
    the line the explorer shows says how much of DataParallel's step the assumption is."""
    from unittest import mock

    from dpteach.measure import costmodel
    from dpteach.widgets.cost import _workload, us

    lab = CostLab(width=256, slots=4)
    with mock.patch.object(costmodel, "PYTHON_THREAD_S", 0.0):
        work = _workload(lab.width, lab.seed)
        zero = {
            s: costmodel.predict(work, lab.gpu, lab.slots, strategy=s, latency=True).total_s
            for s in costmodel.STRATEGIES
        }
    without = lab.without_thread_starts()
    assert without == pytest.approx(zero, rel=1e-9)
    assert list(without) == sorted(zero, key=zero.get)  # fastest first
    dp = lab.modelled()["DataParallel"]
    line = lab.assumption_line()
    assert f"{(dp.total_s - without['DataParallel']) / dp.total_s:.1%} of DataParallel's" in line
    assert f"{lab.slots} thread starts" in line and "PYTHON_THREAD_S" in line and "not measured" in line
    # the step without them is the table's last column (CostLab.modelled_rows), in the widget and in text
    assert [row[-1] for row in lab.modelled_rows()] == [us(without[s]) for s in lab.modelled()]
    # with one slot there is nothing to start: the line says so instead of a ranking
    assert "neither wrapper replicates" in CostLab(width=16, slots=1).assumption_line()


def test_the_cost_explorer_shows_what_the_models_ranking_rests_on(ipywidgets):
    from dpteach import widgets

    view = widgets.cost_explorer(width=16, slots=2)
    # one labelled line under the bytes; what the model assumes and leaves out on hover (its title)
    assert "modelled, not measured, 2 x A100-SXM" in view.assumed.value
    assert "assumed thread starts" in view.assumed.value
    assert "PYTHON_THREAD_S" in view.assumed.value and "DDP" not in view.table.value
    view.slots.value = 3
    assert "3 thread starts" in view.assumed.value and "modelled, not measured, 3 x" in view.assumed.value


def test_most_of_the_models_gap_is_the_assumed_thread_starts_at_every_setting_of_the_explorer():
    """Section 3 says the model's gap between DataParallel and DDP is mostly its assumed thread starts:
    more than half of it at every width and slot count the explorer offers."""
    from dpteach.widgets.cost import WIDTHS

    for width in WIDTHS:
        for slots in range(2, 9):
            lab = CostLab(width=width, slots=slots)
            modelled, without = lab.modelled(), lab.without_thread_starts()
            gap = modelled["DataParallel"].total_s - modelled["DDP"].total_s
            left = without["DataParallel"] - without["DDP"]
            assert gap - left > gap / 2, (width, slots, gap, left)
    cells = nbformat.read(ROOT / "notebooks" / "12_the_lab.ipynb", as_version=4).cells
    cost = section_3(cells)
    assert "mostly one assumed constant, `costmodel.PYTHON_THREAD_S`" in " ".join(cost.split())


def test_at_the_large_learning_rate_rounding_grows_while_the_gradients_agree_at_the_same_weights():
    """Section 1a says the two runs first round apart in a float's last digits and the gap grows as the loss
    blows up, while at every step DataParallel's gradients agree with one device's at the same weights:
    the status line's rule (norms, relative gap at most 1e-4) says agree at every finite step."""
    from dpteach.widgets.training import MATCH

    lab = TrainingLab("rewire", slots=2, lr=10**-0.2, steps=10)
    gaps = []
    while not lab.done:
        lab.step()
        gaps.append(lab.weight_gap())
        rows = lab.grad_rows()
        assert all(row.matches for row in rows) and "gradient norms agree" in lab.status(), lab.status()
        # like for like: one device's gradient is taken at DataParallel's own weights
        twin = dict(lab.twin.named_parameters())
        assert all(torch.equal(twin[n], p) for n, p in lab.model.named_parameters())
    assert MATCH == 1e-4
    assert 0 < gaps[0] < 1e-7  # rounding only: 1a says "under 1e-7 at step 1"
    assert all(b > a for a, b in zip(gaps, gaps[1:])) and gaps[-1] > 1  # ... "to over 1 at step 10"
    cells = nbformat.read(ROOT / "notebooks" / "12_the_lab.ipynb", as_version=4).cells
    assert "starts a fresh run" in " ".join(tagged(cells, "explorer-intro").split())
    why = " ".join(tagged(cells, "large-lr-read").split())  # read after the table that shows it
    table = next(i for i, c in enumerate(cells) if "large-lr" in c.metadata.get("tags", []))
    assert "large-lr-read" in cells[table + 1].metadata.get("tags", [])
    assert "At the same weights DataParallel's gradients agree with one device's" in why
    assert "*norms* only, not weights" in why and "`agree` means a relative gap of at most 1e-4" in why
    assert "DIFFER" not in why  # the table at 0.631 never prints it (test_section_1a_table_says_...)
    assert "taken at DataParallel's own weights" in why and "`not finite`" in why


def test_section_1a_table_says_each_runs_inf_and_nan_at_its_own_step(capsys):
    """1a's table (DriftTable) marks every event for each run on its own: the cell, run as the chapter
    runs it, prints one line for each run's first inf and first nan, at the step the losses say, and
    the losses' 1% gap once; the table's gradient column says agree until a gradient is not finite."""
    cells = nbformat.read(ROOT / "notebooks" / "12_the_lab.ipynb", as_version=4).cells
    (cell,) = [c.source for c in cells if "large-lr" in c.metadata.get("tags", [])]
    assert "import math" not in cell and "said" not in cell  # the bookkeeping is DriftTable's
    scope = {"TrainingLab": TrainingLab}
    exec(cell, scope)
    printed = capsys.readouterr().out.splitlines()
    lab = scope["lab"]

    def first(values, test):
        return next(i for i, v in enumerate(values) if test(v))

    expected = {
        "DataParallel inf": first(lab.losses, math.isinf),
        "DataParallel nan": first(lab.losses, math.isnan),
        "one device inf": first(lab.reference_losses, math.isinf),
        "one device nan": first(lab.reference_losses, math.isnan),
    }
    for event, step in expected.items():
        (line,) = [row for row in printed if event in row]
        assert line.split()[0] == str(step), (event, line)
    assert len([row for row in printed if "losses 1% apart" in row]) == 1
    # the last line says where each run turns inf, then nan, from the same losses (1a's reading points to it)
    *printed, ends = printed
    dp_steps = f"inf at step {expected['DataParallel inf']}, nan at step {expected['DataParallel nan']}"
    one_steps = f"inf at step {expected['one device inf']}, nan at step {expected['one device nan']}"
    assert ends == (
        f"both runs: {dp_steps}"
        if dp_steps == one_steps
        else f"DataParallel: {dp_steps}; one device: {one_steps}"
    )
    why = " ".join(tagged(cells, "large-lr-read").split("<details>")[0].split())
    assert "the table's last line gives the steps" in why and "own step" not in why
    verdicts = [row for row in printed[1:] if "agree" in row or "not finite" in row]
    assert len(verdicts) == len(printed) - 1 and "DIFFER" not in "".join(printed)
    seen = [row.split()[0] for row in printed[1:]]
    assert seen[:10] == [str(i) for i in range(1, 11)]  # the first ten steps, then only the events


def test_changing_strategy_slots_or_lr_restarts_the_run():
    lab = TrainingLab("rewire", slots=2, steps=5)
    lab.step()
    assert lab.configure(steps=8) is False and lab.step_count == 1
    for change in ({"strategy": "broadcast"}, {"slots": 3}, {"lr": 0.1}):
        lab.step()
        assert lab.configure(**change) is True and lab.step_count == 0, change


def test_the_explorers_hand_count_is_what_the_flop_counter_counts():
    """CostLab counts its MLP by hand, so a chapter need not pay FlopCounterMode's first use (which imports
    torch._dynamo); the counts must be the counter's, at every width the slider offers."""
    from dpteach.course import story
    from dpteach.measure import costmodel
    from dpteach.widgets.cost import WIDTHS, _workload, wide_model

    x, _ = story.make_data(seed=0)
    for width in WIDTHS:
        assert _workload(width, 0) == costmodel.workload(wide_model(width, 0), x), width


def test_run_to_the_end_at_the_large_learning_rate_the_loss_goes_inf_then_nan():
    """The explorer's "What you should see" says the red note marks where both losses turn inf, then nan:
    at 0.631, run for the widget's 60 steps, the loss is inf first, then nan, on one device too."""
    lab = TrainingLab("rewire", slots=2, lr=10**-0.2, steps=60)
    first: dict[str, int] = {}
    while not lab.done:
        lab.step()
        for name, now in (("loss inf", math.isinf(lab.losses[-1])), ("loss nan", math.isnan(lab.losses[-1]))):
            if now:
                first.setdefault(name, lab.step_count)
    assert first["loss inf"] < first["loss nan"]
    assert all(math.isnan(v) for v in lab.losses[first["loss nan"] :])  # nan stays: every later step
    assert math.isnan(lab.reference_losses[-1])  # one device's run is lost too
    assert all(p.isnan().all() for p in lab.model.parameters())  # SGD spread it to every weight
    cells = nbformat.read(ROOT / "notebooks" / "12_the_lab.ipynb", as_version=4).cells
    assert not [c for c in cells if {"diverges", "diverges-why"} & set(c.metadata.get("tags", []))]
    # 1a asks the learner to run 0.631 in the explorer; its fold says what the chart shows
    assert "`inf`, then `nan`" in tagged(cells, "large-lr-why").split("<details>")[1]


def test_the_order_table_shows_a_reduce_add_between_replica_nodes_with_a_thread_per_replica():
    """Section 2b lists both orders node by node: the one-thread column is the stepper's order (2a); in the
    threaded column a ReduceAddBackward, marked ◀, runs with replica nodes still to come."""
    from dpteach.widgets.flow import order_table

    threaded, single = join_order(True), join_order(False)
    assert list(single.labels) == [s.label for s in GradientFlow("rewire", slots=2).steps[1:]]
    assert single.early == ()  # one thread: every ReduceAddBackward after every replica node
    # join_order's thread took a step before, so its count is past the replicas': no ties, the order is certain
    assert min(threaded.order[i]._sequence_nr() for i in threaded.joins) > max(
        threaded.order[i]._sequence_nr() for i in threaded.ops
    )
    assert len(threaded.early) == 3  # all but 0.weight's, whose last gradient comes from the last node
    for i in threaded.early:
        before = {threaded.labels[j] for j in threaded.ops if j < i}
        after = {threaded.labels[j] for j in threaded.ops if j > i}
        assert threaded.labels[i] == "ReduceAddBackward" and before and after  # in between replica nodes
    assert all("(replica " in threaded.labels[i] for i in threaded.ops)  # each replica node says whose
    rows = order_table({"a thread per replica": threaded, "one thread": single})
    steps = [row for row in rows if row[:4].strip().isdigit()]
    marked = [int(row.split()[0]) - 1 for row in steps if "◀" in row]
    assert marked == list(threaded.early)  # ◀ marks exactly those rows, and only in the threaded column
    assert len(steps) == len(single.order)
    legend = rows[: rows.index(next(r for r in rows if r.startswith("step")))]
    assert any("max:" in r for r in legend) and any(
        "◀" in r for r in legend
    )  # the marks, said before the rows


def test_what_the_order_fold_says_of_gpus_is_labelled_worked_out_not_measured():
    cells = nbformat.read(ROOT / "notebooks" / "12_the_lab.ipynb", as_version=4).cells
    main, deeper = tagged(cells, "join-order-why").split("<details>")
    assert "GPU" not in main and len(main.split()) <= 50  # the main path: one short statement, no GPU claim
    gpu = [p for p in deeper.split("\n\n") if "GPU" in p and "parallel_apply" not in p]
    assert gpu and all("worked out" in p and "not run here" in p for p in gpu), gpu


def test_the_order_folds_code_prints_both_orders(capsys):
    """The fold's snippet (no cell of its own: the table is an aside) runs and prints the table whose
    threaded column marks the early sums."""
    cells = nbformat.read(ROOT / "notebooks" / "12_the_lab.ipynb", as_version=4).cells
    (code,) = re.findall(r"```python\n(.*?)```", tagged(cells, "join-order-why"), re.S)
    exec(code, {})
    printed = capsys.readouterr().out
    assert "a thread per replica" in printed and "one thread" in printed and "◀" in printed
    # the steps the fold reads off the table are the table's: ◀ rows, then one thread's sums
    if slot_devices(2)[0].type != "cpu":
        return
    threaded, single = join_order(True), join_order(False)
    fold = " ".join(tagged(cells, "join-order-why").split())
    early = [str(i + 1) for i in threaded.early]
    late = [str(i + 1) for i in single.joins]
    assert f"at steps {', '.join(early[:-1])} and {early[-1]}." in fold and len(early) == 3
    assert f"at steps {', '.join(late[:-1])} and {late[-1]}." in fold and "all four" in fold


def test_what_the_intro_says_repeats_does_repeat():
    """The intro says the graphs, the losses, the byte counts and the stepper's order come out the same on
    every run (and the times do not)."""
    first, again = GradientFlow("rewire", slots=3), GradientFlow("rewire", slots=3)
    assert [(s.label, s.received, s.handoffs) for s in first.steps] == [
        (s.label, s.received, s.handoffs) for s in again.steps
    ]
    assert first.graph.dot == again.graph.dot
    runs = [TrainingLab("broadcast", slots=2, lr=0.2, steps=5) for _ in range(2)]
    for lab in runs:
        lab.run()
    assert runs[0].losses == runs[1].losses
    cells = nbformat.read(ROOT / "notebooks" / "12_the_lab.ipynb", as_version=4).cells
    intro = " ".join(tagged(cells, "lab-intro").split())
    assert "same on every run" in intro and "times the cost explorer measures do not" in intro


def test_the_counts_section_3_states_hold_at_every_width_on_slots_that_share_a_device():
    """Section 3's fold and the Summary: on n slots that share one device broadcast copies n-1 models, clone
    and rewire n, each plus the same gather, at every width; the model ranks DDP first at every width, with
    its thread starts and without. Each statement of the counts names that condition."""
    from dpteach.widgets.cost import WIDTHS

    if len(set(slot_devices(4))) != 1:
        pytest.skip("the counts are for slots that share one device")
    for width in WIDTHS[:3]:  # the widest takes seconds to step: its bytes grow the same way (test_widgets)
        lab = CostLab(width=width, slots=4, max_repeats=1, budget_s=0.0)
        lab.measure()
        copies = {c.strategy: c.bytes_by_op for c in lab.costs}
        assert copies["broadcast"] == {"broadcast": 3 * lab.model_bytes, "gather": 256 * 4}, width
        assert copies["clone"] == copies["rewire"] == {"clone": 4 * lab.model_bytes, "gather": 256 * 4}, width
    for width in WIDTHS:
        for slots in range(2, 9):  # the cell's 4 slots, and every other setting of the explorer's slider
            lab = CostLab(width=width, slots=slots)
            ranked = (list(lab.modelled()), list(lab.without_thread_starts()))
            assert ranked == (["DDP", "DataParallel"],) * 2, (width, slots)
    cells = nbformat.read(ROOT / "notebooks" / "12_the_lab.ipynb", as_version=4).cells
    summary = " ".join(tagged(cells, "summary").split())
    assert 'on slots that share one device `"broadcast"` copies the fewest' in summary
    # between devices broadcast and rewire tie (test_on_distinct_gpus_...); broadcast's packs stay local
    assert 'Between distinct GPUs `"broadcast"` and `"rewire"` tie at 2n−2 transfers' in summary
    assert '`"broadcast"` adds n+1 local packs' in summary and "counts the most" not in summary
    assert "on slots that share a device" in " ".join(tagged(cells, "lab-intro").split())
    cost = section_3(cells)
    counts = fold(cost, "Going deeper: distinct GPUs")
    assert (
        counts.startswith("On n slots that share one device") and "On n distinct GPUs (worked out" in counts
    )
    assert "on fake GPUs; not run on real ones" in counts
    # the main path gives the distinct-GPU counts in one sentence after the explorer, and the Summary the
    # ranking; the sentence's counts are the fold's
    (after,) = [i for i, c in enumerate(cells) if "distinct-gpus" in c.metadata.get("tags", [])]
    explorer = next(i for i, c in enumerate(cells) if "widgets.cost_explorer(" in c.source)
    gpus = " ".join(cells[after].source.split())
    assert after > explorer and "worked out, not run" in gpus and "the ranking changes" in gpus
    assert "share one device" in gpus and "Going deeper: distinct GPUs" in gpus
    # the main path counts transfers between devices only, and says local copies come on top
    assert '`"broadcast"` and `"rewire"` tie at 2n−2 model-sized transfers and `"clone"` makes n−1' in gpus
    assert "plus local copies" in gpus and "3n" not in gpus
    assert '"broadcast"` makes 3n−1' in counts and '"rewire"` 3n−2' in counts and '"clone"` 2n−1' in counts
    assert all(op in counts for op in ("`scatter`", "`reduce_add`", "`to`", "`pack`"))
    # the answer to section 3's prediction says the counts checked above
    (seen,) = [p for p in cost.split("<details>") if p.startswith("<summary>What you should see")]
    seen = " ".join(seen.split())
    assert "n−1 model copies for n slots" in seen and "one model copy above it" in seen


def _sum(replicas):
    return sum(r[0].weight.grad for r in replicas)


def test_exercise_2_check_passes_the_answer_and_names_each_mistake(fresh_checks):
    """The likely mistakes: a replica indexed as if it were a layer (AttributeError on a Sequential), a
    non-leaf replica's .grad under "rewire" (None, with PyTorch's warning), the original's .grad under
    "clone" (None, a leaf), a mean for the sum, one replica's gradient for the sum."""
    checks = fresh_checks
    clone, rewire = GradientFlow("clone", slots=2), GradientFlow("rewire", slots=2)

    def check(compare):
        return checks.clone_grads_add_up(compare, clone, rewire)

    right = check(lambda c, r: (_sum(c.replicas), r.model[0].weight.grad))
    assert right.ok and torch.equal(_sum(clone.replicas), rewire.model[0].weight.grad)
    assert "Equal, to the last bit" in right.message  # ReduceAdd adds from zero in replica order, as sum()
    cells = nbformat.read(ROOT / "notebooks" / "12_the_lab.ipynb", as_version=4).cells
    (answer,) = [c.source for c in cells if c.source.startswith("<details><summary>Answer 2")]
    assert "to the last bit" in answer and "rounding" not in answer
    # the fix is both the summing node and the edge to the original, in the answer and in the check
    answer = " ".join(answer.split())
    assert "sums them and leads to the original" in answer and "not arithmetic" not in answer
    assert "ReduceAdd node per parameter that sums" in right.message
    mistakes = {
        "index the layer": lambda c, r: (sum(x.weight.grad for x in c.replicas), r.model[0].weight.grad),
        "non-leaf grad": lambda c, r: (_sum(c.replicas), r.replicas[0][0].weight.grad),
        "a grad is None": lambda c, r: (_sum(c.replicas), c.model[0].weight.grad),
        "averaged": lambda c, r: (_sum(c.replicas) / 2, r.model[0].weight.grad),
        "one replica": lambda c, r: (c.replicas[1][0].weight.grad, r.model[0].weight.grad),
        "wrong tensor": lambda c, r: (sum(x[0].bias.grad for x in c.replicas), r.model[0].bias.grad),
        "wrong original": lambda c, r: (_sum(c.replicas), -r.model[0].weight.grad),
        "wrong sum": lambda c, r: (_sum(c.replicas) * 3, r.model[0].weight.grad),
        "not two tensors": lambda c, r: (_sum(c.replicas).tolist(), r.model[0].weight.grad),
        "raised": lambda c, r: (_sum(c.replicas), r.model[7].weight.grad),
    }
    # what to change, in the message's first line: a verb a learner acts on, and where
    change = re.compile(r"\b(read|add|take|set|change|index|pick|move)\b", re.I)
    for problem, compare in mistakes.items():
        verdict = check(compare)
        assert not verdict.ok and verdict.problem == problem, (problem, verdict)
        first = verdict.message.splitlines()[0]
        assert change.search(first.split(":", 1)[1]), (problem, first)
    # summing the "rewire" replicas' own .grad reads non-leaves too, and PyTorch's warning is why
    assert check(lambda c, r: (_sum(r.replicas), r.model[0].weight.grad)).problem == "non-leaf grad"
    unset = check(lambda c, r: (..., ...))
    assert not unset.ok and "Hint" not in unset.message


def test_exercise_2_check_rejects_answers_that_never_compare_two_tensors(fresh_checks):
    """Values alone cannot tell a right answer: rewire's original gradient equals the clone replicas'
    sum to the last bit, so one tensor returned twice, or rewire's gradient as `summed`, or the clone
    sum as `original`, would pass on values. Each gets what to change instead."""
    checks = fresh_checks
    clone, rewire = GradientFlow("clone", slots=2), GradientFlow("rewire", slots=2)

    def twice_rewire(c, r):
        summed = original = r.model[0].weight.grad
        return summed, original

    def twice_clone(c, r):
        summed = original = _sum(c.replicas)
        return summed, original

    wrong = {
        "same tensor": [twice_rewire, twice_clone],
        "original not read": [lambda c, r: (_sum(c.replicas), _sum(c.replicas))],
    }
    for problem, answers in wrong.items():
        for compare in answers:
            verdict = checks.clone_grads_add_up(compare, clone, rewire)
            assert not verdict.ok and verdict.problem == problem, (problem, verdict)
            assert verdict.message.startswith("Not yet") and "set " in verdict.message.splitlines()[0]
    # the stub's answer still passes, `.to(device)` and all
    right = checks.clone_grads_add_up(
        lambda c, r: (
            sum(x[0].weight.grad.to(r.model[0].weight.device) for x in c.replicas),
            r.model[0].weight.grad,
        ),
        clone,
        rewire,
    )
    assert right.ok, right


@pytest.mark.parametrize(
    "tag, answer",
    [
        (
            "one-slot",
            {
                "learned = ...": "learned = True",
                "is_model = ...": "is_model = False",
            },
        ),
        (
            "clone-grads-add-up",
            {
                "summed = ...": "summed = sum(r[0].weight.grad.to(device) for r in clone.replicas)",
                "original = ...": "original = rewire.model[0].weight.grad",
            },
        ),
        (
            "predict-bytes",
            {
                "model_bytes = ...": "model_bytes = 4 * (width**2 + 5 * width + 1)",
                "broadcast_bytes = ...": "broadcast_bytes = (slots - 1) * model_bytes + gather_bytes",
                "clone_bytes = ...": "clone_bytes = slots * model_bytes + gather_bytes",
            },
        ),
        (
            "summing-order",
            {
                "first_replica = ...": "first_replica = max(range(len(replicas)), key=lambda i: max(replicas[i]))",
                "sums_last = ...": "sums_last = max(sums) < min(min(r) for r in replicas)",
            },
        ),
        (
            "calm-drift",
            {
                "return ...": "return (gaps[-1] / gaps[0]) ** (1 / (len(gaps) - 1))",
                "made_by_lr = ...": "made_by_lr = False",
            },
        ),
    ],
)
def test_the_exercise_cells_accept_the_answer(fresh_checks, tag, answer):
    """The chapter's stub cell, with the answer written in, runs and its check says Correct."""
    cells = nbformat.read(ROOT / "notebooks" / "12_the_lab.ipynb", as_version=4).cells
    (source,) = [c.source for c in cells if c.cell_type == "code" and tag in c.metadata.get("tags", [])]
    for stub, line in answer.items():
        assert stub in source
        source = source.replace(stub, line)
    *body, last = source.rstrip().splitlines()
    # as earlier cells left them (exercise 1's cell imports checks itself)
    scope = {
        "GradientFlow": GradientFlow,
        "CostLab": CostLab,
        "checks": fresh_checks,
        "devices": slot_devices(2),
        "torch": torch,
        "TrainingLab": TrainingLab,
    }
    exec("\n".join(body), scope)
    assert eval(last, scope).ok


def test_exercise_3_check_passes_the_answer_and_says_what_to_change(fresh_checks):
    """Exercise 3: predict(width, slots, gather_bytes) is checked at the cell's setting and at one no cell
    shows, so numbers typed in for width 128 on 3 slots fail; each likely slip (slot 0 given a copy under
    "broadcast", or none under "clone"; the gather left out; the parameters miscounted) gets its own
    finding, and the stub no hint."""
    if len(set(slot_devices(3))) != 1:
        pytest.skip("the exercise's counts are for slots that share one device")
    from dpteach.course.checks import OTHER_SETTING

    lab = CostLab(width=128, slots=3, timed=False)
    model, gather = lab.model_bytes, 256 * 4
    cells = nbformat.read(ROOT / "notebooks" / "12_the_lab.ipynb", as_version=4).cells
    (answer,) = [c.source for c in cells if c.source.startswith("<details><summary>Answer 3")]
    said = dict(re.findall(r"`(\w+_bytes) = ([^`]+)`", answer))
    assert eval(said["model_bytes"], {"width": lab.width}) == model  # the answer's formula is the count
    (stub,) = [
        c.source for c in cells if c.cell_type == "code" and "predict-bytes" in c.metadata.get("tags", [])
    ]
    assert f"width={lab.width}, slots={lab.slots}" in stub and "model_bytes = ..." in stub
    assert "def predict(width, slots, gather_bytes):" in stub
    flat = " ".join(answer.split())
    assert f"{model // 4:,} at width {lab.width}" in flat and f"{model:,} bytes" in flat
    (route,) = [c.source for c in cells if c.cell_type == "code" and "cost.report(" in c.source]
    assert f"width={lab.width}" not in route  # no earlier cell prints this width's bytes
    assert OTHER_SETTING != (lab.width, lab.slots)

    def make(model_of=lambda w: 4 * (w**2 + 5 * w + 1), copies=lambda n: (n - 1, n), gathered=(1, 1)):
        def predict(width, slots, gather_bytes):
            m = model_of(width)
            b, c = copies(slots)
            return m, b * m + gathered[0] * gather_bytes, c * m + gathered[1] * gather_bytes

        return predict

    right = make()
    assert fresh_checks.predicted_bytes(right, lab).ok
    counted = {c.strategy: c.bytes for c in CostLab(width=128, slots=3, timed=False).measure()}
    assert right(128, 3, gather)[1:] == (counted["broadcast"], counted["clone"])
    slips = {
        "slot 0": make(copies=lambda n: (n, n)),  # broadcast given a copy for slot 0 too
        "gather": make(gathered=(0, 1)),
        "model copies": make(copies=lambda n: (n - 1, 1)),
        "counts": make(copies=lambda n: (n - 1 + 0.5, n)),
        "model bytes": make(model_of=lambda w: 4 * (w**2 + 3 * w + 1)),  # two layers' biases left out
        "typed in": lambda w, n, g: (
            68_100,
            2 * 68_100 + 1_024,
            3 * 68_100 + 1_024,
        ),  # right at 128 on 3 only
    }
    for problem, predict in slips.items():
        assert fresh_checks.predicted_bytes(right, lab).ok  # a right answer starts the ladder again
        verdict = fresh_checks.predicted_bytes(predict, lab)
        assert not verdict.ok and verdict.problem == problem, (problem, verdict)
        assert "Hint 1 of 2" in verdict.message and "model_bytes +" not in verdict.message  # no answer yet
    typed = fresh_checks.predicted_bytes(
        lambda w, n, g: (4 * (w**2 + 5 * w + 1), 2 * 68_100 + g, 3 * 68_100 + g), lab
    )
    assert (
        typed.problem == "typed in"
        and "`broadcast_bytes`" in typed.message
        and "not as a number" in typed.message
    )
    third = fresh_checks.predicted_bytes(slips["typed in"], lab)
    assert "The answer" in third.message and "slots * model_bytes + gather_bytes" in third.message
    unset = fresh_checks.predicted_bytes(lambda w, n, g: (..., ..., ...), lab)
    assert not unset.ok and "Hint" not in unset.message
    assert not fresh_checks.predicted_bytes(..., lab).ok
    assert fresh_checks.predicted_bytes(lambda w, n, g: ("535,560", 0, 0), lab).problem == "not an answer"


def test_the_chapter_imports_each_name_once():
    """A name imported in an earlier cell is still there in a later one: importing it again only adds noise."""
    cells = nbformat.read(ROOT / "notebooks" / "12_the_lab.ipynb", as_version=4).cells
    seen: dict[str, int] = {}
    for i, cell in enumerate(cells):
        if cell.cell_type != "code" or "remove-cell" in cell.metadata.get("tags", []):
            continue  # the Colab set-up cell is the same in every chapter
        for node in ast.walk(ast.parse(cell.source)):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    name = alias.asname or alias.name
                    assert name not in seen, f"cell {i} imports {name} again (cell {seen[name]} did)"
                    seen[name] = i


def test_the_recap_defines_the_strategies_and_the_course_model_the_chapter_uses():
    """The recap at the top (the first cell, from dpteach._course.recap) names the two working strategies with
    the node that joins the replicas, the explorer's intro says what "clone" is, and the recap's course model
    is the one dpteach.course.story builds (the layers and the points)."""
    from dpteach.course import story
    from dpteach.widgets.training import STRATEGIES

    cells = nbformat.read(ROOT / "notebooks" / "12_the_lab.ipynb", as_version=4).cells
    recap = cells[0].source.partition("<details>")[2]
    assert recap.startswith("<summary>Recap") and "**slot**" in recap
    recap = " ".join(recap.split())  # prose wraps anywhere
    assert '`"rewire"` joins' in recap and "`ReduceAdd`" in recap and '`"broadcast"`' in recap
    intro = " ".join(tagged(cells, "explorer-intro").split())
    assert '`"clone"` builds the replicas' in intro and "no gradient edge" in intro
    assert set(STRATEGIES) == {"clone", "rewire", "broadcast"}  # the three the recap and intro define
    layers = [type(m).__name__ for m in story.make_model()]
    first, _, last = story.make_model()
    shown = f"Linear({first.in_features}, {first.out_features}) → Tanh → Linear({last.in_features}, 1)"
    assert layers == ["Linear", "Tanh", "Linear"] and shown in recap
    assert f"{len(story.make_data()[0])} points" in recap


def test_at_the_large_learning_rate_the_red_note_says_what_section_1a_tells_the_learner_to_read(ipywidgets):
    """Section 1a reads the blown-up loss curve by its red note: the note says from which step each line is
    off the axis, then inf, then nan."""
    import base64

    from dpteach import widgets

    view = widgets.explorer(strategy="rewire", slots=2, lr=0.2, steps=60)
    view.lr.value = 10**-0.2  # the slider's notch 0.631
    view.run_button.click()
    (svg,) = [base64.b64decode(b).decode() for b in re.findall(r"base64,([^\"]+)", view.curve.value)]
    notes = re.findall(r'<text class="off-axis"[^>]*>([^<]*)</text>', svg)[1:]
    # one line for both, or one each where rounding parts them by a step or two (it rests on the CPU)
    one = r"(both lines|one device|DataParallel): inf from step \d+, nan from \d+"
    assert 1 <= len(notes) <= 2 and all(re.fullmatch(one, note) for note in notes), notes
    (mark,) = re.findall(r'<text class="mark"[^>]*>([^<]*)</text>', svg)
    cells = nbformat.read(ROOT / "notebooks" / "12_the_lab.ipynb", as_version=4).cells
    # 1a's main path says the status line's rule; the chart's marks are in its "What you should see" fold
    main, fold = tagged(cells, "large-lr-why").split("<details>")  # the question, then the chart's marks
    why = " ".join(fold.split())
    assert "dashed line" not in main and "red note" not in main
    assert "log scale" in why and "dashed line" in why and "red note" in why, why
    assert "over 1% apart" in why  # the mark's own words: "differ by over 1%"
    # the question moved from section 1's list to 1a, where the slider's scale is said
    assert "0.631" not in tagged(cells, "explorer-intro") and "logarithmic" in main
    assert mark.startswith("from step ") and "differ by over 1%" in mark


def test_exercise_1_check_passes_the_answer_and_says_which_answer_to_change(fresh_checks):
    """Exercise 1's learner takes the step and reads both facts: the one-device DataParallel step's gradient
    reaches the model (DataParallel.forward calls the module itself) and replicate still makes a clone. The
    answers are two booleans, so the first wrong try names neither (that would give its answer away): it
    says what to read. From the second try each message names the evidence and the variable to change."""
    from dpteach import DataParallel, replicate
    from dpteach.course import story

    checks = fresh_checks
    device = slot_devices(1)[0]
    model = story.make_model().to(device)
    x, y = (t.to(device) for t in story.make_data())
    torch.nn.functional.mse_loss(DataParallel(model, [device], strategy="clone")(x), y).backward()
    (replica,) = replicate(model, [device], strategy="clone")
    assert replica is not model and all(p.grad is not None for p in model.parameters())
    assert checks.one_slot_step(True, False, model, replica).ok
    for (learned, is_model), problem, change in [
        ((False, False), "learned", "Change `learned`."),
        ((False, True), "learned", "Change `learned`."),
        ((True, True), "is_model", "Change `is_model`."),
    ]:
        assert checks.one_slot_step(True, False, model, replica).ok  # the ladder starts again from rung 1
        first = checks.one_slot_step(learned, is_model, model, replica)
        line = first.message.splitlines()[0]
        assert not first.ok and first.problem == problem and "Change `" not in line and "norm" not in line
        assert "model[0].weight.grad" in line and "`replica is model`" in line  # what to read
        assert "Hint 1 of 2: " in first.message
        again = checks.one_slot_step(learned, is_model, model, replica)
        assert not again.ok and again.problem == problem and change in again.message.splitlines()[0]
    assert checks.one_slot_step("True", False, model, replica).problem == "not an answer"
    unset = checks.one_slot_step(..., ..., model, replica)
    assert not unset.ok and "Hint" not in unset.message  # an answer not given yet costs no hint
    # a model whose gradient never arrived: the message says so
    untouched = story.make_model().to(device)
    assert checks.one_slot_step(True, False, model, replica).ok
    checks.one_slot_step(True, False, untouched, replica)  # the first wrong try names nothing
    assert "is None" in checks.one_slot_step(True, False, untouched, replica).message


def test_exercise_1_first_hint_names_the_idea_and_the_answer_says_one_gpu_hid_the_bug(fresh_checks):
    """The first wrong try's hint names the idea (what a step needs with one device), not the mechanism;
    the correct message and Answer 1 say that a one-GPU test could never have caught the 2019 bug."""
    from dpteach import DataParallel, replicate
    from dpteach.course import story

    checks = fresh_checks
    device = slot_devices(1)[0]
    model = story.make_model().to(device)
    x, y = (t.to(device) for t in story.make_data())
    torch.nn.functional.mse_loss(DataParallel(model, [device], strategy="clone")(x), y).backward()
    (replica,) = replicate(model, [device], strategy="clone")
    hint = checks.one_slot_step(False, True, model, replica).message.split("Hint 1 of 2: ")[1]
    assert "calls the module itself" not in hint and "skips" not in hint
    assert "learned" not in hint and "is_model" not in hint and "True" not in hint  # the idea, no answer
    assert (
        "one GPU could never have caught the 2019 bug"
        in checks.one_slot_step(True, False, model, replica).message
    )
    cells = nbformat.read(ROOT / "notebooks" / "12_the_lab.ipynb", as_version=4).cells
    (answer,) = [
        " ".join(c.source.split()) for c in cells if c.source.startswith("<details><summary>Answer 1")
    ]
    assert "one GPU could never have caught the 2019 bug" in answer


def test_the_order_table_is_the_same_whatever_this_thread_has_counted():
    """join_order runs its step on a thread of its own after one step there, so section 2b's numbers do
    not depend on how many nodes the kernel's thread made before; on a fresh counter the threaded
    ReduceAddBackward nodes count from 0 and tie with the replicas' nodes, and the order changes."""
    from dpteach.widgets.flow import order_table

    if slot_devices(2)[0].type != "cpu":
        pytest.skip("on GPUs each device's nodes run on a thread of their own: the chapter's CPU order")
    first = order_table({"t": join_order(True), "o": join_order(False)})
    x = torch.ones(2, requires_grad=True)
    for _ in range(50):  # this thread's counter moves on by 50
        x = x * 1.0
    assert order_table({"t": join_order(True), "o": join_order(False)}) == first
    warm, fresh = join_order(True), join_order(True, steps_before=0)
    numbers = {found: [found.order[i]._sequence_nr() for i in found.joins] for found in (warm, fresh)}
    assert min(numbers[warm]) > max(warm.order[i]._sequence_nr() for i in warm.ops)  # they outrank
    assert sorted(numbers[fresh]) == [0, 1, 2, 3]  # the same numbers as the replicas' own nodes
    assert fresh.joins != warm.joins  # so they run elsewhere in the order
    cells = nbformat.read(ROOT / "notebooks" / "12_the_lab.ipynb", as_version=4).cells
    (code,) = re.findall(r"```python\n(.*?)```", tagged(cells, "join-order-why"), re.S)
    assert len(code.splitlines()) <= 3  # the fold's snippet stays short: the warm-up is join_order's own
    # the fold says why the sums outnumber the replicas: join_order's own thread and its earlier step
    fold = " ".join(tagged(cells, "join-order-why").split())
    assert "`join_order` runs the step on a fresh thread of its own, after one earlier step there" in fold
    assert "steps_before" not in fold  # the fresh-counter case is the test's, not the learner's


def test_on_one_device_the_counts_leave_out_backwards_sum_and_the_report_says_so():
    """Section 3's counts are for slots on one device: rewire's backward sum adds in place, so no
    reduce_add is recorded, and the report says the figure is one device's."""
    from dpteach.widgets.cost import ONE_DEVICE

    if len(set(slot_devices(2))) != 1:
        pytest.skip("on distinct devices backward's sum is a counted copy")
    lab = CostLab(width=16, slots=2, max_repeats=1, budget_s=0.0)
    lab.measure()
    assert all("reduce_add" not in c.bytes_by_op and "scatter" not in c.bytes_by_op for c in lab.costs)
    assert ONE_DEVICE in lab.report()


def test_the_cost_model_is_one_labelled_line_under_the_bytes_and_says_what_it_leaves_out():
    """Section 3 ranks by counted bytes; the cost model is one line labelled "modelled, <profile>" under them
    (report, exercise 3's cell), and its table, in modelled_lines(), names FP32's peak and both packing
    copies it leaves out."""
    from dpteach.widgets.cost import LEFT_OUT

    lab = CostLab(width=256, slots=4, max_repeats=1, budget_s=0.0)
    lab.measure()
    report = lab.report()
    assert report[-1] == lab.modelled_line() and report[-1].startswith(
        "modelled, not measured, 4 x A100-SXM: DDP wins"
    )
    assert not [line for line in report[:-1] if "DDP" in line]  # the model's table is not in the report
    table = " ".join(" ".join(lab.modelled_lines()).split())
    assert "FP32 peak" in table and "not TF32's" in table and LEFT_OUT in table
    assert (
        "DataParallel's of the parameters before its broadcast" in LEFT_OUT and "into its bucket" in LEFT_OUT
    )
    cells = nbformat.read(ROOT / "notebooks" / "12_the_lab.ipynb", as_version=4).cells
    # the text route of section 3: the counts, nothing timed and no modelled line (its fold explains it)
    (route,) = [c.source for c in cells if c.cell_type == "code" and "cost.report(" in c.source]
    assert "timed=False" in route and "report(modelled=False)" in route and "µs" not in lab.modelled_line()
    assert lab.report(modelled=False) == report[:-1]
    gate = tagged(cells, "join-order-why")
    deeper = " ".join(gate.split("<details>")[1].split())
    # beside the snippet: the threads are dpteach's, modelled on torch's parallel_apply, which needs an
    # accelerator (test_only_the_forward_is_split_over_threads_and_the_backward_runs_on_the_caller)
    assert (
        "as dpteach runs slots on distinct GPUs (a thread per device), modelled on torch's Python "
        "`parallel_apply`" in deeper
    )
    from dpteach.parallel_apply import parallel_apply as dpteach_apply

    assert "a thread per device" in dpteach_apply.__doc__ and "CPU slots start no thread" in " ".join(
        dpteach_apply.__doc__.split()
    )
    assert "but only on an accelerator" in deeper
    assert "a pool started once, by the first backward the process runs" in deeper  # engine.cpp call_once
    # the main path says the order is the one-thread order and points to the fold for threads
    rule = " ".join(tagged(cells, "order-rule").split())
    assert "That holds on CPU slots" in rule and "On GPUs the order differs (Going deeper, below)" in rule
    assert "parallel_for" not in gate and "OpenMP" not in gate  # the C++ pool's detail is left to its source


def test_the_explorers_answers_in_text_wait_in_the_fold(capsys):
    """Section 1 asks its predictions before the explorer; the text route that answers them is a snippet in
    the "What you should see" fold, not a cell whose printout would sit under the widget before anyone
    pressed a button. The snippet runs and prints what the fold says."""
    cells = nbformat.read(ROOT / "notebooks" / "12_the_lab.ipynb", as_version=4).cells
    intro, folds = tagged(cells, "explorer-intro"), tagged(cells, "explorer-seen")
    (code,) = re.findall(r"```python\n(.*?)```", folds.split("<details>")[1], re.S)
    exec(code, {})
    printed = capsys.readouterr().out
    assert "clone: " in printed and ".grad is None" in printed
    assert "rewire: " in printed and "broadcast: " in printed and "gradient norms agree" in printed
    assert "BroadcastBackward sums 8 gradients" in printed and "PR #20910" in printed  # rewire's joins too
    assert "(no summing node)" in printed  # "clone"'s line, not a blank one
    # the fold's answer at 4 slots is what the same text prints there
    seen = " ".join(folds.split("<details>")[2].split())
    assert (
        'change `slots=2` to 4 in the text above and it prints "BroadcastBackward sums 16 gradients"' in seen
    )
    assert "slots=2" in code
    four = [s.text for s in GradientFlow("broadcast", slots=4).steps if s.kind == "join"]
    assert len(four) == 1 and four[0].startswith("BroadcastBackward sums 16 gradients")
    # the stills are for where widgets cannot run (a kernel must run the cell to draw one)
    predict = " ".join(tagged(cells, "explorer-predict").split())
    assert (
        "Where widgets cannot run, the still above shows step 0" in predict
        and "Without a kernel" not in intro
    )
    # no code cell between the predictions and section 1a prints a lab's status
    start = next(i for i, c in enumerate(cells) if "explorer-intro" in c.metadata.get("tags", []))
    end = next(i for i, c in enumerate(cells) if "large-lr-why" in c.metadata.get("tags", []))
    assert not [c for c in cells[start:end] if c.cell_type == "code" and "status()" in c.source]


def test_the_order_rule_is_said_for_one_backward_and_the_fold_says_depth_comes_first():
    """CompareNodeTaskTime (engine.h) ranks by reentrant depth, then by sequence number: a backward() called
    inside a node's backward shares the CPU thread's ready queue (engine.cpp, init_local_ready_queue) and its
    nodes run before an outer node with a higher number that is ready too."""
    ran = []
    inner_leaf = torch.ones(2, requires_grad=True)
    inner = (inner_leaf * 2).sum()  # made first: the lowest numbers

    class Reenter(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            torch.autograd.backward(inner)  # one deeper
            return g

    x = torch.ones(2, requires_grad=True)
    outer = (x * 3).sum()  # ready when Reenter's node runs, and numbered above the inner nodes
    loss = outer + Reenter.apply(x).sum()
    nodes = {"inner": inner.grad_fn, "outer": outer.grad_fn}
    for name, fn in nodes.items():
        fn.register_prehook(lambda grads, name=name: ran.append(name))
    assert nodes["outer"]._sequence_nr() > nodes["inner"]._sequence_nr()
    loss.backward()
    assert ran == ["inner", "outer"]  # depth before number
    cells = nbformat.read(ROOT / "notebooks" / "12_the_lab.ipynb", as_version=4).cells
    # the main path states the rule for the chapter's one backward; nesting is the fold's
    rule = " ".join(tagged(cells, "order-rule").split())
    assert (
        "of the nodes ready in one queue, the engine runs the one with the highest *sequence number*" in rule
    )
    assert "that of the thread that called `backward()`" in rule and "nested" not in rule
    assert "tied" not in rule
    summary = " ".join(tagged(cells, "summary").split())
    # it says the condition it holds under (no nested backward) in its own words, not by the fold's term
    assert "In a `backward()` that runs no other `backward()` inside it, as here" in summary
    assert "reentrant" not in summary
    assert "the one with the highest sequence number runs first" in summary and "`UINT64_MAX`" in summary
    deeper = " ".join(tagged(cells, "join-order-why").split("<details>")[1].split())
    assert "ranks first by *reentrant depth*" in deeper and "`std::priority_queue`" in deeper
    assert "on CPU it shares the calling thread's queue, and its nodes run first" in deeper
    assert "with none they tie" not in deeper and "steps_before" not in deeper


def test_broadcasts_originals_tie_and_the_chapter_calls_their_order_the_heaps():
    """Under "broadcast" the four originals' AccumulateGrad nodes are ready at once with one number, the
    largest there is, so the heap alone orders them, and not in parameter order; under "rewire" the sums
    run last parameter first, as the rule says."""
    flow = GradientFlow("broadcast", slots=2)
    originals = [s.label.removeprefix("original ") for s in flow.steps if s.kind == "original"]
    names = [name for name, _ in flow.model.named_parameters()]
    assert sorted(originals) == sorted(names) and originals != names  # the heap's order, not parameter order
    accumulators = [p.view_as(p).grad_fn.next_functions[0][0] for p in flow.model.parameters()]
    assert {type(a).__name__ for a in accumulators} == {"AccumulateGrad"}
    assert {a._sequence_nr() for a in accumulators} == {2**64 - 1}  # UINT64_MAX each, so all four tie
    rewire = [
        s.label.removeprefix("original ")
        for s in GradientFlow("rewire", slots=2).steps
        if s.kind == "original"
    ]
    assert rewire == names[::-1]  # the sums run in reverse parameter order: 2.bias first
    cells = nbformat.read(ROOT / "notebooks" / "12_the_lab.ipynb", as_version=4).cells
    ties = " ".join(tagged(cells, "order-ties").split())
    assert ties.startswith("<details><summary>Going deeper: the originals' order, and ties</summary>")
    assert "an artefact of the heap, not parameter order" in ties and "`std::priority_queue`" in ties
    assert "`2.bias`'s, carries the highest number of the four and runs first" in ties
    assert "(`UINT64_MAX`, set in `torch/csrc/autograd/functions/accumulate_grad.cpp`" in ties
    assert "documented in NOTE [ Sequence Number], `torch/csrc/autograd/node.h`)" in ties
    assert ties.split("</summary> ")[1].startswith(
        "An original's `AccumulateGrad` runs the moment"
    )  # claim first
    order = [c.metadata.get("tags", []) for c in cells]
    assert order.index(["order-ties"]) == order.index(["order-rule"]) + 1  # right after the rule


def test_the_rules_why_it_matters_says_how_ddp_cuts_its_buckets():
    """Section 2's rule says DDP's first buckets follow reversed parameter order (distributed.py hands the
    Reducer the reversed bucket list) and that it rebuilds them once, from the ready order, only when
    static_graph or not find_unused_parameters (reducer.hpp, should_rebuild_buckets)."""
    import inspect

    import torch.nn.parallel.distributed as ddp

    source = inspect.getsource(ddp.DistributedDataParallel)
    assert "list(reversed(bucket_indices))" in source and "self.reducer._rebuild_buckets()" in source
    header = Path(torch.__file__).parent / "include/torch/csrc/distributed/c10d/reducer.hpp"
    if header.exists():
        assert (
            "return (static_graph_ || !find_unused_parameters_) && !has_rebuilt_bucket_;"
            in header.read_text()
        )
    cells = nbformat.read(ROOT / "notebooks" / "12_the_lab.ipynb", as_version=4).cells
    rule = " ".join(tagged(cells, "order-rule").split())
    assert rule.startswith(
        "**The rule:** of the nodes ready to run, autograd runs the one its thread made last."
    )
    assert "Its first buckets follow reversed parameter order" in rule
    assert (
        "after the first iteration it rebuilds them once, in this ready order, if `static_graph=True` or"
        in rule
    )
    assert "`find_unused_parameters=False` (`distributed.py`, `reducer.hpp`" in rule


def test_exercise_4_checks_the_order_rule_against_a_recorded_backward(fresh_checks):
    """The learner's apply_rule reads sequence numbers; the check compares it with three recorded backwards
    (join_order, a hook on every node): the cell's three CPU slots (replica 2 first, sums last), the forwards
    in another order (replica 0 first), a fresh thread per forward (sums early). So a typed-in pair fails."""
    from dpteach.widgets.flow import join_order

    flow = GradientFlow("rewire", slots=3)  # the stepper's own order agrees with join_order's
    labels = [s.label for s in flow.steps]
    assert next(label for label in labels if "(replica" in label).endswith("(replica 2)")
    cell_order = join_order(threaded=False, slots=3)
    sums, replicas = cell_order.numbers()
    assert cell_order.first_replica == 2 and not cell_order.early
    assert max(sums) < min(min(r) for r in replicas)
    other = join_order(False, 3, forward_order=[1, 2, 0])
    assert other.first_replica == 0 and not other.early
    assert join_order(threaded=True, slots=3).early  # some sums run while replica nodes are still to run

    def rule(sums, replicas):
        return max(range(len(replicas)), key=lambda i: max(replicas[i])), max(sums) < min(
            min(r) for r in replicas
        )

    assert fresh_checks.summing_order(rule).ok
    typed = fresh_checks.summing_order(lambda s, r: (2, True))
    assert not typed.ok and typed.problem == "first replica" and "1, 2, 0" in typed.message
    assert (
        "Change how `first_replica` reads the numbers" in typed.message and "max(sums)" not in typed.message
    )
    last = fresh_checks.summing_order(lambda s, r: (max(range(len(r)), key=lambda i: max(r[i])), True))
    assert not last.ok and last.problem == "sums last" and "Hint 2 of 2" in last.message
    assert "a fresh thread per replica" in last.message
    third = fresh_checks.summing_order(lambda s, r: (max(range(len(r)), key=lambda i: max(r[i])), True))
    assert "max(sums) < min(min(r) for r in replicas)" in third.message
    assert fresh_checks.summing_order(lambda s, r: ("2", True)).problem == "not an answer"
    assert fresh_checks.summing_order(lambda s, r: (3, True)).problem == "not an answer"
    assert not fresh_checks.summing_order(lambda s, r: (..., ...)).ok
    assert not fresh_checks.summing_order(...).ok
    # the cell as shipped asks first and prints the numbers the rule reads
    cells = nbformat.read(ROOT / "notebooks" / "12_the_lab.ipynb", as_version=4).cells
    (cell,) = [c.source for c in cells if "summing-order" in c.metadata.get("tags", [])]
    scope = {"checks": fresh_checks}
    exec(cell, scope)
    assert not eval(cell.splitlines()[-1], scope).ok


def _moves_counted(strategy: str, model, devices) -> dict[str, int]:
    """The copies one DataParallel step of ``model`` records, move by move, with no autograd: the same
    ``comm`` calls the step's nodes make. Forward: the input's scatter, ``replicate`` (``detach=True`` makes
    the same copies: ``Broadcast.forward`` is ``comm.broadcast_coalesced``; ``"rewire"`` clones as
    ``"clone"`` does), the outputs' gather. Backward: ``Gather.backward``'s scatter of the output's gradient,
    then the sums: ``ReduceAddCoalesced.forward`` (``comm.reduce_add_coalesced``) under ``"broadcast"``, one
    ``ReduceAdd.backward`` per parameter under ``"rewire"``, none under ``"clone"``."""
    import types

    from dpteach import comm, replicate
    from dpteach.replicate.rewire import ReduceAdd

    params = list(model.parameters())
    with torch.no_grad(), comm.traffic() as meter:
        pieces = comm.scatter(torch.zeros(256, 2, device=devices[0]), devices)
        replicate(model, devices, strategy="clone" if strategy == "rewire" else strategy, detach=True)
        outs = [torch.zeros(len(p), 1, device=d) for p, d in zip(pieces, devices)]
        comm.gather(outs, 0, devices[0])
        comm.scatter(torch.zeros(256, 1, device=devices[0]), devices, [len(o) for o in outs])
        grads = [[torch.zeros(p.shape, device=d) for p in params] for d in devices]
        if strategy == "broadcast":
            comm.reduce_add_coalesced(grads, devices[0])
        if strategy == "rewire":
            for i, p in enumerate(params):
                ctx = types.SimpleNamespace(destination=p.device, size=p.size(), dtype=p.dtype)
                ReduceAdd.backward(ctx, *(g[i] for g in grads))
    return meter.by_op()


def test_on_distinct_gpus_the_counts_are_the_ones_section_3s_fold_gives(monkeypatch):
    """Section 3's fold: on n distinct GPUs dpteach's count is, in models, 3n-1 for "broadcast" (its packs
    included), 3n-2 for "rewire" and 2n-1 for "clone", plus the same scatter and gather for all three; 2n-2
    for "broadcast" without its packs. No GPU is needed: torch's comm functions are replaced by copies and
    the GPUs are FakeTensors, as in tests/core/test_fake_cuda.py. The move-by-move count is checked first
    against a real step's on slots that share this machine's device."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.nn.parallel import comm as torch_comm

    from dpteach import comm
    from dpteach.widgets.cost import WIDTHS, wide_model

    # the moves, counted on shared slots, are what CostLab's real step counts
    shared = slot_devices(3)
    if len(set(shared)) == 1:
        lab = CostLab(width=16, slots=3, timed=False)
        lab.measure()
        for c in lab.costs:
            assert _moves_counted(c.strategy, wide_model(16).to(shared[0]), shared) == c.bytes_by_op

    real = torch.cuda.device_count()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(
        torch_comm,
        "broadcast_coalesced",
        lambda tensors, devices, buffer_size=comm.BUFFER_SIZE: tuple(
            tuple(t.to(f"cuda:{d}", copy=True) for t in tensors) for d in devices
        ),
    )
    monkeypatch.setattr(
        torch_comm,
        "reduce_add_coalesced",
        lambda inputs, destination=None, buffer_size=comm.BUFFER_SIZE: [
            sum(t.to(f"cuda:{destination}") for t in ts) for ts in zip(*inputs)
        ],
    )
    for n in (2, 3, 4):
        if 0 < real < n:  # a FakeTensor on cuda:k asks a real driver for that device
            continue
        monkeypatch.setattr(torch.cuda, "device_count", lambda n=n: n)
        devices = [torch.device(f"cuda:{i}") for i in range(n)]
        assert comm.fast_path(devices)  # torch's path, whose copies dpteach counts by hand
        for width in WIDTHS:
            model = wide_model(width)
            with FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad():
                for layer in model.modules():
                    for key, p in list(layer._parameters.items()):
                        layer._parameters[key] = torch.nn.Parameter(p.detach().to(devices[0]))
                counted = {s: _moves_counted(s, model, devices) for s in ("broadcast", "rewire", "clone")}
            m = CostLab(width=width, slots=n, timed=False).model_bytes
            models = {
                s: {op: b / m for op, b in ops.items() if op not in ("scatter", "gather")}
                for s, ops in counted.items()
            }
            assert models["broadcast"] == {"pack": n + 1, "broadcast": n - 1, "reduce_add": n - 1}, (n, width)
            assert models["rewire"] == {"clone": n, "to": n - 1, "reduce_add": n - 1}, (n, width)
            assert models["clone"] == {"clone": n, "to": n - 1}, (n, width)
            assert len({(ops["scatter"], ops["gather"]) for ops in counted.values()}) == 1  # the same for all
    cells = nbformat.read(ROOT / "notebooks" / "12_the_lab.ipynb", as_version=4).cells
    cost = section_3(cells)
    counts = fold(cost, "Going deeper: distinct GPUs")
    # the fold's table splits each count: between devices, and local (packs, clones), as counted above
    rows = {
        '`"broadcast"`': "n−1 `broadcast` + n−1 `reduce_add` = 2n−2 | n+1 `pack`",
        '`"rewire"`': "n−1 `to` + n−1 `reduce_add` = 2n−2 | n `clone`",
        '`"clone"`': "n−1 `to` | n `clone`",
    }
    for name, row in rows.items():
        assert f"| {name} | {row} |" in counts, name
    assert "| strategy | between devices | local, on one GPU |" in counts
    assert '`"broadcast"` makes 3n−1, `"rewire"` 3n−2, `"clone"` 2n−1' in counts  # the two columns added
    assert "before PR #20995 dropped the clone" in counts and "counts the most" not in counts
    from dpteach.replicate import clone as clone_strategy

    assert "PR #20995 later dropped the clone there" in " ".join(clone_strategy.__doc__.split())
    assert "fit one 10 MiB bucket" in counts and comm.BUFFER_SIZE == 10 * 1024 * 1024
    import inspect

    assert "nccl.reduce(inputs, output=result, root=root_index)" in inspect.getsource(torch_comm.reduce_add)
    assert "These are logical counts" in counts and "not as n−1 copies out of or into slot 0" in counts
    assert "`broadcast` copies" not in counts and "copies to slot 0" not in counts
    assert 4 * (WIDTHS[-1] ** 2 + 5 * WIDTHS[-1] + 1) < comm.BUFFER_SIZE  # the widest model: one bucket


def test_section_2b_reads_the_clone_leaves_by_the_order_rule():
    """2b says each "clone" path stops at a replica's leaf, whose AccumulateGrad runs as soon as its
    gradient arrives, so replica 1's leaves come first; section 2's fold points to 2b for the list."""
    flow = GradientFlow("clone", slots=2)
    ends = [(i, step.label) for i, step in enumerate(flow.steps) if step.kind == "replica"]
    owners = [label.split(" · ")[0] for _, label in ends]
    assert owners == ["replica 1"] * 4 + ["replica 0"] * 4
    for i, label in ends:  # each leaf runs right after the node that handed it its gradient
        assert label in [h.label for h in flow.steps[i - 1].handoffs], (i, label)
    cells = nbformat.read(ROOT / "notebooks" / "12_the_lab.ipynb", as_version=4).cells
    (intro,) = [" ".join(c.source.split()) for c in cells if c.source.startswith("### 2b.")]
    assert (
        "A leaf's `AccumulateGrad` carries the highest number there is, so it runs as soon as its gradient "
        "arrives, and replica 1's leaves come first" in intro
    )
    assert "2b lists them" in tagged(cells, "stepper-seen").split("<details>")[1]


def test_the_stills_table_is_like_for_like_and_the_summary_says_rounding():
    """Section 1's still is a "clone" run at step 60: one device's run has trained 60 steps while "clone"
    never moves, so the table's one-device column is taken at DataParallel's own (start) weights, where
    the replicas' gradients are too: the replicas' gradients add up to it. The Summary says DataParallel
    matches one device up to float rounding (1a's table: a weight gap from step 1)."""
    fresh = TrainingLab("clone", slots=2, lr=0.2, steps=60)
    start = [p.detach().clone() for p in fresh.model.parameters()]
    before = [row.reference for row in fresh.grad_rows()]
    fresh.run()
    assert fresh.step_count == 60
    assert all(torch.equal(p, q) for p, q in zip(fresh.model.parameters(), start))  # never moved
    for replica in fresh.replicas:  # the replicas of the last step: copies of the start weights
        assert all(torch.equal(p, q) for p, q in zip(replica.parameters(), start))
    assert not all(torch.equal(p, q) for p, q in zip(fresh.reference.parameters(), start))  # trained
    assert [row.reference for row in fresh.grad_rows()] == before  # the column stays at the start weights
    summed = sum(r[0].weight.grad for r in fresh.replicas)
    torch.testing.assert_close(summed, fresh.twin[0].weight.grad)  # the same weights: the same gradient
    cells = nbformat.read(ROOT / "notebooks" / "12_the_lab.ipynb", as_version=4).cells
    intro = " ".join(tagged(cells, "explorer-intro").split("<details>")[0].split())
    assert "not like for like" not in intro
    assert "same weights" in grad_table(fresh)  # the column says so
    summary = " ".join(tagged(cells, "summary").split())
    assert "matches one device step for step, up to float rounding" in summary


def test_section_1a_says_the_gradients_agree_until_one_overflows_though_a_loss_is_inf_already():
    """1a's reading says the gradients agree at the same weights until a gradient overflows, even at the
    step whose DataParallel loss is first inf: that step's row in the table says agree."""
    from dpteach.widgets.training import DriftTable

    lab, table = TrainingLab("rewire", slots=2, lr=10**-0.2, steps=34), DriftTable()
    while not lab.done:
        lab.step()
        table.add(lab.step_count, lab.losses[-1], lab.reference_losses[-1], lab.weight_gap(), lab.grad_rows())
    (row,) = [r for r in table.rows if "DataParallel inf" in r]
    step = row.split()[0]
    assert row.split()[1] == "inf" and " agree " in row
    cells = nbformat.read(ROOT / "notebooks" / "12_the_lab.ipynb", as_version=4).cells
    why = " ".join(tagged(cells, "large-lr-read").split("<details>")[0].split())
    assert int(step) > 0  # a step number the prose leaves to the table, which prints it
    assert "until a gradient overflows, even at the step whose loss is first `inf`" in why
    # why: the loss squares the error; the gradient of the loss with respect to the output, 2·error/N, and the
    # weight gradients made from it (bounded tanh activations times it) are linear in the error
    assert (
        "the loss squares the error and overflows first, while the gradient at the output, 2·error/N, and the "
        "weight gradients built from it grow linearly in the error" in why
    )
    out = torch.tensor([3e19, 0.0], requires_grad=True)
    loss = torch.nn.functional.mse_loss(out, torch.zeros(2))
    loss.backward()
    assert math.isinf(loss.item()) and torch.isfinite(out.grad).all() and out.grad[0] == 3e19


def test_exercise_1_asks_for_the_predictions_before_the_step_runs():
    """Exercise 1's stub sets both answers before the cell takes its step, so they are predictions; the
    second hint says where torch's DataParallel.forward branches on one device, and that branch is there."""
    import inspect

    from torch.nn.parallel.data_parallel import DataParallel

    cells = nbformat.read(ROOT / "notebooks" / "12_the_lab.ipynb", as_version=4).cells
    (stub,) = [c.source for c in cells if "one-slot" in c.metadata.get("tags", [])]
    assert stub.index("learned = ...") < stub.index(".backward()") and stub.index(
        "is_model = ..."
    ) < stub.index("replicate(model")
    assert "if len(self.device_ids) == 1:" in inspect.getsource(DataParallel.forward)
    (answer,) = [c.source for c in cells if c.source.startswith("<details><summary>Answer 1")]
    assert "`if len(self.device_ids) == 1`" in answer
    # the question gives neither answer away; what the widgets show waits in the answer, before the branch
    (ask,) = [" ".join(c.source.split()) for c in cells if c.source.startswith("## Exercises")]
    assert "learns" not in ask and "dead ends" not in ask and "Predict both answers" in ask
    answer = " ".join(answer.split())
    assert answer.index("the model learns") < answer.index("ends in dead ends") < answer.index("`if len(")


def test_exercise_5_check_measures_both_runs_and_judges_by_the_evidence(fresh_checks):
    """Exercise 5: growth(gaps), the gap's mean factor per step, is checked on a made-up list and on both
    runs, so a typed-in number fails; then the check prints the evidence (each run's gap after step 1 and
    its factor per step) and judges made_by_lr by it: the gap is there after step 1 at lr 0.2 too, and the
    large lr multiplies it far faster. Each wrong answer says what to change and climbs its ladder."""
    from dpteach.course.checks import _gaps, _mean_factor

    wild, calm = _gaps(10**-0.2), _gaps(0.2)
    assert wild[0] > 0 and calm[0] > 0  # rounding at step 1, at either rate
    assert _mean_factor(wild) > 5 > 1.5 > _mean_factor(calm)  # Answer 5: about 7 against about 1.2
    cells = nbformat.read(ROOT / "notebooks" / "12_the_lab.ipynb", as_version=4).cells
    (answer,) = [
        " ".join(c.source.split()) for c in cells if c.source.startswith("<details><summary>Answer 5")
    ]
    assert f"about {_mean_factor(wild):.0f} at 0.631 against about {_mean_factor(calm):.1f} at 0.2" in answer
    (ask,) = [" ".join(c.source.split()) for c in cells if c.source.startswith("5. ")]
    assert "False" not in ask and "True" not in ask  # the question gives no answer away

    def right(gaps):
        return (gaps[-1] / gaps[0]) ** (1 / (len(gaps) - 1))

    asks = fresh_checks.calm_drift(right)  # made_by_lr left as ...: the evidence, then the question
    assert (
        not asks.ok
        and "growth is right" in asks.message
        and "x7." in asks.message
        and "Hint" not in asks.message
    )
    assert fresh_checks.calm_drift(right, False).ok
    wrong = fresh_checks.calm_drift(right, True)
    assert not wrong.ok and wrong.problem == "made by lr" and "Change `made_by_lr`" in wrong.message
    assert "Hint 1 of 2" in wrong.message and "made_by_lr = False" not in wrong.message
    assert "from step 1 to step 10 (9 steps)" in asks.message  # ten gaps, nine factors between them
    typed = fresh_checks.calm_drift(lambda gaps: 7.38)
    assert not typed.ok and typed.problem == "growth" and "made-up" in typed.message
    assert "whatever the list: compute it from gaps" in typed.message
    # the ladder: the idea on a worked list first, no formula; the formula only on later tries
    hint_1 = typed.message.split("Hint 1 of 3: ")[1]
    assert "A mean factor multiplies" in hint_1 and "[1e-8, 2e-8, 4e-8, 8e-8]" in hint_1 and "is 2" in hint_1
    assert "gaps[-1]" not in hint_1 and "gaps[0]" not in hint_1 and "root" not in hint_1
    hint_2 = fresh_checks.calm_drift(lambda gaps: 7.38).message.split("Hint 2 of 3: ")[1]
    assert "k - 1 steps" in hint_2 and "root" not in hint_2
    assert "(len(gaps) - 1)-th root" in fresh_checks.calm_drift(lambda gaps: 7.38).message
    assert "The answer" in fresh_checks.calm_drift(lambda gaps: 7.38).message
    # a formula that reads the list but is wrong (the mean of the step ratios) hears what to change
    mean_ratio = fresh_checks.calm_drift(lambda g: sum(b / a for a, b in zip(g, g[1:])) / (len(g) - 1))
    assert mean_ratio.problem == "growth" and "takes gaps[0] to gaps[-1]" in mean_ratio.message
    total = fresh_checks.calm_drift(lambda gaps: gaps[-1] / gaps[0])
    assert total.problem == "growth" and "take the root for one step" in total.message
    for bad in [lambda g: "2", lambda g: True]:
        assert fresh_checks.calm_drift(bad).problem == "not an answer"
    assert not fresh_checks.calm_drift(right, "False").ok
    assert not fresh_checks.calm_drift(lambda g: ...).ok and not fresh_checks.calm_drift(...).ok


def test_the_drift_tables_last_column_is_defined_before_the_table():
    """Before 1a's table, the main path says in one sentence what its last column compares: a twin at
    DataParallel's weights, so like for like. The twin really is at DataParallel's weights at every step."""
    cells = nbformat.read(ROOT / "notebooks" / "12_the_lab.ipynb", as_version=4).cells
    table = next(i for i, c in enumerate(cells) if "large-lr" in c.metadata.get("tags", []))
    before = cells[table - 1]
    assert "large-lr-why" in before.metadata.get("tags", [])
    said = " ".join(before.source.split("</details>")[-1].split())  # after the fold: the main path
    assert "*gradients at the same weights*" in said and "twin" in said
    assert "set to DataParallel's weights at every step" in said and "like for like" in said
    from dpteach.widgets.training import DriftTable

    assert "gradients at the same weights" in DriftTable.HEAD
    lab = TrainingLab("rewire", slots=2, lr=10**-0.2, steps=3)
    while not lab.done:
        lab.step()
        twin = dict(lab.twin.named_parameters())
        assert all(torch.equal(twin[n], p) for n, p in lab.model.named_parameters())


def test_the_order_rules_premise_is_shown_on_the_stepper_slots():
    """Section 2's rule rests on the replicas' forwards running one after another, replica 0 first; the cell
    before the rule shows the thread each forward runs on, and the rule says whose parallel_apply does that."""
    import contextlib
    import io

    cells = nbformat.read(ROOT / "notebooks" / "12_the_lab.ipynb", as_version=4).cells
    order = [c.metadata.get("tags", []) for c in cells]
    shown = order.index(["forward-threads"])
    assert order.index(["order-rule"]) == shown + 1
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(cells[shown].source, {})
    lines = printed.getvalue().splitlines()
    assert [line.split(" thread ")[0] for line in lines] == [
        "replica 0's forward:",
        "replica 1's forward:",
    ]
    if len(set(slot_devices(2))) == 1:  # one device: the caller's thread, in turn
        assert all(line.endswith("the caller's: True") for line in lines), lines
    rule = " ".join(tagged(cells, "order-rule").split())
    assert (
        "dpteach's `parallel_apply` runs the replicas' forwards one after another on the thread that called it, replica 0 first"
        in rule
    )
    assert "torch's own starts a thread per replica, and needs an accelerator" in rule
    import inspect

    from torch.nn.parallel import parallel_apply as torch_apply

    source = inspect.getsource(torch_apply)
    assert "threading.Thread(" in source and "if len(modules) > 1:" in source
    assert 'raise AssertionError("No available accelerator found.")' in source


def test_the_folds_that_answer_a_prediction_sit_under_its_widget():
    """Widget first, then the prompt, then the folded answer. The explorer's and the stepper's stills show
    step 0, so nothing above the prompt answers it; the cost explorer's prompt comes before it and its
    fold is the cell right under it."""
    cells = nbformat.read(ROOT / "notebooks" / "12_the_lab.ipynb", as_version=4).cells
    for call, prompt_tag, tag in [
        ("widgets.explorer(", "explorer-predict", "explorer-seen"),
        ("widgets.gradient_stepper(", "stepper-predict", "stepper-seen"),
    ]:
        (i,) = [i for i, c in enumerate(cells) if c.cell_type == "code" and call in c.source]
        prompt = cells[i + 1]
        assert prompt_tag in prompt.metadata.get("tags", []), call
        assert prompt.source.startswith("Predict") and "<details>" not in prompt.source, call
        assert "the still above shows step 0" in " ".join(prompt.source.split()), call
        assert tag in cells[i + 2].metadata.get("tags", []), call
        assert (
            cells[i + 2].source.startswith("<details>")
            and "<summary>What you should see" in cells[i + 2].source
        )
        assert "Predict" not in cells[i - 1].source  # the intro above the widget asks nothing yet
    (i,) = [i for i, c in enumerate(cells) if c.cell_type == "code" and "widgets.cost_explorer(" in c.source]
    assert "Predict" in cells[i - 1].source and "<details>" not in cells[i - 1].source
    assert "cost-seen" in cells[i + 1].metadata.get("tags", [])
    assert (
        cells[i + 1].source.startswith("<details>") and "<summary>What you should see" in cells[i + 1].source
    )


def test_the_order_printout_answers_the_guess_and_the_rule_comes_after():
    """Section 2a asks for a guess, prints the order right under it, and only then shows why: the forwards'
    threads, then the rule."""
    cells = nbformat.read(ROOT / "notebooks" / "12_the_lab.ipynb", as_version=4).cells
    rule = next(i for i, c in enumerate(cells) if "order-rule" in c.metadata.get("tags", []))
    threads = next(i for i, c in enumerate(cells) if "forward-threads" in c.metadata.get("tags", []))
    printout = next(i for i, c in enumerate(cells) if c.source.startswith("orders = {strategy: GradientFlow"))
    ask = next(i for i, c in enumerate(cells) if c.source.startswith("### 2a."))
    assert ask + 1 == printout < threads < rule
    assert "Guess before you run it" in cells[ask].source and "The cell below prints" in cells[ask].source
    assert "widgets.training" not in cells[threads].source  # the premise cell uses public names only


def test_exercise_2_shows_the_move_to_the_originals_device():
    """Exercise 2's sum must move each replica's gradient to the original's device (on GPUs each replica has
    its own): the question and the stub say `.to(device)`, and Answer 2 writes it out."""
    cells = nbformat.read(ROOT / "notebooks" / "12_the_lab.ipynb", as_version=4).cells
    (stub,) = [c.source for c in cells if "clone-grads-add-up" in c.metadata.get("tags", [])]
    assert "device = rewire.model[0].weight.device" in stub and ".to(device)" in stub
    (ask,) = [" ".join(c.source.split()) for c in cells if c.source.startswith("2. ")]
    assert "`.to(device)`" in ask
    (answer,) = [c.source for c in cells if c.source.startswith("<details><summary>Answer 2")]
    assert "`summed = sum(r[0].weight.grad.to(device) for r in clone.replicas)`" in answer


def test_the_cost_tables_ratio_rounds_as_the_bars_do():
    """The cost explorer's bars and its table give each strategy's bytes as a multiple of the model, to
    one decimal both (the bars' notes, pictures.cost_charts; the table, tables.cost_table)."""
    import base64

    from dpteach.widgets.pictures import cost_charts
    from dpteach.widgets.tables import cost_table

    lab = CostLab(width=64, slots=2, timed=False)
    lab.measure()
    svgs = re.findall(r"base64,([^\"]+)", cost_charts(lab.costs, lab.model_bytes, lab.slots, None))
    bars = " ".join(base64.b64decode(svg).decode() for svg in svgs)
    ratio = re.compile(r"[0-9.]+×")
    assert sorted(ratio.findall(bars)) == sorted(ratio.findall(cost_table(lab, modelled=False)))
    assert sorted(ratio.findall(bars)) == sorted(f"{c.bytes / lab.model_bytes:.1f}×" for c in lab.costs)
