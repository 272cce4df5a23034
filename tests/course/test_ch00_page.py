"""Chapter 00: what the page says about replica 0, the clone bug and scatter's pieces holds.

The code cells are found by their tags and run here on their own, in a namespace that holds what the
chapter's earlier cells made, so each check can also be run on a case where it must fail.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import math
import re
import sys
import types
from pathlib import Path

import nbformat
import pytest
import torch
import torch.nn.functional as F

import dpteach
from dpteach.course import env, story

CHAPTER = Path(__file__).resolve().parents[2] / "notebooks" / "00_start_here.ipynb"
DEVICES = [torch.device("cpu")] * 2


class _Item:
    def __init__(self, ok: bool, status: str):
        self.ok, self.status = ok, status


def _cells():
    return nbformat.read(CHAPTER, as_version=4).cells


def _tagged(tag: str) -> str:
    (cell,) = [c for c in _cells() if tag in c.metadata.get("tags", [])]
    return cell.source


def run_cell(source: str, **names) -> str:
    """Run ``source`` in a namespace holding the chapter's earlier names and ``names``; what it prints."""
    x, y = story.make_data()
    scope = {"torch": torch, "F": F, "dpteach": dpteach, "story": story, "devices": DEVICES, "x": x, "y": y}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(source, {**scope, **names})
    return out.getvalue()


def _markdown() -> str:
    return "\n".join(c.source for c in _cells() if c.cell_type == "markdown")


def test_replica_0_shares_the_models_storage_but_is_no_leaf():
    model = story.make_model()
    replica = dpteach.replicate(model, DEVICES)[0]  # the default strategy
    weight = replica[0].weight
    assert weight.data_ptr() == model[0].weight.data_ptr()  # "share the model's storage"
    assert not weight.is_leaf and weight.grad_fn is not None  # an autograd output, with its edge back
    assert f"`{type(weight.grad_fn).__name__}`" in _markdown()  # the page names the node it really has


def test_the_figure_answers_none_of_the_chapters_predictions():
    # the page asks which replica is a leaf or shares the model's storage, and where clone's gradients go
    picture = story.four_moves_picture()
    text = (picture if isinstance(picture, str) else picture.source).lower()
    for answer in ("storage", "clone", "copy", "leaf", "none"):
        assert answer not in text, answer
    (figure,) = [c for c in _cells() if "four-moves" in c.metadata.get("tags", [])]
    alt = figure.metadata["mystnb"]["image"]["alt"]
    assert not any(answer in alt.lower() for answer in ("storage", "clone", "copy", "had none"))


def test_clone_copies_slot_0_too_so_no_replica_has_an_edge():
    model = story.make_model()
    replicas = dpteach.replicate(model, DEVICES, strategy="clone")
    for replica in replicas:  # "C++ cloned every slot, slot 0 included"
        assert replica[0].weight.data_ptr() != model[0].weight.data_ptr()
        assert replica[0].weight.grad_fn is None  # a fresh leaf: nothing leads back to the model


def test_the_clone_cell_shows_every_grad_of_the_model_empty():
    printed = run_cell(_tagged("clone-bug"))
    for name, _ in story.make_model().named_parameters():
        assert f"'{name}': None" in printed  # all four: 0.weight, 0.bias, 2.weight, 2.bias


def test_the_clone_cell_shows_gradients_under_the_default():
    fixed = _tagged("clone-bug").replace('strategy="clone"', 'strategy="broadcast"')
    assert fixed != _tagged("clone-bug")
    assert "None" not in run_cell(fixed)  # the cell would tell the two apart


def test_the_page_names_every_strategy_and_the_real_default():
    text = _markdown()
    assert all(f'`"{name}"`' in text for name in dpteach.STRATEGIES)  # clone, rewire, broadcast
    default = inspect.signature(dpteach.DataParallel).parameters["strategy"].default
    assert f'`"{default}"` (the default)' in text


def _table(slots: int, rows: int) -> str:
    """One line of the scatter table, worked out from torch.chunk's rule: pieces of ceil(rows / slots)."""
    size = math.ceil(rows / slots)
    sizes = [str(min(size, rows - start)) for start in range(0, rows, size)]
    per_slot = sizes + ["-"] * (slots - len(sizes))
    return f"{rows} rows over {slots} slot{'s' * (slots > 1)}: " + " ".join(f"{n:>2}" for n in per_slot)


