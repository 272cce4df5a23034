"""Chapter 08's exercise checks: ``checks.copied_per_step`` (Exercise 1: every byte one DataParallel step
copies on n slots), ``checks.ddp_also_copies`` (Exercise 2: which of DataParallel's moves DDP makes too),
``checks.nodes_per_thread`` (Exercise 3: the backward nodes each GPU's engine thread runs),
``checks.wait_for_backward`` (Exercise 4: the parts of each step that wait for every backward) and
``checks.bucket_count`` (Exercise 5: DDP's buckets after its first step). A right answer is
accepted; each wrong one is matched to its slip (``Verdict.problem``) and the message says what to
change; the hints climb and give the answer from the third failed try. Truths are derived from the model,
the cost model, torch's own bucket assignment and DDP's source, and a recorded backward, never copied
from a run.
"""

from __future__ import annotations

import re

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


# ---------------------------------------------------------------- Exercise 4: what waits for backward


RIGHT = {"DataParallel": {"flatten", "reduce"}, "DDP": {"bucket 2"}}


def test_exercise_4_accepts_the_parts_that_start_once_every_backward_is_done(chapter):
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
    assert 'DataParallel: {"flatten", "reduce"}, DDP: {"bucket 2"}' in verdict.message  # sets, as asked
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
def test_exercise_4_names_each_mistake(chapter, problem, answer):
    verdict = checks.wait_for_backward(answer, chapter[2])
    assert not verdict.ok and verdict.problem == problem and verdict.message.startswith("Not yet: ")


def test_exercise_4_a_typo_costs_no_try_and_names_the_nearest_part(chapter):
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


def test_exercise_4_asks_for_a_set_when_given_a_string(chapter):
    """ "bucket 2" for {"bucket 2"}: asked for a set, not told about its letters, and no try spent."""
    for _ in range(3):
        verdict = checks.wait_for_backward(
            {"DataParallel": {"flatten", "reduce"}, "DDP": "bucket 2"}, chapter[2]
        )
        assert not verdict.ok and verdict.problem == "names"
        assert "is a string, 'bucket 2'" in verdict.message and "{'bucket 2'}" in verdict.message
        assert "no part named" not in verdict.message and "Hint" not in verdict.message


@pytest.mark.parametrize("named", ["backward", "forward"])
def test_exercise_4_a_pass_named_is_told_the_moves(chapter, named):
    """The passes themselves are drawn but do not wait for backward: told the moves, no try spent."""
    for strategy, right in RIGHT.items():
        answer = {**RIGHT, strategy: right | {named}}
        verdict = checks.wait_for_backward(answer, chapter[2])
        assert not verdict.ok and verdict.problem == "passes" and "Hint" not in verdict.message
        assert f"'{named}' is not a part that waits for backward" in verdict.message
        assert "runs before backward" not in verdict.message
    dp = checks.wait_for_backward({**RIGHT, "DataParallel": {"backward"}}, chapter[2]).message
    assert "flatten, gather, reduce, replicate, scatter, scatter grad" in dp


def test_exercise_4_waits_for_both_answers_before_checking(chapter):
    verdict = checks.wait_for_backward({"DataParallel": ..., "DDP": ...}, chapter[2])
    assert not verdict.ok and "Set answer" in verdict.message and not verdict.problem


# ---------------------------------------------------------------- Exercise 5: DDP's buckets


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


def test_exercise_5_accepts_three_buckets_for_twelve_layers():
    verdict = checks.bucket_count(3, deep())
    assert verdict.ok and "4.2 MB, 29.4 MB, 16.8 MB" in verdict.message


@pytest.mark.parametrize(
    "problem, wrong", [("no first bucket", 2), ("one bucket", 1), ("per layer", 12), ("per tensor", 24)]
)
def test_exercise_5_names_each_slip(problem, wrong):
    verdict = checks.bucket_count(wrong, deep())
    assert not verdict.ok and verdict.problem == problem and verdict.message.startswith("Not yet: ")


def test_exercise_5_reading_the_cap_as_a_maximum_is_told_the_rule():
    verdict = checks.bucket_count(4, deep())  # each bucket kept under 25 MB: 1 + 5 + 5 + 1 layers
    assert not verdict.ok and verdict.problem == "cap as a maximum"
    assert "a bucket closes on the tensor that takes it to or past its cap" in verdict.message


def test_exercise_5_hints_climb_to_the_answer():
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


# ---------------------------------------------------------------- Exercise 2: the copies DDP does not make


def bn() -> nn.Module:
    return nn.Sequential(nn.Linear(1024, 1024), nn.BatchNorm1d(1024))


def test_exercise_2_accepts_no_move_for_the_mlp_and_the_buffers_broadcast_for_bn(chapter):
    model = chapter[0]
    verdict = checks.ddp_also_copies({"model": set(), "bn": {"broadcast"}}, {"model": model, "bn": bn()})
    assert verdict.ok and "8,200 bytes" in verdict.message and "never the parameters" in verdict.message
    # the truth follows the buffers: a BatchNorm model without running statistics has none to broadcast
    plain = nn.Sequential(nn.Linear(1024, 1024), nn.BatchNorm1d(1024, track_running_stats=False))
    assert checks.ddp_also_copies({"plain": set()}, {"plain": plain}).ok
    assert checks.ddp_also_copies({"m": ["Broadcast "]}, {"m": bn()}).ok  # names read loosely


