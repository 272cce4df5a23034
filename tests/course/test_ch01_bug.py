"""Chapter 01: the cells that show where the gradient went do what their prose says.

The cells are found by their tags and run here on their own, in a namespace that holds what the
chapter's earlier cells made, so each check can also be run on a case where it must fail.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import re
from pathlib import Path

import nbformat
import pytest
import torch
from torch import nn

import dpteach
from dpteach.course import story

ROOT = Path(__file__).resolve().parents[2]
CHAPTER = ROOT / "notebooks" / "01_the_bug.ipynb"
DEVICES = [torch.device("cpu")] * 2
TAGS = [
    "train-by-hand",
    "torch-dp",
    "sketch",
    "replica-grads",
    "sgd-skips",
    "culprit",
    "edge-terms",
    "edge-contrast",
    "clone-loop",
    "grad-check",
]
DETAILS = re.compile(r"<details\b.*?</details>", re.S)


def _cell(tag: str):
    (cell,) = [c for c in nbformat.read(CHAPTER, as_version=4).cells if tag in c.metadata.get("tags", [])]
    return cell


def _index(tag: str) -> int:
    """Where the tagged cell sits in the chapter."""
    cells = nbformat.read(CHAPTER, as_version=4).cells
    return cells.index(_cell(tag))


def run_cell(tag: str, **names) -> str:
    """Run the tagged code cell with ``names`` in its namespace; what it prints."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(_cell(tag).source, {"torch": torch, "nn": nn, "dpteach": dpteach, **names})
    return out.getvalue()


def after_clone_backward():
    """The original model and slot 1's replicas after one clone-based forward and backward."""
    x, y = story.make_data()
    model = story.make_model()
    replicas = dpteach.replicate(model, DEVICES, strategy="clone")
    out = torch.cat([r(piece) for r, piece in zip(replicas, x.chunk(len(DEVICES)))])
    nn.functional.mse_loss(out, y).backward()
    return model, replicas


@pytest.mark.parametrize("tag", TAGS)
def test_each_cell_the_tests_read_carries_its_tag_once(tag):
    assert _cell(tag).source.strip()  # _cell unpacks exactly one cell


def test_the_deduction_names_the_three_moves_that_stay_the_same():
    text = _cell("culprit").source
    assert all(move in text for move in ("Scatter", "parallel_apply", "gather", "only replicate differs"))


def test_the_culprit_question_stands_apart_from_its_answer():
    text = _cell("culprit").source
    (answer,) = DETAILS.findall(text)
    asked = DETAILS.sub("", text)
    assert "Which of the four moves" in asked and "?" in asked
    assert "<summary>Answer</summary>" in answer and "only replicate differs" in answer
    assert "only replicate differs" not in asked  # the deduction waits behind the Answer block


def test_the_optimizers_skip_every_parameter_in_silence_after_the_clone_backward():
    model, _ = after_clone_backward()
    printed = run_cell("sgd-skips", model=model)
    assert "0 warnings, every weight unchanged: True" in printed


def test_the_optimizer_cell_fails_when_the_model_has_gradients():
    model = story.make_model()
    x, y = story.make_data()
    nn.functional.mse_loss(model(x), y).backward()  # one device: every .grad is filled
    with pytest.raises(AssertionError):
        run_cell("sgd-skips", model=model)  # SGD moves the weights, so "unchanged" is False


def test_the_edge_contrast_shows_the_fixes_nodes_beside_the_missing_edge():
    model, replicas = after_clone_backward()
    rows = run_cell("edge-contrast", model=model, replicas=replicas, devices=DEVICES).splitlines()
    found = {row.split()[0]: row.split()[1:] for row in rows[1:]}
    assert found["clone"][0] == "no:" and found["clone"][-1] == "None"  # a leaf: no grad_fn, no edge
    for strategy in ("broadcast", "rewire"):  # an edge, out of the node the strategy makes
        weight = dpteach.replicate(model, DEVICES, strategy=strategy)[1][0].weight
        assert found[strategy][0] == "yes," and found[strategy][-1] == type(weight.grad_fn).__name__
    assert found["broadcast"][-1] == "BroadcastBackward" and found["rewire"][-1] == "ReduceAddBackward"


