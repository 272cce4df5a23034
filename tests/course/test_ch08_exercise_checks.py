"""Chapter 08's exercise checks: ``checks.copied_per_step`` (Exercise 1: every byte one DataParallel step
copies on n slots), ``checks.wait_for_backward`` (Exercise 2: the parts of each step that wait for every
backward) and ``checks.bucket_count`` (Exercise 3: DDP's buckets after its first step). A right answer is
accepted; each wrong one is matched to its slip (``Verdict.problem``) and the message says what to
change; the hints climb and give the answer from the third failed try. Truths are derived from the model,
the cost model and torch's own bucket assignment, never copied from a run.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpteach.course import checks
from dpteach.measure import bench, costmodel, costs

pytestmark = pytest.mark.usefixtures("fresh_checks")  # every test starts at hint 1


@pytest.fixture(scope="module")
def chapter():
    """The chapter's model, batch and counted workload (its set-up cell, on CPU)."""
    torch.manual_seed(0)
    model = bench.mlp(1024, "cpu")
    x = torch.randn(256, 1024)
    return model, x, costmodel.workload(model, x[:16]).scaled(len(x))


# ---------------------------------------------------------------- Exercise 1: the bytes of one step


def test_exercise_1_accepts_every_byte_of_the_step_on_any_number_of_slots(chapter):
    model, x, _ = chapter
    P = costs.state_nbytes(model)["parameters"]
    output = 256 * 1024 * 4  # the gathered output, whole, whatever the slots
    for n in (2, 3, 4):
        truth = (n - 1) * P + output
        assert truth == sum(costs.step_traffic(model, x, ["cpu"] * n).by_op().values())
        verdict = checks.copied_per_step(truth, model, x, ["cpu"] * n)
        assert verdict.ok and f"{truth:,} bytes" in verdict.message
    assert checks.copied_per_step(float(3 * P + output), model, x, ["cpu"] * 4).ok  # 26238976.0 counts
    model.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in model.parameters())  # the check counted on a copy