def test_exercise_2s_truth_is_ddps_default_buffer_sync():
    """DDP syncs buffers before forward unless told not to: forward_sync_buffers (None -> True)."""
    import inspect

    ddp = pytest.importorskip("torch.nn.parallel").DistributedDataParallel
    params = inspect.signature(ddp.__init__).parameters
    assert params["forward_sync_buffers"].default is None and params["broadcast_buffers"].default is None
    source = inspect.getsource(ddp._pre_forward)
    assert "self._check_sync_bufs_pre_fwd()" in source and "self._sync_buffers()" in source
    assert "self.forward_sync_buffers" in inspect.getsource(ddp.will_sync_module_buffers)


@pytest.mark.parametrize(
    "problem, answer, change",
    [
        ("reduce_add", {"model": {"reduce_add"}, "bn": {"broadcast"}}, "take reduce_add out"),
        ("scatter", {"model": {"scatter"}, "bn": {"broadcast"}}, "take scatter out"),
        ("gather", {"model": set(), "bn": {"broadcast", "gather"}}, "take gather out"),
        ("parameters", {"model": {"broadcast"}, "bn": {"broadcast"}}, "take broadcast out of its set"),
        ("buffers", {"model": set(), "bn": set()}, "What must DDP do before every forward"),
    ],
)
def test_exercise_2_names_each_slip_and_says_what_to_change(chapter, problem, answer, change):
    verdict = checks.ddp_also_copies(answer, {"model": chapter[0], "bn": bn()})
    assert not verdict.ok and verdict.problem == problem and verdict.message.startswith("Not yet: ")
    assert change in verdict.message.split("\nHint")[0] and "Hint 1 of 2" in verdict.message


def test_exercise_2_the_first_try_points_at_the_idea_and_the_second_names_the_move(chapter):
    models = {"model": chapter[0], "bn": bn()}
    first, second = (checks.ddp_also_copies({"model": set(), "bn": set()}, models).message for _ in range(2))
    assert "broadcast" not in first.split("\nHint")[0] and "updates them from its own rows" in first
    assert "so add broadcast to its set" in second.split("\nHint")[0] and "8,200 bytes" in second


def test_exercise_2_a_wrong_name_or_a_string_costs_no_try(chapter):
    models = {"model": chapter[0], "bn": bn()}
    for _ in range(3):
        verdict = checks.ddp_also_copies({"model": set(), "bn": {"all-reduce"}}, models)
        assert verdict.problem == "names" and "DDP's all-reduce is its own move" in verdict.message
        assert "Hint" not in verdict.message
    said = checks.ddp_also_copies({"model": set(), "bn": "broadcast"}, models).message
    assert "bn's answer is a string" in said and "{'broadcast'}" in said
    assert "Hint 1 of 2" in checks.ddp_also_copies({"model": set(), "bn": set()}, models).message
    assert "Set answer" in checks.ddp_also_copies({"model": ..., "bn": ...}, models).message


def test_exercise_2_hints_climb_to_the_answer(chapter):
    models = {"model": chapter[0], "bn": bn()}
    messages = [checks.ddp_also_copies({"model": set(), "bn": set()}, models).message for _ in range(3)]
    assert "Hint 1 of 2" in messages[0] and "Hint 2 of 2" in messages[1]
    assert """The answer: answer = {"model": set(), "bn": {'broadcast'}}""" in messages[2]


# ---------------------------------------------------------------- Exercise 3: the nodes each thread runs


RIGHT_5 = {"cuda:0": 13, "cuda:1": 5, "cuda:2": 5, "cuda:3": 5}


def test_exercise_3s_truth_is_the_recorded_step_under_the_engines_rule(chapter):
    """The counts are the rows the chapter's GPU table prints, summed per thread: a replica's nodes on its
    GPU's thread, the loss, gather and sum on cuda:0's."""
    import re

    from dpteach.measure import threads

    model, x, _ = chapter
    recorded = threads.backward_threads(model, x, ["cpu"] * 4)
    model.zero_grad(set_to_none=True)
    assert recorded.gpu_threads() == RIGHT_5 and sum(RIGHT_5.values()) == len(recorded.rows)
    printed: dict[str, int] = {}
    for k, gpu in re.findall(r"^ +(\d+)  .*autograd thread (cuda:\d)", recorded.on_gpus(), flags=re.M):
        printed[gpu] = printed.get(gpu, 0) + int(k)
    assert printed == RIGHT_5
    wider = threads.backward_threads(model, x, ["cpu"] * 6).gpu_threads()  # cuda:0 keeps its 13
    model.zero_grad(set_to_none=True)
    assert wider["cuda:0"] == 13 and list(wider.values())[1:] == [5] * 5