def _examples(printed: list[str]) -> list[tuple[int, int, str]]:
    """(rows, slots, line) for each line of the table the cell printed."""
    found = [re.match(r"(\d+) rows over (\d+) slots?:", line) for line in printed]
    return [(int(m.group(1)), int(m.group(2)), line) for m, line in zip(found, printed) if m]


def _exercise_1_batches() -> set[int]:
    """The row counts exercise 1's check cells ask about, read from their calls."""
    calls = _tagged("ex1-idle") + _tagged("ex1-pieces")
    return {int(n) for n in re.findall(r"rows=(\d+)", calls)}


def test_the_scatter_table_prints_worked_batches_that_answer_no_exercise():
    printed = run_cell(_tagged("scatter-table")).splitlines()
    examples = _examples(printed)
    assert len(examples) >= 2  # printed everywhere: on GitHub and in the book too
    asked = _exercise_1_batches()
    assert asked, "exercise 1's check cells name no batch"
    for rows, slots, line in examples:
        assert line == _table(slots, rows)  # each line is torch.chunk's cut
        # before the learner predicts: no idle slot, and not the batch of an exercise
        assert "-" not in line and rows not in asked


@pytest.mark.parametrize("widgets", [False, True], ids=["no slider", "slider"])
def test_the_sliders_run_with_or_without_widgets(monkeypatch, widgets):
    calls = []
    fake = types.ModuleType("ipywidgets")  # records the sliders instead of drawing them
    fake.IntSlider = lambda **kw: kw
    fake.interact = lambda f, **kw: calls.append((f, kw))
    monkeypatch.setitem(sys.modules, "ipywidgets", fake)
    report = {"ipywidgets": _Item(widgets, "OK"), "notebook": _Item(True, "OK" if widgets else "info")}
    scope = {"dpteach": dpteach, "torch": torch}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(_tagged("scatter-table"), scope)  # defines pieces, as the cell above the exercise does
    printed = run_cell(_tagged("scatter-sliders"), report=report, pieces=scope["pieces"])
    assert len(calls) == widgets  # the sliders only in a live kernel with widgets
    if widgets:  # the learner sets both, on the table's own function
        f, sliders = calls[0]
        assert f is scope["pieces"] and {"slots", "rows"} <= set(sliders)
    else:
        assert "pieces(slots, rows)" in printed  # says what to call instead
    # either way a still, what the rows slider at 10 shows on 1 to 8 slots, for a page read without a kernel
    assert [line for line in printed.splitlines() if " rows over " in line] == [
        _table(s, 10) for s in range(1, 9)
    ]


def test_shared_storage_is_not_an_edge():
    printed = run_cell(_tagged("storage-not-edge"))
    assert "same storage: True" in printed  # detach() keeps the weight's storage
    assert "alias.grad filled: True; weight.grad: None" in printed  # backward stops at the alias
    at = {tag: i for i, c in enumerate(_cells()) for tag in c.metadata.get("tags", [])}
    assert at["clone-bug"] < at["storage-not-edge"] < at["ex1-idle"]  # it follows the clone cell's claim
    # the same cell with the weight itself in the loss would fill weight.grad: the demo tells them apart
    linked = _tagged("storage-not-edge").replace("alias.sum()", "(alias.sum() + weight.sum())")
    assert "weight.grad: None" not in run_cell(linked)


def test_the_sliders_come_after_exercise_1s_checks_and_answer():
    # sliders up to 32 rows and 8 slots would show exercise 1's answers before the learner predicts
    at = {tag: i for i, c in enumerate(_cells()) for tag in c.metadata.get("tags", [])}
    assert at["scatter-table"] < at["ex1-idle"] < at["ex1-pieces"] < at["ex1-answer"] < at["scatter-sliders"]
    assert "ipywidgets" not in "".join(_tagged(t) for t in ("scatter-table", "ex1-idle", "ex1-pieces"))


def test_the_idle_slot_check_asks_exercise_1s_question():
    source = _tagged("ex1-idle")
    assert "idle = ..." in source and re.search(r"checks\.idle_slots\(idle, rows=\d+\)", source)