@pytest.mark.parametrize(
    "slip, wrong",
    [
        ("slot 0", lambda P, G: 4 * P + G),
        ("no gather", lambda P, G: 3 * P),
        ("two slots", lambda P, G: P + G),
        ("gradients", lambda P, G: 6 * P + G),
        ("elements", lambda P, G: (3 * P + G) // 4),
        ("every slot, no gather", lambda P, G: 4 * P),  # a copy for slot 0 too, and the gather left out
        ("gather share", lambda P, G: 3 * P + G * 3 // 4),  # slot 0's quarter of the output left out
        ("scatter", lambda P, G: 3 * P + 2 * G),  # the batch (256 x 1024 float32, G bytes) counted too
        ("scatter", lambda P, G: 3 * P + G + G * 3 // 4),  # the other slots' pieces of the batch
    ],
)
def test_exercise_1_names_each_slip_and_says_what_to_change(chapter, slip, wrong):
    model, x, _ = chapter
    P, G = costs.state_nbytes(model)["parameters"], 256 * 1024 * 4
    verdict = checks.copied_per_step(wrong(P, G), model, x, ["cpu"] * 4)
    assert not verdict.ok and verdict.problem == slip
    assert verdict.message.startswith("Not yet: ") and "Hint 1 of 2" in verdict.message
    change = verdict.message.removeprefix("Not yet: ").split("\nHint")[0]  # before the hint: what to change
    assert CHANGE[slip] in change, (slip, change)


# what each slip's message tells the learner to do to their number
CHANGE = {
    "slot 0": "take one model copy out",
    "no gather": "add its 1,048,576 bytes",
    "two slots": "count 3 model copies, and the gather once",
    "gradients": "leave the gradients out",
    "elements": "count bytes: 4 per float32",
    "every slot, no gather": "so count 3; then add the gather",
    "gather share": "count the whole output, 1,048,576 bytes",
    "scatter": "leave it out",
}


def test_exercise_1_a_number_no_slip_explains_says_what_to_add(chapter):
    model, x, _ = chapter
    verdict = checks.copied_per_step(12_345, model, x, ["cpu"] * 4)
    message = verdict.message.split("\nHint")[0]
    assert "12,345 bytes is too few" in message and "usual slip" not in message
    assert "the broadcast (one model copy for each slot after slot 0) and the gather" in message


def test_exercise_1_a_sum_slightly_off_a_slip_names_the_slip_and_the_sum(chapter):
    """The model copied to all 4 slots plus the gather, summed 1,024 bytes off: still the slot-0 slip."""
    model, x, _ = chapter
    P, G = costs.state_nbytes(model)["parameters"], 256 * 1024 * 4
    verdict = checks.copied_per_step(4 * P + G + 1024, model, x, ["cpu"] * 4)
    assert verdict.problem == "slot 0" and "slot 0 already holds the model" in verdict.message
    assert "the other 3 slots only" in verdict.message
    assert f"1,024 bytes off {4 * P + G:,}" in verdict.message and "check your sum" in verdict.message
    near = checks.copied_per_step(3 * P + G + 1024, model, x, ["cpu"] * 4)
    assert not near.ok and near.problem == "arithmetic" and "the right moves" in near.message


def test_exercise_1_says_the_scatter_of_the_batch_copies_nothing_on_one_device(chapter):
    model, x, _ = chapter
    P = costs.state_nbytes(model)["parameters"]
    verdict = checks.copied_per_step(3 * P + 2 * x.numel() * 4, model, x, ["cpu"] * 4)
    assert "you added the scatter of the batch" in verdict.message
    assert "on one device it cuts the batch into views" in verdict.message
    checks.reset()


def test_exercise_1_hints_climb_to_the_answer_and_refuse_non_counts(chapter):
    model, x, _ = chapter
    slots = ["cpu"] * 4
    labels = [checks.copied_per_step(12_345, model, x, slots).message for _ in range(3)]
    assert "Hint 1 of 2" in labels[0] and "Hint 2 of 2" in labels[1] and "The answer: 26,238,976" in labels[2]
    assert "Set predicted" in checks.copied_per_step(..., model, x, slots).message
    assert "whole number" in checks.copied_per_step(1.5, model, x, slots).message


# ---------------------------------------------------------------- Exercise 2: what waits for backward


RIGHT = {"DataParallel": {"flatten", "reduce"}, "DDP": {"bucket 2"}}


def test_exercise_2_accepts_the_parts_that_start_once_every_backward_is_done(chapter):
    work = chapter[2]
    for strategy, names in RIGHT.items():
        pred = costmodel.predict(work, "A100-SXM", 4, strategy, latency=True)
        done = max(p.end for p in pred.parts if p.name == "backward")
        reduces = [p for p in pred.parts if p.name == "all-reduce"]
        after = {p.name for p in pred.parts if p.start >= done - 1e-12 and p.name != "all-reduce"}
        after |= {f"bucket {k + 1}" for k, p in enumerate(reduces) if p.start >= done - 1e-12}
        assert after == names  # what the timeline shows is what the check accepts
    verdict = checks.wait_for_backward(RIGHT, work)
    assert verdict.ok and "only the last bucket" in verdict.message
    assert checks.wait_for_backward({"DataParallel": ["reduce", "flatten"], "DDP": ("bucket 2",)}, work).ok


@pytest.mark.parametrize(
    "problem, answer",
    [
        ("gather", {"DataParallel": {"gather", "flatten", "reduce"}, "DDP": {"bucket 2"}}),
        ("gather", {"DataParallel": {"scatter grad", "flatten", "reduce"}, "DDP": {"bucket 2"}}),
        ("flatten", {"DataParallel": {"reduce"}, "DDP": {"bucket 2"}}),
        ("reduce", {"DataParallel": {"flatten"}, "DDP": {"bucket 2"}}),
        ("first bucket", {"DataParallel": {"flatten", "reduce"}, "DDP": {"bucket 1", "bucket 2"}}),
        ("last bucket", {"DataParallel": {"flatten", "reduce"}, "DDP": set()}),
        ("names", {"DataParallel": {"sum"}, "DDP": {"bucket 2"}}),
        ("names", {"DataParallel": {"flatten", "reduce"}, "DDP": {"bucket 3"}}),
    ],
)
def test_exercise_2_names_each_mistake(chapter, problem, answer):
    verdict = checks.wait_for_backward(answer, chapter[2])
    assert not verdict.ok and verdict.problem == problem and verdict.message.startswith("Not yet: ")


def test_exercise_2_a_typo_costs_no_try_and_names_the_nearest_part(chapter):
    """A name the figure does not use ("bucket2") is told as such, with the nearest name; it climbs no
    rung of the hints, so three typos in a row never give the answer away."""
    typo = {"DataParallel": {"flatten", "reduce"}, "DDP": {"bucket2"}}
    for _ in range(3):
        verdict = checks.wait_for_backward(typo, chapter[2])
        assert not verdict.ok and verdict.problem == "names"
        assert "Did you mean 'bucket 2'?" in verdict.message and "does not count" in verdict.message
        assert "Hint" not in verdict.message and "The answer" not in verdict.message
    wrong = checks.wait_for_backward({"DataParallel": {"reduce"}, "DDP": {"bucket 2"}}, chapter[2])
    assert "Hint 1 of 2" in wrong.message  # the first real try still gets the first hint


def test_exercise_2_asks_for_a_set_when_given_a_string(chapter):
    """ "bucket 2" for {"bucket 2"}: asked for a set, not told about its letters, and no try spent."""
    for _ in range(3):
        verdict = checks.wait_for_backward(
            {"DataParallel": {"flatten", "reduce"}, "DDP": "bucket 2"}, chapter[2]
        )
        assert not verdict.ok and verdict.problem == "names"
        assert "is a string, 'bucket 2'" in verdict.message and "{'bucket 2'}" in verdict.message
        assert "no part named" not in verdict.message and "Hint" not in verdict.message


@pytest.mark.parametrize("named", ["backward", "forward"])
def test_exercise_2_a_pass_named_is_told_the_moves(chapter, named):
    """The passes themselves are drawn but do not wait for backward: told the moves, no try spent."""
    for strategy, right in RIGHT.items():
        answer = {**RIGHT, strategy: right | {named}}
        verdict = checks.wait_for_backward(answer, chapter[2])
        assert not verdict.ok and verdict.problem == "passes" and "Hint" not in verdict.message
        assert f"'{named}' is not a part that waits for backward" in verdict.message
        assert "runs before backward" not in verdict.message
    dp = checks.wait_for_backward({**RIGHT, "DataParallel": {"backward"}}, chapter[2]).message
    assert "flatten, gather, reduce, replicate, scatter, scatter grad" in dp


def test_exercise_2_waits_for_both_answers_before_checking(chapter):
    verdict = checks.wait_for_backward({"DataParallel": ..., "DDP": ...}, chapter[2])
    assert not verdict.ok and "Set answer" in verdict.message and not verdict.problem


# ---------------------------------------------------------------- Exercise 3: DDP's buckets


def deep(layers: int = 12) -> nn.Module:
    return nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(layers)])


def torch_buckets(model: nn.Module) -> list[int]:
    """Bucket bytes as torch assigns them: its own ``_compute_bucket_assignment_by_size`` over the
    parameters in backward order, with DDP's default caps (1 MiB first, 25 MiB after)."""
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available():
        pytest.skip("torch built without torch.distributed")
    params = list(model.parameters())[::-1]
    limits = [dist._DEFAULT_FIRST_BUCKET_BYTES, 25 * 2**20]
    indices, _ = dist._compute_bucket_assignment_by_size(params, limits, [False] * len(params))
    return [sum(params[i].nbytes for i in b) for b in indices]


@pytest.mark.parametrize("layers", [2, 8, 12])
def test_the_bucket_rule_is_torchs(layers):
    model = deep(layers)
    ours = costmodel.buckets(costmodel.workload(model, torch.randn(2, 1024)))
    assert sorted(ours) == sorted(torch_buckets(model))
    assert checks.bucket_count(len(ours), model).ok


def test_exercise_3_accepts_three_buckets_for_twelve_layers():
    verdict = checks.bucket_count(3, deep())
    assert verdict.ok and "4.2 MB, 29.4 MB, 16.8 MB" in verdict.message


@pytest.mark.parametrize(
    "problem, wrong", [("no first bucket", 2), ("one bucket", 1), ("per layer", 12), ("per tensor", 24)]
)
def test_exercise_3_names_each_slip(problem, wrong):
    verdict = checks.bucket_count(wrong, deep())
    assert not verdict.ok and verdict.problem == problem and verdict.message.startswith("Not yet: ")


def test_exercise_3_reading_the_cap_as_a_maximum_is_told_the_rule():
    verdict = checks.bucket_count(4, deep())  # each bucket kept under 25 MB: 1 + 5 + 5 + 1 layers
    assert not verdict.ok and verdict.problem == "cap as a maximum"
    assert "a bucket closes on the tensor that takes it to or past its cap" in verdict.message


def test_exercise_3_hints_climb_to_the_answer():
    messages = [checks.bucket_count(7, deep()).message for _ in range(3)]
    assert (
        "Hint 1 of 2" in messages[0]
        and "Hint 2 of 2" in messages[1]
        and "The answer: 3 buckets" in messages[2]
    )
    assert "Set predicted" in checks.bucket_count(..., deep()).message


def test_exercise_1s_stub_and_its_check_give_the_same_example(chapter):
    """The placeholder's example number is the one the check prints while ``predicted`` is unset."""
    import re
    from pathlib import Path

    import nbformat

    nb = nbformat.read(Path(__file__).resolve().parents[2] / "notebooks" / "08_real_gpus.ipynb", as_version=4)
    [stub] = [c.source for c in nb.cells if "exercise-1" in c.metadata.get("tags", [])]
    model, x, _ = chapter
    [example] = re.findall(r"e\.g\. (\d+)", stub)
    assert f"e.g. {example}," in checks.copied_per_step(..., model, x, ["cpu"] * 4).message