def test_exercise_3_accepts_the_counts_and_leaves_the_model_untouched(chapter):
    model, x, _ = chapter
    model.zero_grad(set_to_none=True)
    verdict = checks.nodes_per_thread(RIGHT_5, model, x)
    assert verdict.ok and "3 + 5 + 5 = 13" in verdict.message
    assert all(p.grad is None for p in model.parameters())  # the check recorded a copy's backward
    spelled = {"autograd thread cuda:0": 13, "CUDA:1": 5, "cuda:2": 5.0, "cuda:3": 5, "caller thread": 0}
    assert checks.nodes_per_thread(spelled, model, x).ok


@pytest.mark.parametrize(
    "problem, answer, change",
    [
        ("one thread", {"cuda:0": 28, "cuda:1": 0, "cuda:2": 0, "cuda:3": 0}, "on CPU slots only"),
        ("caller", {**RIGHT_5, "caller": 28}, "give the caller 0"),
        ("cuda:0 replica only", {**RIGHT_5, "cuda:0": 5}, "which GPU holds the loss, the gathered output"),
        ("no sum", {**RIGHT_5, "cuda:0": 8}, "more than its replica's 5 nodes"),
        ("no loss", {**RIGHT_5, "cuda:0": 10}, "more than its replica's 5 nodes"),
        (
            "even split",
            {"cuda:0": 7, "cuda:1": 7, "cuda:2": 7, "cuda:3": 7},
            "does not share nodes out evenly",
        ),
        ("replica", {**RIGHT_5, "cuda:2": 13}, "runs only the nodes whose gradients are on cuda:2"),
        ("other", {**RIGHT_5, "cuda:0": 20}, "cuda:0: 20 is too many"),
    ],
)
def test_exercise_3_names_each_slip_and_says_what_to_change(chapter, problem, answer, change):
    model, x, _ = chapter
    verdict = checks.nodes_per_thread(answer, model, x)
    assert not verdict.ok and verdict.problem == problem and verdict.message.startswith("Not yet: ")
    assert change in verdict.message.split("\nHint")[0] and "Hint 1 of 2" in verdict.message


@pytest.mark.parametrize(
    "answer, change",
    [
        ({**RIGHT_5, "cuda:0": 5}, "cuda:0 also runs the loss and gather (3)"),
        ({**RIGHT_5, "cuda:0": 8}, "the sum onto the model (5 nodes)"),
        ({**RIGHT_5, "cuda:0": 10}, "the loss and gather (3 nodes)"),
    ],
)
def test_exercise_3_the_first_try_asks_where_and_the_second_gives_the_counts(chapter, answer, change):
    model, x, _ = chapter
    first, second = (checks.nodes_per_thread(answer, model, x).message for _ in range(2))
    assert change not in first and "13" not in first.split("\nHint")[0]
    assert change in second.split("\nHint")[0] and "Hint 2 of 2" in second


@pytest.mark.parametrize(
    "answer, count",
    [
        ({**RIGHT_5, "cuda:2": 13}, "set cuda:2 to 5"),
        ({"cuda:0": 7, "cuda:1": 7, "cuda:2": 7, "cuda:3": 7}, "each GPU gets its replica's 5"),
    ],
)
def test_exercise_3_a_first_slip_gets_the_idea_and_only_a_second_the_count(chapter, answer, count):
    """A ladder: the first wrong try names the idea with no count in it; the count comes from the second."""
    model, x, _ = chapter
    first, second = (checks.nodes_per_thread(answer, model, x).message for _ in range(2))
    said = first.split("\nHint")[0]
    assert count not in said and not re.search(r"\b(5|13)\b", said), said
    assert count in second.split("\nHint")[0] and "Hint 2 of 2" in second


def test_exercise_3_a_missing_thread_costs_no_try_and_the_hints_climb(chapter):
    model, x, _ = chapter
    for _ in range(3):
        verdict = checks.nodes_per_thread({"cuda:0": 13, "cuda:1": 5}, model, x)
        assert verdict.problem == "names" and '"cuda:3"' in verdict.message and "Hint" not in verdict.message
    assert "Set answer" in checks.nodes_per_thread(dict.fromkeys(RIGHT_5, ...), model, x).message
    messages = [checks.nodes_per_thread({**RIGHT_5, "cuda:0": 5}, model, x).message for _ in range(3)]
    assert "Hint 1 of 2" in messages[0] and "Hint 2 of 2" in messages[1]
    assert 'The answer: answer = {"cuda:0": 13, "cuda:1": 5, "cuda:2": 5, "cuda:3": 5}' in messages[2]


def test_exercise_4_reads_part_names_in_any_case(chapter):
    """ "Flatten" is the figure's flatten: a right answer with capitals is right, not a typo."""
    capitals = {"DataParallel": {"Flatten", "REDUCE"}, "DDP": {"Bucket 2"}}
    assert checks.wait_for_backward(capitals, chapter[2]).ok