def test_the_edge_contrast_fails_on_replicas_that_keep_the_edge():
    model = story.make_model()
    replicas = dpteach.replicate(model, DEVICES, strategy="rewire")
    with pytest.raises(AssertionError):
        run_cell("edge-contrast", model=model, replicas=replicas, devices=DEVICES)


def test_the_loop_listed_is_clone_py_s_parameter_loop_as_it_stands():
    """The page lists clone_module's lines as text: each must still be a line of the source, in order."""
    import inspect
    import re

    from dpteach.replicate import clone

    text = _cell("clone-loop").source
    (listing,) = re.findall(r"```python\n(.*?)```", text, re.S)
    listed = [line.strip() for line in listing.splitlines() if line.strip()]
    source = [line.strip() for line in inspect.getsource(clone.clone_module).splitlines()]
    at = [source.index(line) for line in listed]  # ValueError: a listed line is no longer in clone.py
    assert at == sorted(at)  # in the source's order: the listing leaves lines out, it never reorders them
    assert any("# BROKEN (#19540)" in line for line in listed) and listed[-1] == "setattr(replica, key, copy)"
    assert "_buffers" not in listing and "_is_replica" not in listing  # only what the page explains


def test_torch_s_own_data_parallel_sits_in_a_going_deeper_block_before_the_summary():
    cells = nbformat.read(CHAPTER, as_version=4).cells
    at = {c.get("id"): i for i, c in enumerate(cells)}
    summary = next(i for i, c in enumerate(cells) if c.source.startswith("## Summary"))
    note = _cell("torch-dp").source
    assert note.startswith("<details><summary>Going deeper:") and note.rstrip().endswith("</details>")
    assert _index("clone-loop") < at["torch-dp-note"] < summary
    assert "torch-dp" not in [t for c in cells if c.cell_type == "code" for t in c.metadata.get("tags", [])]


def test_torch_s_own_data_parallel_does_what_the_block_says():
    import importlib

    from torch._utils import _get_available_device_type

    # the modules: torch.nn.parallel's names replicate and data_parallel are the functions
    replicate = importlib.import_module("torch.nn.parallel.replicate")
    data_parallel = importlib.import_module("torch.nn.parallel.data_parallel")

    note = _cell("torch-dp").source
    # replicate.py copies with Broadcast.apply unless detach, and DataParallel detaches only without grad
    assert "Broadcast.apply" in note and "Broadcast.apply(" in inspect.getsource(
        replicate._broadcast_coalesced_reshape
    )
    assert "not torch.is_grad_enabled()" in inspect.getsource(data_parallel.DataParallel.replicate)
    assert "returns `self.module(*inputs, **kwargs)`" in note
    assert "return self.module(*inputs, **kwargs)" in inspect.getsource(data_parallel.DataParallel.forward)
    if _get_available_device_type() is None:  # no accelerator: no device_ids, so the module runs itself
        model = story.make_model()
        wrapped = nn.DataParallel(model)
        x, _ = story.make_data()
        assert wrapped.device_ids == [] and "`device_ids` is `[]`" in note
        assert torch.equal(wrapped(x), model(x))


def test_the_terms_cell_shows_each_term_on_a_leaf():
    printed = run_cell("edge-terms", model=story.make_model())
    assert "h.grad_fn: <MulBackward0" in printed and "w.grad_fn: None   w.is_leaf: True" in printed
    assert "((<AccumulateGrad object at" in printed and ", 0), (None, 0))" in printed
    assert "that node is AccumulateGrad; it keeps w in .variable: True" in printed
    text = _cell("edge-terms").source
    cells = nbformat.read(CHAPTER, as_version=4).cells
    at = {c.get("id"): i for i, c in enumerate(cells)}
    for term in ("**`grad_fn`**", "**Leaf**", "**Edge**", "**`AccumulateGrad`**"):  # each defined above it
        assert term in cells[at["edge-terms"] - 1].source
    assert "next_functions" in text and ".variable" in text


