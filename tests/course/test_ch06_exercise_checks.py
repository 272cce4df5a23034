"""Chapter 06's exercise checks: ``checks.model_copy_bytes`` (Exercise 2: the bytes of the model copies
alone in one step, ``(N - 1)·(P + B)`` under "broadcast"), ``checks.slot0_memory``,
``checks.bytes_onto_slot_1`` and ``checks.bucket_copies`` (Exercises 3-5). Each wrong answer is matched to
the slip or mistake that gives it; what is asserted is the slip named (``CountVerdict.slips``) or the
mistake found (``Verdict.problem``) and that the message says what to change, not its wording. The truths
are derived from the model and the tensors, never copied from a run.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from dpteach.course import checks
from dpteach.measure import costs

CPU = torch.device("cpu")


pytestmark = pytest.mark.usefixtures("fresh_checks")  # every test starts at hint 1


def make_model(hidden: int = 256):
    """The chapter's model; ``hidden=512`` is Exercise 2's, as its starter cell builds it."""
    return nn.Sequential(
        nn.Linear(64, hidden),
        nn.BatchNorm1d(hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, 10),
    )


# ---------------------------------------------------------------- Exercise 2: how much wider, then the bytes


def test_width_ratio_passes_about_three_and_a_half_and_says_what_2_and_4_miss():
    """The ratio of the two models' P + B, derived here (3.52): 3.5 passes; 2 is told that a layer with
    both sides doubled grows with the square, 4 that the layers with one side fixed only double; an
    unset or non-number answer asks for a number and costs no try; the third wrong try shows the ratio."""
    wide, model = make_model(512), make_model(256)
    truth = sum(costs.state_nbytes(wide).values()) / sum(costs.state_nbytes(model).values())
    assert round(truth, 2) == 3.52
    assert checks.width_ratio(3.5, wide, model).ok and checks.width_ratio(round(truth, 2), wide, model).ok
    assert "Set ratio" in checks.width_ratio(..., wide, model).message
    assert "as a number" in checks.width_ratio("3.5", wide, model).message
    two = checks.width_ratio(2, wide, model)
    assert (
        not two.ok and "too few" in two.message and "square" in two.message and "Hint 1 of 2" in two.message
    )
    four = checks.width_ratio(4, wide, model)
    assert not four.ok and "too many" in four.message and "only double" in four.message
    assert "3.52 times" in checks.width_ratio(4, wide, model).message  # the third try gives the ratio


# ---------------------------------------------------------------- Exercise 2: the model copies' bytes


def sizes(model, x):
    P, B = costs.state_nbytes(model).values()
    gathered = 4 * x.shape[0] * 10  # 32 rows of 10 float32 outputs
    return P, B, gathered


def test_the_right_answer_is_the_model_copies_without_the_gather():
    model, x, slots = make_model(512), torch.randn(32, 64), ["cpu"] * 2
    P, B, gathered = sizes(model, x)
    assert (P, B) == (4 * 302_090, 2 * 512 * 4 + 8)  # Answer 2's sums
    verdict = checks.model_copy_bytes((2 - 1) * (P + B), model, x, slots)
    assert verdict.ok and "1,212,464 bytes" in verdict.message  # the figure the exercise promises
    assert f"{gathered:,}" in verdict.message  # the gather is said to come on top
    assert checks.model_copy_bytes(float(P + B), model, x, slots).ok  # 1212464.0 is a whole number
    for n in (3, 4):  # N - 1 model copies on any number of slots
        assert checks.model_copy_bytes((n - 1) * (P + B), model, x, ["cpu"] * n).ok
    assert checks.model_copy_bytes(2 * (P + B), model, x, slots, strategy="clone").ok  # N under "clone"


@pytest.mark.parametrize("n", [2, 4])
def test_each_slip_is_told_apart(n):
    model, x, slots = make_model(512), torch.randn(32, 64), ["cpu"] * n
    P, B, gathered = sizes(model, x)
    elements = sum(t.numel() for t in (*model.parameters(), *model.buffers()))
    k = n - 1  # model copies under "broadcast"
    said = {
        k * (P + B) + gathered: ("gather",),  # the gathered output counted in
        k * (P + B - 8): ("counter",),  # num_batches_tracked left out
        k * (P + B - 4): ("counter as 4 bytes",),  # the int64 counter taken for 4 bytes
        k * P: ("buffers",),  # every buffer left out
        n * (P + B): ("slot 0",),  # slot 0 counted: N copies instead of N - 1
        n * (P + B) + gathered: ("slot 0", "gather"),
        k * P + gathered: ("buffers", "gather"),
        k * elements: ("elements",),  # elements, not bytes
        12_345: (),  # no slip gives it
    }
    for guess, slips in said.items():
        checks.reset()
        verdict = checks.model_copy_bytes(guess, model, x, slots)
        assert not verdict.ok and verdict.slips == slips, (guess, verdict.slips)
        assert verdict.message.startswith("Not yet: ")  # every failure says what to change


def test_the_answer_comes_only_from_the_third_wrong_try_and_the_model_is_left_alone():
    model, x, slots = make_model(512), torch.randn(32, 64), ["cpu"] * 2
    P, B, gathered = sizes(model, x)
    truth = P + B
    before = {k: v.clone() for k, v in model.state_dict().items()}
    tries = [checks.model_copy_bytes(truth + gathered, model, x, slots) for _ in range(4)]
    assert [v.shows_answer for v in tries] == [False, False, True, True]
    assert not any(f"{truth:,}" in v.message for v in tries[:2])  # never before the third try
    assert all(f"{truth:,}" in v.message for v in tries[2:])
    assert tries[0].message != tries[1].message  # the hint climbs
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # BatchNorm's statistics
    assert all(p.grad is None for p in model.parameters())  # the check stepped a copy
    assert checks.model_copy_bytes(truth, model, x, slots).ok
    assert not checks.model_copy_bytes(truth + gathered, model, x, slots).shows_answer  # the ladder restarts


def test_an_answer_not_given_or_not_a_number_costs_no_try():
    model, x, slots = make_model(512), torch.randn(32, 64), ["cpu"] * 2
    assert "Set predicted" in checks.model_copy_bytes(..., model, x, slots).message
    for wrong_kind in ("1212464", True, 1.5):
        assert not checks.model_copy_bytes(wrong_kind, model, x, slots).ok
    first = checks.model_copy_bytes(1, model, x, slots)
    assert "Hint 1 of 2" in first.message  # the calls above climbed nothing


def test_the_exercise_checks_the_model_copies_and_answer_2_gives_them():
    """The starter cell calls the check; Answer 2 states (N - 1)(P + B) for 2 slots, the gather apart."""
    import re
    from pathlib import Path

    import nbformat

    notebook = Path(__file__).resolve().parents[2] / "notebooks" / "06_the_cost_of_copies.ipynb"
    cells = nbformat.read(notebook, as_version=4).cells
    stubs = [c.source for c in cells if "exercise-stub" in c.metadata.get("tags", [])]
    assert any("checks.model_copy_bytes(predicted, wide, x, devices" in s for s in stubs)
    text = "\n".join(c.source for c in cells if c.cell_type == "markdown")
    answer = " ".join(re.search(r"<summary>Answer 2</summary>(.*?)</details>", text, re.S)[1].split())
    P, B, gathered = sizes(make_model(512), torch.randn(32, 64))
    assert f"= {P + B:,} bytes" in answer and f"{gathered:,} bytes, comes on top" in answer
    assert f"{P + B + gathered:,} bytes in all" in answer


# ---------------------------------------------------------------- Exercise 3: slot 0's memory


def test_slot0_memory_passes_the_data_ptr_answer():
    model = make_model()
    right = {"broadcast": True, "clone": False}  # broadcast's slot 0 is the model; a clone has its own memory
    assert checks.slot0_memory(right, "model", model, CPU).ok
    assert checks.slot0_memory({**right, "rewire": False}, "model", model, CPU).ok  # rewire clones too


@pytest.mark.parametrize(
    "shared, lands_in, problem",
    [
        ({"broadcast": torch.tensor(True), "clone": torch.tensor(True)}, "model", "values"),  # == on tensors
        ({"broadcast": False, "clone": True}, "model", "swapped"),
        ({"broadcast": False, "clone": False}, "model", "broadcast"),
        ({"broadcast": True, "clone": True}, "model", "clone"),
        ({"broadcast": True, "clone": False}, "replica", "lands in"),
    ],
)
def test_slot0_memory_names_the_mistake(shared, lands_in, problem):
    verdict = checks.slot0_memory(shared, lands_in, make_model(), CPU)
    assert not verdict.ok and verdict.problem == problem and verdict.message.startswith("Not yet: ")
    change = verdict.message.splitlines()[0]
    assert change.endswith("."), change  # each message says what to change in a whole sentence


def test_slot0_memory_says_what_each_replica_uses_and_nothing_left_open():
    verdict = checks.slot0_memory({"broadcast": True, "clone": False}, "model", make_model(), CPU)
    assert "'broadcast' the model's own tensors, 'clone' memory of its own." in verdict.message
    assert " or " not in verdict.message.split("lands_in")[0]  # no either-or left from a template


def test_slot0_memory_asks_for_what_is_missing_and_gives_the_answer_last():
    model = make_model()
    assert "Set shared" in checks.slot0_memory({"broadcast": ...}, ..., model, CPU).message
    assert not checks.slot0_memory({"broadcast": True, "clone": False}, "slot 0", model, CPU).ok
    tries = [checks.slot0_memory({"broadcast": False, "clone": True}, "model", model, CPU) for _ in range(3)]
    assert [("The answer" in v.message) for v in tries] == [False, False, True]  # hints first, answer third
    assert "lands_in = 'model'" in tries[-1].message


# ---------------------------------------------------------------- Exercise 4: bytes onto slot 1


@pytest.mark.parametrize("strategy", ["broadcast", "clone"])
def test_bytes_onto_slot_1_is_one_model_copy(strategy):
    model = make_model()
    P, B = costs.state_nbytes(model).values()
    first = checks.bytes_onto_slot_1(P + B, model, CPU, strategy)  # (N - 1)·(P + B) with N = 2
    assert not first.ok and "Now set stays_on_slot_0" in first.message  # right, the second still asked


def test_bytes_onto_slot_1_names_the_mistake():
    import dpteach

    model, meta = make_model(), torch.device("meta")
    P, B = costs.state_nbytes(model).values()
    with dpteach.comm.traffic() as t:
        dpteach.replicate(model, [CPU, meta], strategy="broadcast")
    onto = [c for c in t.copies if c.dst == meta]
    said = {
        0: "string",  # c.dst == "meta": a device never equals a string
        t.bytes: "every copy",  # the packs on devices[0] added in
        t.bytes - (P + B): "slot 0",  # only the copies that stay on devices[0]
        len(onto): "copies",  # how many, not how many bytes
        P: "buffers",  # the parameters alone
        12_345: "",  # nothing explains it
    }
    for guess, problem in said.items():
        verdict = checks.bytes_onto_slot_1(guess, model, CPU)
        assert not verdict.ok and verdict.problem == problem, (guess, verdict.problem)
    assert "Set onto_slot_1" in checks.bytes_onto_slot_1(..., model, CPU).message


def test_bytes_left_on_slot_0_tell_how_the_strategy_reaches_slot_1():
    """The second question: the bytes that stay on devices[0]. Under "clone" both clones, 2·(P + B), since
    slot 1's clone is made on devices[0] before its .to; under "broadcast" the packs, the int64 counter's
    bucket of one tensor left unpacked. A right onto_slot_1 with a wrong picture of the copies fails."""
    import dpteach

    model, meta = make_model(), torch.device("meta")
    P, B = costs.state_nbytes(model).values()
    counter = sum(b.nbytes for n, b in model.named_buffers() if n.endswith("num_batches_tracked"))
    with dpteach.comm.traffic() as t:
        dpteach.replicate(model, [CPU, meta], strategy="broadcast")
    packs = t.by_op()["pack"]
    assert packs == P + B - counter  # derived from the model: every bucket but the counter's is packed
    truths = {"clone": 2 * (P + B), "broadcast": packs}
    for strategy, stays in truths.items():
        verdict = checks.bytes_onto_slot_1(P + B, model, CPU, strategy, stays)
        assert verdict.ok and f"{stays:,} bytes stay on devices[0]" in verdict.message, strategy
        # onto_slot_1 right, the second question still open: asked for, not approved
        open_ = checks.bytes_onto_slot_1(P + B, model, CPU, strategy, ...)
        assert not open_.ok and "set stays_on_slot_0" in open_.message
    said = {
        ("clone", P + B): "one clone",  # as if slot 1's copy came straight from the model (today's C++)
        ("clone", 0): "nothing stays",
        ("broadcast", P + B): "counter packed",  # every bucket packed, the counter's too
        ("broadcast", 0): "nothing stays",
        ("clone", 12_345): "",
    }
    for (strategy, guess), problem in said.items():
        verdict = checks.bytes_onto_slot_1(P + B, model, CPU, strategy, guess)
        assert not verdict.ok and verdict.problem == problem, (strategy, guess, verdict.problem)
    # a wrong onto_slot_1 is named first, whatever the second answer
    assert checks.bytes_onto_slot_1(P, model, CPU, "clone", 2 * (P + B)).problem == "buffers"


@pytest.mark.parametrize("strategy", ["clone", "broadcast"])
def test_bytes_onto_slot_1_names_which_of_the_two_numbers_is_wrong(strategy):
    """(P + B, P + B): onto_slot_1 is right and stays_on_slot_0 is not, and the message says which, with the
    number given; a wrong onto_slot_1 is named as the wrong one, and the second left for later."""
    model = make_model()
    P, B = costs.state_nbytes(model).values()
    change = checks.bytes_onto_slot_1(P + B, model, CPU, strategy, P + B).message.splitlines()[0]
    assert change.startswith(f"Not yet: onto_slot_1 is right; stays_on_slot_0, {P + B:,}, is wrong: "), change
    checks.reset()
    change = checks.bytes_onto_slot_1(P, model, CPU, strategy, P + B).message.splitlines()[0]
    assert change.startswith("Not yet: onto_slot_1 is wrong (stays_on_slot_0 is checked once"), change
    checks.reset()
    alone = checks.bytes_onto_slot_1(P, model, CPU, strategy).message.splitlines()[0]
    assert alone.startswith("Not yet: onto_slot_1 is wrong: ") and "stays_on_slot_0" not in alone


# ---------------------------------------------------------------- Exercise 5: buckets


def tensors():
    return [torch.randn(256) for _ in range(1024)]  # 1,024 tensors of 1 KiB, as in the chapter


@pytest.mark.parametrize("bucket", [4096, 1000, 3072])
def test_bucket_copies_passes_the_counted_answer(bucket):
    ts, per = tensors(), 1024
    fit = max(1, bucket // per)  # whole tensors per bucket, and at least one
    buckets = -(-len(ts) // fit)
    packed = [fit * per] * (len(ts) // fit) if fit > 1 else []  # every full bucket of two or more is packed
    if fit > 1 and len(ts) % fit > 1:
        packed.append(len(ts) % fit * per)
    sent = len(ts) * per
    verdict = checks.bucket_copies((buckets, buckets + len(packed), sent + sum(packed)), ts, CPU, bucket)
    assert verdict.ok, verdict.message


@pytest.mark.parametrize(
    "bucket, guess, problem",
    [
        (4096, (1024, 1024, 1024 * 1024), "per tensor + no pack"),  # copy_per_tensor's counts
        (4096, (256, 256, 1024 * 1024), "no pack"),  # the packs left out of the copies and the bytes
        (1000, (1049, 1049, 1024 * 1024), "split"),  # tensors cut to fill 1000-byte buckets
        (3072, (342, 684, 2 * 1024 * 1024), "one-tensor pack"),  # the last bucket, one tensor, packed too
        (4096, (7, 8, 9), "sent + copies + bytes"),
    ],
)
def test_bucket_copies_names_the_mistake(bucket, guess, problem):
    verdict = checks.bucket_copies(guess, tensors(), CPU, bucket)
    assert not verdict.ok and verdict.problem == problem and verdict.message.startswith("Not yet: ")


@pytest.mark.parametrize(
    "bucket, guess",
    [
        (3072, (342, 683, 2 * 1024 * 1024)),  # only the bytes wrong: the last bucket's bytes counted twice
        (3072, (342, 684, 2 * 1024 * 1024)),
        (4096, (256, 512, 1024 * 1024)),  # only the bytes wrong: the packs left out
        (4096, (1024, 1024, 1024 * 1024)),
        (1000, (1049, 1049, 1024 * 1024)),
        (4096, (7, 8, 9)),
    ],
)
def test_bucket_copies_says_what_to_change_in_whole_sentences(bucket, guess):
    """Each part that differs gets a sentence of its own that says what to change (count, add, leave
    out), and the parts already right are named: no clause that only continues another."""
    import re

    change = checks.bucket_copies(guess, tensors(), CPU, bucket).message.splitlines()[0]
    body = change.removeprefix("Not yet: ")
    sentences = re.split(r"(?<=\.) (?=[A-Z0-9])", body)
    assert change.startswith("Not yet: ") and body.endswith("."), change
    assert not re.match(r"(so|and|but|then)\b", body), change  # a fragment continues a sentence not shown
    assert all(re.search(r"\b(count|add|leave|right)\b", s, re.I) for s in sentences), sentences


def test_bucket_copies_names_the_parts_already_right():
    change = checks.bucket_copies((342, 683, 2 * 1024 * 1024), tensors(), CPU, 3072).message.splitlines()[0]
    assert change.startswith("Not yet: your sent and copies counts are right. Count the bytes"), change


def test_bucket_copies_asks_for_three_whole_numbers():
    assert "Write your prediction" in checks.bucket_copies(..., tensors(), CPU, 4096).message
    assert "three whole numbers" in checks.bucket_copies((1, 2), tensors(), CPU, 4096).message


# ---------------------------------------------------------------- Exercise 1: the hints


def test_step_copies_hints_name_their_kind_and_point_back_not_forward():
    """A slip's hint is labelled as that slip's; a count no slip explains climbs a labelled two-rung
    ladder. No hint sends the learner to a later exercise."""
    model, x, slots = make_model(), torch.randn(32, 64), ["cpu"] * 4
    slip = checks.step_copies(4 * 11 + 4, model, x, slots)  # broadcast's slot 0 counted as a copy
    assert slip.slips == ("slot 0",) and "Hint for this slip: " in slip.message
    assert "exercise" not in " ".join(slip.hints).lower()
    rungs = [checks.step_copies(40, model, x, slots).message for _ in range(2)]
    assert "Hint 1 of 2: " in rungs[0] and "Hint 2 of 2: " in rungs[1]


# ---------------------------------------------------------------- Exercise 4: the hint points back


def test_bytes_onto_slot_1_hint_points_at_the_cell_that_prints_p_plus_b():
    """Hint 2 sends the learner to where P + B is printed: the counting cell, whose first line gives it."""
    model = make_model()
    checks.bytes_onto_slot_1(12_345, model, CPU)
    second = checks.bytes_onto_slot_1(12_345, model, CPU).message
    assert "Hint 2 of 2" in second and "counting cell" in second and "first cell" not in second


# ---------------------------------------------------------------- Exercise 6: DataParallel beside DDP


def meta_model(hidden: int = 256, batchnorm: bool = True, device: str = "meta"):
    with torch.device(device):
        layers = [nn.Linear(64, hidden), *([nn.BatchNorm1d(hidden)] if batchnorm else []), nn.ReLU()]
        return nn.Sequential(*layers, nn.Linear(hidden, 10))


def rule(model, n):
    """The chapter's rule, from dpteach's own counters: replicate's copies onto n meta slots, then the
    gradients' sum into GPU 0; DDP's ring all-reduce per rank."""
    import dpteach

    with dpteach.comm.traffic() as t:
        dpteach.replicate(model, [torch.device("meta")] * n)
    P, B = costs.state_nbytes(model).values()
    assert t.bytes == (n - 1) * (P + B)  # the forward's model copies, as the chapter's table says
    return t.bytes + (n - 1) * P, 2 * (n - 1) / n * P, P, B


@pytest.mark.parametrize("n", [2, 3, 8])
@pytest.mark.parametrize("batchnorm", [True, False])
def test_dp_and_ddp_bytes_passes_the_rule_on_any_model_and_n(n, batchnorm):
    model = meta_model(batchnorm=batchnorm)
    dp, per_rank, P, B = rule(model, n)
    verdict = checks.dp_and_ddp_bytes(dp, per_rank, model, n)
    assert verdict.ok and f"{dp:,} bytes" in verdict.message and "modelled" in verdict.message
    assert ("broadcasts the buffers" in verdict.message) == bool(B)
    assert checks.dp_and_ddp_bytes(float(dp), round(per_rank), model, n).ok  # a float or rounded figure


def test_dp_and_ddp_bytes_counts_a_model_not_on_meta_on_a_copy():
    real = meta_model(device="cpu")
    dp, per_rank, *_ = rule(meta_model(), 4)
    before = {k: v.clone() for k, v in real.state_dict().items()}
    assert checks.dp_and_ddp_bytes(dp, per_rank, real, 4).ok
    assert all(not t.is_meta for t in real.parameters())  # the learner's model stays where it was
    assert all(torch.equal(before[k], v) for k, v in real.state_dict().items())


@pytest.mark.parametrize("batchnorm", [True, False])
def test_dp_and_ddp_bytes_names_each_slip(batchnorm):
    n, model = 8, meta_model(batchnorm=batchnorm)
    dp, per_rank, P, B = rule(model, n)
    forward = (n - 1) * (P + B)
    said = {
        (forward, per_rank): "dp half",  # the backward's gradients left out
        ((n - 1) * P, per_rank): "dp half",  # the forward's model copies left out
        (n * (P + B) + (n - 1) * P, per_rank): "dp slot 0",  # slot 0 given a model copy
        (n * (P + B) + n * P, per_rank): "dp slot 0",
        (dp, 2 * P): "ddp 2P",
        (dp, (n - 1) / n * P): "ddp one pass",
        (dp, n * per_rank): "ddp all ranks",
        (dp / 1e6, per_rank / 1e6): "megabytes + megabytes",
        (per_rank, dp): "swapped",
        (12_345, 678): "dp + ddp",
    }
    if B:  # with buffers: left out of DataParallel's copies, or counted into DDP's all-reduce
        said[((n - 1) * 2 * P, per_rank)] = "dp buffers"
        said[(dp, 2 * (n - 1) / n * (P + B))] = "ddp buffers"
        # rank 0's broadcast of the buffers before forward, (n - 1)·B, added to the all-reduce
        said[(dp, per_rank + (n - 1) * B)] = "ddp broadcast"
    for (dp_guess, ddp_guess), problem in said.items():
        checks.reset()
        verdict = checks.dp_and_ddp_bytes(dp_guess, ddp_guess, model, n)
        assert not verdict.ok and verdict.problem == problem, (dp_guess, ddp_guess, verdict.problem)
        change = verdict.message.splitlines()[0]
        assert change.startswith("Not yet: ") and change.endswith("."), change
        assert re.search(r"\b(count|add|give|leave)\b", change, re.I) or problem == "swapped", change


def test_dp_and_ddp_bytes_says_the_rule_leaves_the_gathered_output_out():
    """GPT-2's gathered output added to DataParallel's bytes (whole, or the pieces not on GPU 0, on N or on
    the chapter's 4 GPUs) is named: the rule leaves it out, and the cell that counts it is named by what
    it prints, which the chapter's gather cell does print. For another model nothing is guessed."""
    import nbformat

    from dpteach.measure import costmodel

    with torch.device("meta"):  # the chapter's GPT-2-sized stack
        gpt2 = nn.ModuleDict(
            {
                "tokens": nn.Embedding(50257, 768),
                "positions": nn.Embedding(1024, 768),
                "blocks": nn.ModuleList(
                    nn.TransformerEncoderLayer(768, 12, 3072, norm_first=True) for _ in range(12)
                ),
                "final_norm": nn.LayerNorm(768),
            }
        )
    n = 8
    dp, per_rank, *_ = rule(gpt2, n)
    work = costmodel.large_workload("gpt2-small").scaled(16)
    for added in ((n - 1) / n * work.output_bytes, work.output_bytes, 3 / 4 * work.output_bytes):
        checks.reset()
        verdict = checks.dp_and_ddp_bytes(dp + added, per_rank, gpt2, n)
        assert not verdict.ok and verdict.problem == "dp gather", verdict.problem
        change = verdict.message.splitlines()[0]
        assert "the rule leaves the output out" in change and "your ddp_per_rank is right" in change
        assert 'the cell that prints "the output DataParallel gathers" counts it' in change
    from pathlib import Path

    notebook = Path(__file__).resolve().parents[2] / "notebooks" / "06_the_cost_of_copies.ipynb"
    nb = nbformat.read(notebook, as_version=4)
    (cell,) = [c for c in nb.cells if "gather-bytes" in c.metadata.get("tags", [])]
    assert 'f"the output DataParallel gathers:' in cell.source  # the cell the message points at
    model = meta_model()  # not GPT-2: no output to recognise, the usual "too large"
    dp, per_rank, *_ = rule(model, n)
    assert checks.dp_and_ddp_bytes(dp + 1_000_000, per_rank, model, n).problem == "dp"


def test_dp_and_ddp_bytes_says_which_half_is_right_and_answers_last():
    model, n = meta_model(), 4
    dp, per_rank, *_ = rule(model, n)
    tries = [checks.dp_and_ddp_bytes(dp, 2 * per_rank, model, n) for _ in range(3)]
    assert all(v.message.startswith("Not yet: your dp_bytes is right.") for v in tries)
    assert ["Hint 1 of 2" in tries[0].message, "Hint 2 of 2" in tries[1].message] == [True, True]
    assert f"{per_rank:,.0f} bytes" not in tries[0].message + tries[1].message  # not before the third try
    assert "The answer" in tries[2].message and f"{per_rank:,.0f} bytes" in tries[2].message
    assert "Set dp_bytes" in checks.dp_and_ddp_bytes(..., per_rank, model, n).message
    assert "give dp_bytes as a number" in checks.dp_and_ddp_bytes("a lot", per_rank, model, n).message
    assert not checks.dp_and_ddp_bytes(True, per_rank, model, n).ok


@pytest.mark.parametrize("odd", ["yes", "no", 1, None])
def test_slot0_memory_takes_only_true_or_false(odd):
    """A truthy "yes" or 1 is not an answer, and "no" would read as True: each asks for True or False."""
    verdict = checks.slot0_memory({"broadcast": odd, "clone": False}, "model", make_model(), CPU)
    assert not verdict.ok and "Give True or False" in verdict.message and not verdict.problem