def test_exercise_1s_batch_tells_torch_chunk_from_the_divisor_rule():
    (rows,) = map(int, re.findall(r"idle_slots\(idle, rows=(\d+)\)", _tagged("ex1-idle")))
    idle = {s for s in range(1, 9) if len(torch.arange(rows).chunk(s)) < s}  # scatter cuts with chunk
    non_divisors = {s for s in range(1, 9) if rows % s}
    # "a slot count that does not divide the rows leaves one idle" must give a wrong answer here
    assert idle and idle != non_divisors, (rows, idle)
    from dpteach.course import checks

    checks.reset()
    assert checks.idle_slots(idle, rows=rows).ok and not checks.idle_slots(non_divisors, rows=rows).ok
    checks.reset()


def test_the_legend_explains_every_status_the_check_can_print():
    text = _markdown()
    for status in (env.OK, env.INFO, env.WARN, env.MISSING):
        assert f"*{status}* " in text, status  # "*warning* means ...", and so on


# The rows the page's text after the four moves states: replica 0's weight under each strategy.
REPLICA_0 = {
    # grad_fn, is_leaf, then whether replica 0 and replica 1 share the model's storage
    "broadcast": ("BroadcastBackward", "False", "True", "False"),  # no leaf; slot 0 gets the model's own
    "clone": ("None", "True", "False", "False"),  # a leaf of its own: no edge back
    "rewire": ("ReduceAddBackward", "False", "False", "False"),  # PR #20910's edge onto the clone
}


def test_broadcast_hands_slot_0_the_models_own_weight_as_a_view():
    model = story.make_model()
    replicas = dpteach.replicate(model, DEVICES, strategy="broadcast")
    weight, own = replicas[0][0].weight, model[0].weight
    assert weight is not own and weight._base is own  # a view of the model's weight itself, not a copy
    assert type(weight.grad_fn).__name__ == "BroadcastBackward"  # with the edge attached
    other = replicas[1][0].weight
    assert other._base is None and other.data_ptr() != own.data_ptr()  # slot 1: a copy of its own


def test_the_replica_0_table_shows_each_strategys_edge_leaf_and_storage():
    rows = [line.split() for line in run_cell(_tagged("replica-0-table")).splitlines()[1:]]
    assert {row[0]: tuple(row[1:]) for row in rows} == REPLICA_0
    text = _markdown()
    assert "`BroadcastBackward`" in text and "`ReduceAddBackward`" in text  # the text reads the table


def test_the_replica_0_table_tells_the_strategies_apart():
    swapped = _tagged("replica-0-table").replace('"rewire")', '"clone")')
    assert swapped != _tagged("replica-0-table")
    rows = [line.split() for line in run_cell(swapped).splitlines()[1:]]
    assert rows[-1][1:] == list(REPLICA_0["clone"]) != list(REPLICA_0["rewire"])


def test_the_clone_cell_shows_that_the_optimizer_step_moves_no_weight():
    assert "0.weight moved: False" in run_cell(_tagged("clone-bug"))  # every .grad None: step skips them
    fixed = _tagged("clone-bug").replace('strategy="clone"', 'strategy="broadcast"')
    assert "0.weight moved: True" in run_cell(fixed)  # the line would tell the two apart


def test_the_story_reads_straight_and_the_practical_steps_close_it():
    cells = _cells()
    at = {tag: i for i, c in enumerate(cells) for tag in c.metadata.get("tags", [])}
    heads = {c.source.split("\n", 1)[0]: i for i, c in enumerate(cells) if c.cell_type == "markdown"}
    env_check = next(i for i, c in enumerate(cells) if c.cell_type == "code" and "env.check()" in c.source)
    story_end = at["clone-bug"]
    assert at["four-moves"] < heads["## The four moves"] < story_end < env_check  # the check after the story
    assert env_check < heads["## The map: where next"] < heads["## Summary"]  # then where to go next


def test_the_exercises_follow_the_chapters_order():
    # scatter (the first move), the lanes of the picture, each move's backward, the one-step check
    cells = _cells()
    at = {tag: i for i, c in enumerate(cells) for tag in c.metadata.get("tags", [])}
    assert at["ex1-idle"] < at["ex2-check"] < at["ex3-check"] < at["ex4-check"]
    assert "checks.idle_slots" in _tagged("ex1-idle") and "checks.moves_between_devices" in _tagged(
        "ex2-check"
    )
    assert "checks.backward_moves" in _tagged("ex3-check") and "checks.mean_of_means" in _tagged("ex4-check")