def test_the_terms_cell_fails_on_a_weight_that_is_no_leaf():
    model = story.make_model()
    (replica, _) = dpteach.replicate(model, DEVICES, strategy="rewire")  # its weight hangs off ReduceAdd
    with pytest.raises(AssertionError):
        run_cell("edge-terms", model=replica)


def test_the_strategies_are_explained_before_the_prediction_is_asked():
    cells = nbformat.read(CHAPTER, as_version=4).cells
    at = {c.get("id"): i for i, c in enumerate(cells)}
    contrast = _index("edge-contrast")
    text = cells[contrast - 1].source
    assert all(f'`"{s}"`' in text for s in ("clone", "broadcast", "rewire"))
    assert text.index('`"rewire"`') < text.index("**Predict:**")
    assert not any("**Predict:**" in c.source for c in cells[at["6d4aad7f"] : contrast - 1])


def test_one_step_report_reads_in_one_line_without_tensors():
    clone, rewire = (repr(story.one_step(s, DEVICES)) for s in ("clone", "rewire"))
    assert "tensor(" not in clone + rewire and "\n" not in clone + rewire
    assert "matches=False" in clone and "grad_is_none=['0.weight', '0.bias', '2.weight', '2.bias']" in clone
    assert "replicas=2" in clone and "largest_difference=n/a" in clone  # no gradient to compare
    assert "matches=True" in rewire and "grad_is_none=[]" in rewire
    assert float(rewire.split("largest_difference=")[1].split(",")[0]) < 1e-5  # float rounding only


def test_one_step_report_shows_the_largest_difference_of_a_wrong_gradient():
    ref = {"w": torch.zeros(3), "b": torch.zeros(1)}
    report = story.GradientReport("custom", {"w": torch.tensor([0.0, 2.0, 0.5]), "b": None}, ref, [])
    assert repr(report) == (
        "GradientReport(strategy='custom', matches=False, largest_difference=2.0e+00, "
        "grad_is_none=['b'], replicas=0)"
    )


def test_the_clone_step_leaves_the_model_without_gradients_and_every_replica_with_one():
    printed = run_cell("replica-grads", **_sketch_names())
    assert "model     0.weight.grad: None" in printed
    assert sum(line.startswith("replica ") and "norm" in line for line in printed.splitlines()) == len(
        DEVICES
    )
    # the replicas' gradients, added up, are the one-device gradient: printed as two equal norms
    (summed,) = [line for line in printed.splitlines() if line.startswith("replicas' sum")]
    ours, theirs = (part.split("norm ")[1] for part in summed.split(";"))
    assert ours == theirs
    # equal up to float rounding, not bit for bit: the cell prints both, and the prose says so
    (gap,) = [line for line in printed.splitlines() if line.startswith("bit for bit equal")]
    assert float(gap.split("largest difference ")[1]) < 1e-5
    (prose,) = [c.source for c in nbformat.read(CHAPTER, as_version=4).cells if c.get("id") == "9f3e9713"]
    assert "up to float rounding" in prose and "exactly" not in prose


def test_the_replica_cell_fails_when_the_replicas_pass_the_gradient_on():
    with pytest.raises(AssertionError):
        run_cell("replica-grads", **_sketch_names("rewire"))  # an edge back: the model gets its .grad


def _sketch_names(strategy="clone"):
    """What the replica cell needs: the sketch from the page, bent to make ``strategy``'s replicas."""
    sketch = {"torch": torch, "dpteach": dpteach}
    exec(_cell("sketch").source, sketch)
    x, y = story.make_data()

    def data_parallel(model, x, devices, _):
        return sketch["data_parallel"](model, x, devices, strategy)

    return {"story": story, "devices": DEVICES, "xb": x, "yb": y, "data_parallel": data_parallel}


def _pasted_line() -> str:
    """The one-line check the takeaway tells the learner to paste."""
    cells = nbformat.read(CHAPTER, as_version=4).cells
    (text,) = [c.source for c in cells if c.get("id") == "own-code"]
    (listing,) = re.findall(r"```python\n(.*?)\n```", text, re.S)
    return listing


def test_the_pasted_line_is_the_line_the_takeaway_cell_runs():
    line = _pasted_line()
    assert "\n" not in line and line.startswith("assert all(p.grad is not None for p in model.parameters()")
    assert line in [row.strip() for row in _cell("grad-check").source.splitlines()]


def test_the_pasted_line_fails_without_a_grad_and_passes_with_every_grad():
    x, y = story.make_data()
    model, _ = after_clone_backward()
    with pytest.raises(AssertionError):
        exec(_pasted_line(), {"model": model})  # the clone step: no .grad on the model
    model = story.make_model()
    model[2].bias.requires_grad_(False)  # a frozen parameter is skipped
    nn.functional.mse_loss(model(x), y).backward()
    exec(_pasted_line(), {"model": model})
    model = story.make_model()
    nn.functional.mse_loss(model[0](x).sum(1, keepdim=True), y).backward()  # layer 2 unused
    with pytest.raises(AssertionError):
        exec(_pasted_line(), {"model": model})


def test_the_takeaway_cell_flags_the_clone_and_passes_the_fix():
    x, y = story.make_data()
    names = {"story": story, "devices": DEVICES, "xb": x, "yb": y}
    rows = run_cell("grad-check", **names).splitlines()
    assert rows == [
        "'clone'   AssertionError: a parameter got no .grad",
        "'rewire'  passes: every parameter has a .grad",
    ]
    cells = nbformat.read(CHAPTER, as_version=4).cells
    at = {c.get("id"): i for i, c in enumerate(cells)}
    summary = next(i for i, c in enumerate(cells) if c.source.startswith("## Summary"))
    assert at["own-code"] + 1 == at["grad-check"] == summary - 1  # the last thing before the summary


def test_the_exercise_check_accepts_the_count_and_names_each_miscount():
    from dpteach.course import checks

    checks.reset()
    assert checks.accumulators_reached(8, DEVICES).ok  # 4 parameters in each of the 2 replicas
    assert checks.accumulators_reached(12, [torch.device("cpu")] * 3).ok  # counted, not a constant
    one_model = checks.accumulators_reached(4, DEVICES)
    assert one_model.problem == "one model" and "Change `prediction`" in one_model.message
    assert checks.accumulators_reached(12, DEVICES).problem == "model too"
    assert checks.accumulators_reached(2, DEVICES).problem == "one per replica"
    assert checks.accumulators_reached(0, DEVICES).problem == "none"
    assert checks.accumulators_reached(9, DEVICES).problem == "too many"
    assert checks.accumulators_reached(5, DEVICES).problem == "too few"
    checks.reset()


def test_the_exercise_count_is_what_a_walk_of_the_clone_graph_finds():
    from dpteach.course import checks

    model = story.make_model()
    x, y = story.make_data()
    loss = nn.functional.mse_loss(dpteach.DataParallel(model, DEVICES, strategy="clone")(x), y)
    seen, todo, found = set(), [loss.grad_fn], 0
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        found += type(node).__name__ == "AccumulateGrad"
        todo += [n for n, _ in node.next_functions]
    assert found == 2 * len(list(model.parameters()))  # every replica's parameters, none of the model's
    checks.reset()
    assert checks.accumulators_reached(found, DEVICES).ok
    checks.reset()


def test_the_exercise_hints_climb_nudge_pointer_near_answer_and_never_print_the_answer_unasked():
    from dpteach.course import checks

    checks.reset()
    tries = [checks.accumulators_reached(4, DEVICES).message for _ in range(4)]
    assert "Hint 1 of 3" in tries[0] and "AccumulateGrad" in tries[0]  # the nudge: the idea
    assert "Hint 2 of 3" in tries[1] and "Printing `model`" in tries[1]  # the pointer: where to look
    assert "Hint 3 of 3" in tries[2] and "Each of the 2 replicas holds 4 parameters" in tries[2]
    assert "Hint 3 of 3" in tries[3]  # the last step repeats
    assert not any("prediction = 8" in t for t in tries)
    assert "Answer block" in tries[2] and "show_answer=True" in tries[2] and "Answer block" not in tries[1]
    assert "prediction = 8" in checks.accumulators_reached(..., DEVICES, show_answer=True).message
    correct = checks.accumulators_reached(8, DEVICES)
    assert correct.ok and 'Under "rewire" the same walk reaches 4, 4 of them the model\'s' in correct.message
    assert (
        "Hint 1 of 3" in checks.accumulators_reached(2, DEVICES).message
    )  # a right answer resets the ladder
    checks.reset()


def test_the_exercise_check_asks_for_a_whole_number_without_spending_a_hint():
    from dpteach.course import checks

    checks.reset()
    assert "Set `prediction`" in checks.accumulators_reached(..., DEVICES).message
    assert "is a whole number" in checks.accumulators_reached("one", DEVICES).message
    assert "is a whole number" in checks.accumulators_reached(2.5, DEVICES).message
    assert "is a whole number" in checks.accumulators_reached(True, DEVICES).message
    assert "Hint 1 of 3" in checks.accumulators_reached(4, DEVICES).message  # none of the three cost a try
    checks.reset()


def test_the_exercise_cell_calls_the_check_and_its_answer_matches_it():
    from dpteach.course import checks

    cells = nbformat.read(CHAPTER, as_version=4).cells
    (stub,) = [c.source for c in cells if c.get("id") == "ex3predict"]
    (worked,) = [c.source for c in cells if c.get("id") == "ex3-worked"]
    assert "prediction = ..." in stub and "checks.accumulators_reached(prediction, devices)" in stub
    answer = int(re.search(r"`prediction = (\d+)`", worked).group(1))
    checks.reset()
    assert checks.accumulators_reached(answer, DEVICES).ok  # the Answer block's number, on two slots
    checks.reset()


def test_the_edge_prediction_comes_before_its_answer():
    cells = nbformat.read(CHAPTER, as_version=4).cells
    contrast = _index("edge-contrast")
    asked, answered = cells[contrast - 1].source, cells[contrast + 1].source
    assert "**Predict:**" in asked and "new leaf" not in asked and "passes the sum on" not in asked
    assert "new leaf" in answered and "passes the sum on to the original" in answered


def test_the_exercise_hint_names_a_section_not_a_cell():
    cells = nbformat.read(CHAPTER, as_version=4).cells
    (text,) = [c.source for c in cells if c.get("id") == "0e6c2c89"]
    hint = text.split("<summary>Hint</summary>", 1)[1]
    assert "*The task, the model, the loop*" in hint and not re.search(r"\bcell \d", hint)
    assert any(c.source.startswith("## The task, the model, the loop") for c in cells)


def test_the_opening_says_torch_s_python_data_parallel_never_had_the_bug():
    (opening,) = [c.source for c in nbformat.read(CHAPTER, as_version=4).cells if c.get("id") == "c1d89982"]
    assert "`torch.nn.DataParallel` never had this bug" in opening and "`Broadcast`" in opening


def test_the_exercise_check_on_one_slot_says_nothing_is_replicated_without_spending_a_hint():
    from dpteach.course import checks

    checks.reset()
    for guess in (4, 8, 0):  # on one slot no count is the exercise's: the model runs itself
        verdict = checks.accumulators_reached(guess, [torch.device("cpu")])
        assert not verdict.ok and verdict.problem == "one slot"
        assert (
            "nothing is replicated" in verdict.message and "model's own 4 AccumulateGrad" in verdict.message
        )
        assert "Correct" not in verdict.message and "replica's .grad" not in verdict.message
    assert "Hint 1 of 3" in checks.accumulators_reached(4, DEVICES).message  # none of them cost a try
    checks.reset()


def test_the_sum_is_explained_and_contrasted_with_ddp_s_average():
    (prose,) = [c.source for c in nbformat.read(CHAPTER, as_version=4).cells if c.get("id") == "9f3e9713"]
    assert "after the gather" in prose and "partial sum" in prose
    assert "divides the summed gradient by the world size" in prose and "`div_factor_`" in prose
    reducer = Path(torch.__file__).parent / "include/torch/csrc/distributed/c10d/reducer.hpp"
    if reducer.exists():  # the header the prose names: the division factor is the process group size
        assert "Equal to the process group size" in reducer.read_text()
