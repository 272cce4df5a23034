"""Chapter 06's copy counts that repeat: clone-then-``.to`` on the tensor's own device and on another,
the predict-then-check exercise (``checks.step_copies``), and the printed figures of two runs.

Expected counts are derived from the model (its tensors, the slots), never copied from a run. Cells
are found by their tags; the set-up cell is the chapter's first ``hide-input`` cell.
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import nbformat
import pytest
import torch
from torch import nn

from dpteach.course import checks
from dpteach.exercises import task6_copy_once
from dpteach.measure import costmodel, costs

ROOT = Path(__file__).resolve().parents[2]
CELLS = nbformat.read(ROOT / "notebooks" / "06_the_cost_of_copies.ipynb", as_version=4).cells
DETAILS = re.compile(r"<details\b.*?</details>", re.S)


def tagged(tag: str):
    return next(c for c in CELLS if tag in c.metadata.get("tags", []))


def run(*tags: str) -> tuple[dict, str]:
    """The set-up cell and the cells with ``tags``, in one scope; what they printed."""
    scope: dict = {}
    out = io.StringIO()
    threads = torch.get_num_threads()  # the set-up cell sets one intra-op thread
    try:
        with contextlib.redirect_stdout(out):
            for tag in ("hide-input", *tags):
                exec(compile(tagged(tag).source, f"<{tag}>", "exec"), scope)
    finally:
        torch.set_num_threads(threads)
    return scope, out.getvalue()


def make_model():
    return nn.Sequential(
        nn.Linear(64, 256), nn.BatchNorm1d(256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)
    )


def test_count_copies_lives_in_costs_and_task_6_uses_it():
    assert task6_copy_once.CountCopies is costs.CountCopies  # one class, imported
    with costs.CountCopies() as counted:
        torch.ones(3).clone().to("meta")
    assert counted.copies == ["clone", "_to_copy"]


def test_clone_then_to_copies_twice_only_onto_another_device():
    """The chapter's cell: onto the tensor's own device the old line makes one copy (``.to`` hands the
    tensor back), onto "meta" (another device) two; ``.to`` alone none and one."""
    scope, printed = run("clone-then-to-counts")
    own = scope["devices"][0].type
    lines = [" ".join(line.split()) for line in printed.splitlines()[1:]]  # after the set-up's slots line
    assert lines == [
        f"onto {own} clone().to 1 copy ['clone']",
        f"onto {own} .to 0 copies [] (.to handed back the tensor itself)",
        "onto meta clone().to 2 copies ['clone', '_to_copy']",
        "onto meta .to 1 copy ['_to_copy']",
    ]


def test_every_sentence_that_says_twice_names_another_device():
    """ "Copied twice, clone() then .to()" holds only for a slot on another device: the chapter says so."""
    text = " ".join(DETAILS.sub(" ", c.source) for c in CELLS if c.cell_type == "markdown")
    sentences = [
        s for s in re.split(r"(?<=[.!?])\s+", " ".join(text.split())) if re.search(r"twice|two copies", s)
    ]
    assert sentences and all("another device" in s for s in sentences), sentences


@pytest.mark.parametrize("n", [2, 4])
def test_step_copies_knows_the_count_of_each_strategy(n):
    model, x = make_model(), torch.randn(32, 64)
    tensors = len(list(model.parameters())) + len(list(model.buffers()))  # 8 + 3
    slots = ["cpu"] * n
    assert checks.step_copies(
        (n - 1) * tensors + n, model, x, slots
    ).ok  # N - 1 model copies + N gathered pieces
    for strategy in ("clone", "rewire"):
        assert checks.step_copies(n * tensors + n, model, x, slots, strategy).ok  # slot 0 cloned too
    assert checks.step_copies(float(n * tensors + n), model, x, slots, "clone").ok  # 48.0 is a count


def test_step_copies_names_the_slip():
    """A wrong count is matched to the slips that give it, one or two at a time, derived from the model;
    what is asserted is the slip named (``CountVerdict.slips``), not the wording."""
    model, x, slots = make_model(), torch.randn(32, 64), ["cpu"] * 4
    P, T, n = 8, 11, 4  # parameters, tensors (8 + 3 buffers), slots
    nbytes = costs.step_traffic(make_model(), x, slots).bytes
    broadcast = {
        nbytes: ("bytes",),  # bytes for copies
        (n - 1) * P + n: ("buffers",),  # the buffers left out
        (n - 1) * T: ("gather",),  # the gather left out
        (n - 1) * T + n - 1: ("gather slot 0",),  # slot 0's piece left out
        n * T + n: ("slot 0",),  # broadcast's slot 0 copied
        n * T: ("slot 0", "gather"),  # 44: slot 0 copied and the gather forgotten
        n * T + n - 1: ("slot 0", "gather slot 0"),  # 47
        (n - 1) * T + 1: ("gather once",),  # 34: the gather counted as one copy, not one per slot
        n * T + 1: ("slot 0", "gather once"),  # 45
        n - 1: ("per model", "gather"),  # 3: model copies counted, not their tensors
        n - 1 + n: ("per model",),  # 7: one copy per model copy, and the gather
        (n - 1) * (T - 5) + n: ("batchnorm",),  # 22: the BatchNorm's 5 tensors (or the 6 layers) counted out
        12: (),  # no slip gives it
    }
    clone = {
        (n - 1) * T + n: ("slot 0",),
        n * T: ("gather",),
        (n - 1) * T: ("slot 0", "gather"),
        n + n: ("per model",),  # 8
        n * (T - 5) + n: ("batchnorm",),  # 28
    }
    for strategy, said in (("broadcast", broadcast), ("clone", clone)):
        for guess, slips in said.items():
            checks.reset()
            verdict = checks.step_copies(guess, model, x, slots, strategy)
            assert not verdict.ok and verdict.slips == slips, (strategy, guess, verdict.slips)


def test_step_copies_says_the_gather_is_one_copy_per_slot():
    """34 on 4 slots (3·11 + 1) is the gather taken for one copy: the message says how many it makes."""
    model, x, slots = make_model(), torch.randn(32, 64), ["cpu"] * 4
    checks.reset()
    verdict = checks.step_copies(3 * 11 + 1, model, x, slots)
    assert verdict.slips == ("gather once",) and "no usual slip" not in verdict.message
    assert (
        "one per slot" in verdict.message and "4 copies" in verdict.message
    )  # what to change, in the model's N
    two = checks.step_copies(
        11 + 1, model, x, ["cpu"] * 2
    )  # on 2 slots 1 piece is N - 1: slot 0's piece left out
    assert two.slips == ("gather slot 0",)


def test_step_copies_says_what_to_change_in_whole_sentences():
    """Every failure of the count check is whole sentences, one per slip, each saying what to change: the
    model copies counted instead of their tensors (3), the BatchNorm counted out (22), two slips at once."""
    model, x, slots = make_model(), torch.randn(32, 64), ["cpu"] * 4
    for guess in (3, 22, 44, 28, 33, 12):
        checks.reset()
        change = checks.step_copies(guess, model, x, slots).message.splitlines()[0]
        assert change.startswith("Not yet: ") and change.endswith(".") and "?" not in change, change
        assert "no usual slip" not in change or guess == 12
        assert re.search(r"\b(count|add|Add|Count)\b", change), change  # says what to change
    checks.reset()
    assert "11" in checks.step_copies(3, model, x, slots).message  # the tensors per model copy, named
    assert "BatchNorm" in checks.step_copies(22, model, x, slots).message


def test_step_copies_hints_at_the_slip_made_whatever_came_before():
    """Each wrong count gets the hint for its own slip: the same slip the same hint on any try, another
    slip another hint (a hint counter shared by all tries gave the gather slip the buffers hint)."""
    model, x, slots = make_model(), torch.randn(32, 64), ["cpu"] * 4
    P, T, n = 8, 11, 4
    gather, buffers = (n - 1) * T, (n - 1) * P + n  # 33: the gather left out; 28: the buffers left out
    checks.reset()
    fresh = {guess: checks.step_copies(guess, model, x, slots) for guess in (gather, buffers)}
    checks.reset()
    tries = [checks.step_copies(guess, model, x, slots) for guess in (buffers, gather, buffers, gather)]
    assert [v.slips for v in tries] == [("buffers",), ("gather",)] * 2
    assert all(v.hints == fresh[g].hints for v, g in zip(tries, (buffers, gather) * 2))  # history-free
    assert len(fresh[gather].hints) == 1 and fresh[gather].hints != fresh[buffers].hints
    assert all(h in v.message for v in tries for h in v.hints)  # the hints found are the hints shown
    checks.reset()
    both = checks.step_copies(n * T, model, x, slots)  # 44: slot 0 copied and the gather forgotten
    assert both.slips == ("slot 0", "gather") and len(set(both.hints)) == 2  # a hint for each slip
    assert fresh[gather].hints[0] in both.hints


def test_step_copies_offers_the_answer_from_the_third_try_and_shows_it_only_when_asked():
    checks.reset()
    model, x, slots = make_model(), torch.randn(32, 64), ["cpu"] * 4
    tensors, n = 11, 4
    truth = (n - 1) * tensors + n  # 37
    before = {k: v.clone() for k, v in model.state_dict().items()}
    tries = [checks.step_copies(40, model, x, slots) for _ in range(4)]  # 40: no usual slip gives it
    assert [v.offers_answer for v in tries] == [False, False, True, True]
    assert not any(v.ok or v.shows_answer or str(truth) in v.message for v in tries)  # never unasked
    assert tries[0].slips == () and tries[0].hints != tries[1].hints  # no slip: the ladder climbs
    shown = checks.step_copies(..., model, x, slots, show_answer=True)
    assert shown.shows_answer and not shown.ok and f"{truth} copies" in shown.message
    assert f"{n - 1} model copies × {tensors} tensors + {n} gathered pieces" in shown.message
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # BatchNorm's statistics too
    assert all(p.grad is None for p in model.parameters())  # the check stepped a copy
    assert checks.step_copies(truth, model, x, slots).ok
    assert not checks.step_copies(40, model, x, slots).offers_answer  # a right answer starts again
    assert "Write your prediction" in checks.step_copies(..., model, x, slots).message
    assert (
        not checks.step_copies("37", model, x, slots).ok and not checks.step_copies(True, model, x, slots).ok
    )


def test_the_exercise_predicts_then_checks_with_a_worked_answer():
    cells = list(CELLS)
    start = next(i for i, c in enumerate(cells) if c.source.startswith("## Exercises"))
    check = tagged("predict-copies")
    at = cells.index(check)
    assert start < at and "**Predict, then check.**" in cells[start].source
    assert "prediction = ..." in check.source and "checks.step_copies(" in check.source
    scope, _ = run("step-bytes")
    *body, last = check.source.strip().splitlines()
    exec("\n".join(body), scope)
    assert "Write your prediction" in repr(eval(last, scope))  # the cell runs with the prediction left open
    answer = re.search(r"<summary>Answer 1</summary>(.*?)</details>", cells[at + 1].source, re.S)[1]
    model, n = scope["model"], 4
    tensors = len(list(model.parameters())) + len(list(model.buffers()))
    assert f"{(n - 1) * tensors + n} in all" in answer and f"= {n * tensors + n}" in answer


def test_the_counting_cells_print_the_same_twice():
    tags = ("step-bytes", "replicate-counts", "model-your-size", "clone-then-to-counts", "coalesce-counts")
    _, first = run(*tags)
    _, second = run(*tags)
    assert first == second and "copies" in first


def test_every_exercise_has_its_own_cell_then_its_own_answer():
    """Exercises 2-6: the item, a starter cell under it, then its Answer block, in that order."""
    cells = list(CELLS)
    for n in range(2, 7):
        at = next(
            i for i, c in enumerate(cells) if re.search(rf"^(\*\*)?{n}\. ", DETAILS.sub("", c.source), re.M)
        )
        assert cells[at + 1].cell_type == "code", n
        assert f"<summary>Answer {n}</summary>" in cells[at + 2].source, n


def test_the_starter_cells_run_as_given_and_completed_print_the_answers():
    """Exercises 2-6 start from a cell that runs with its ``...`` left open and then prints what to
    fill in; filled in as the answers say, they print what the answers claim (derived here from the
    model and the tensors)."""
    stubs = [c.source for c in CELLS if "exercise-stub" in c.metadata.get("tags", [])]
    two, three, four, five, six = stubs
    # a replica has no parameters(): the stub says how to reach the weight, but not what to compare
    assert "replica[0].weight" in three and "data_ptr()" not in three
    assert "c.dst ==" not in four and "whose dst" not in four  # the starter asks; the hints answer
    scope, _ = run("step-bytes", "coalesce-counts", "model-your-size")
    for stub in stubs:  # as shipped: no error, and a prompt printed, not a bare Ellipsis or nothing
        scope.pop("checks", None)  # each cell imports the checks it calls, so it runs on its own
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(stub, scope)
        assert out.getvalue().strip() and "Ellipsis" not in out.getvalue(), stub.splitlines()[0]
    tensors = scope["tensors"]  # 1 KiB each: a 4 KiB bucket holds four, packed, then sent
    per_bucket = 4096 // tensors[0].nbytes
    buckets, sent = len(tensors) // per_bucket, sum(t.nbytes for t in tensors)
    filled = {
        two: [
            ("ratio = ...", "ratio = 3.5"),
            ("predicted = ...", "predicted = (len(devices) - 1) * sum(costs.state_nbytes(wide).values())"),
        ],
        three: [
            (
                "shared[strategy] = ...",
                "shared[strategy] = replica[0].weight.data_ptr() == model[0].weight.data_ptr()",
            ),
            ("lands_in = ...", 'lands_in = "model"'),
        ],
        four: [
            ("onto_slot_1 = ...", "onto_slot_1 = sum(c.nbytes for c in t.copies if c.dst == meta)"),
            ("stays_on_slot_0 = ...", "stays_on_slot_0 = sum(c.nbytes for c in t.copies if c.dst != meta)"),
        ],
        five: [("predicted = ...", f"predicted = ({buckets}, {2 * buckets}, {2 * sent})")],
        six: [
            ("dp_bytes = ...", "dp_bytes = (N - 1) * (P_mine + B_mine) + (N - 1) * P_mine"),
            ("ddp_per_rank = ...", "ddp_per_rank = 2 * (N - 1) / N * P_mine"),
        ],
    }
    printed = {}
    for stub, fills in filled.items():
        done = stub
        for blank, answer in fills:
            assert blank in stub
            done = done.replace(blank, answer)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(done, scope)
        printed[stub] = out.getvalue()
    assert all("Correct!" in p for p in printed.values()), printed  # each completed cell's check passes
    assert "checks.width_ratio(" in two and printed[two].startswith("Correct! 3.52 times")  # about 3.5
    assert "int64" not in two  # the stub leaves the counter for the check to catch
    assert "checks.model_copy_bytes(" in two and printed[two].count("Correct!") == 2  # (N - 1)(P + B) alone
    wide = scope["wide"]
    assert f"{(len(scope['devices']) - 1) * sum(costs.state_nbytes(wide).values()):,} bytes" in printed[two]
    assert "'broadcast' the model's own tensors, 'clone' memory of its own" in printed[three]
    assert f"{scope['P'] + scope['B']:,} bytes" in printed[four]  # (N - 1)(P + B) with N = 2
    assert f"{2 * (scope['P'] + scope['B']):,} bytes stay on devices[0]" in printed[four]  # both clones
    assert f"{buckets} sent, {2 * buckets} copies, {2 * sent:,} bytes" in printed[five]
    gpt2 = costs.state_nbytes(scope["gpt2_sized"])["parameters"]
    n = 8  # the stub's N; the stack has no buffers
    assert (
        f"{(n - 1) * 2 * gpt2:,} bytes" in printed[six]
        and f"{2 * (n - 1) * gpt2 // n:,} bytes" in printed[six]
    )
    answer6 = re.search(
        r"<summary>Answer 6</summary>(.*?)</details>", "\n".join(c.source for c in CELLS), re.S
    )[1]
    answer6 = " ".join(answer6.split())
    assert (
        f"dp_bytes = {(n - 1) * 2 * gpt2:_}" in answer6
        and f"ddp_per_rank = {2 * (n - 1) * gpt2 // n:_}" in answer6
    )
    assert f"7·{gpt2:,} = {(n - 1) * gpt2:,} bytes" in answer6


def test_the_clone_then_to_section_rests_on_counts_and_gives_one_modelled_bound():
    """The section's cells count; no cell times or models. Its main path states no modelled share: the
    Going-deeper block gives the most the extra clone adds to the .to's time between GPUs (a third: no
    profile, on all its links or fewer, goes above it), and derives it (a clone reads and writes
    at mem_bw, the .to crosses the link once): the range over the GPU profiles with the two bandwidths of
    each end, and two V100s joined by one link, all derived here from gpus.json and the cost model."""
    import json

    assert not any(
        tag in c.metadata.get("tags", []) for c in CELLS for tag in ("copy-timings", "clone-over-to")
    )
    code = "\n".join(c.source for c in CELLS if c.cell_type == "code")
    assert "clone_then_to" not in code and "plot_timings" not in code and "time_in_turns" not in code
    assert "clone_over_to" not in code  # the modelled share is an aside, not a main-path cell
    at = CELLS.index(tagged("clone-then-to-counts"))
    after = CELLS[at + 1]
    main = " ".join(DETAILS.sub(" ", after.source).split())
    assert "another device the old line copies twice" in main
    assert "third" not in main and "Modelled" not in main  # the share is the fold's, with its derivation
    (fold,) = DETAILS.findall(after.source)
    fold = " ".join(fold.split())
    gpus = json.loads((ROOT / "dpteach" / "measure" / "data" / "gpus.json").read_text())["gpus"]
    profiles = [costmodel._gpu(name) for name in gpus]
    fewer = [g.with_links(k) for g in profiles if g.links for k in range(1, g.links + 1)]
    shares = [costmodel.clone_over_to(g) for g in profiles + fewer]
    assert max(shares) == pytest.approx(1 / 3)  # "at most a third", and a third is reached
    one_link = costmodel.clone_over_to(costmodel._gpu("V100-SXM2").with_links(1))
    assert f"Two V100s joined by one link (25 GB/s, `GPU.with_links(1)`) give {one_link:.3f}" in fold
    assert "all six of its NVLink links at once" in fold and "#20995's description" in fold
    assert "so a third is the most any profile reaches" in fold
    expected = sorted((2 * g["link_bw"] / g["mem_bw"], name) for name, g in gpus.items())
    for name, g in gpus.items():
        assert costmodel.clone_over_to(name) == 2 * g["link_bw"] / g["mem_bw"]
    (low, low_name), (high, high_name) = expected[0], expected[-1]
    assert "Modelled from spec-sheet numbers" in fold and "`2 × link bandwidth / memory bandwidth`" in fold
    # each number says where it comes from, as gpus.json records it: the page read, or worked out
    assert "records each with the page it was read from" in fold
    t4, v100 = gpus["T4"]["numbers"], gpus["V100-SXM2"]["numbers"]
    assert (
        "not a number read on a page" in t4["link_bw"]["read"] and "worked out, not read off a page" in fold
    )
    assert "T4 product brief" in t4["mem_bw"]["read"] and "(NVIDIA's T4 product brief)" in fold
    assert "nvidia.com/en-us/data-center/nvlink" in v100["link_bw"]["read"] and "NVIDIA's NVLink page" in fold
    assert 8e9 * 16 * 128 / 130 / 8 == pytest.approx(gpus["T4"]["link_bw"], rel=1e-3)  # PCIe 3.0, rounded
    assert (
        f"from {low:.3f} on a {low_name}" in fold and f"to {high:.3f} on a {high_name.split('-')[0]}" in fold
    )
    for name in (low_name, high_name):
        g = gpus[name]
        assert f"{g['link_bw'] / 1e9:g} GB/s over" in fold and f"{g['mem_bw'] / 1e9:g} GB/s" in fold
    assert g["link"].startswith("NVLink") and gpus[low_name]["link"].startswith("PCIe")
    ratios = {name: g["mem_bw"] / g["link_bw"] for name, g in gpus.items()}
    smallest, largest = min(ratios, key=ratios.get), max(ratios, key=ratios.get)
    assert f"{ratios[smallest]:.3g} ({smallest.split('-')[0]}) to {ratios[largest]:.3g} ({largest})" in fold


def test_a_model_your_size_is_counted_on_meta():
    """The GPT-2-small-sized stack is built on "meta" (no memory): its parameters are GPT-2 small's.
    Both wrappers are counted by one rule, the bytes that cross a link: DataParallel's model
    copies counted (3·(P + B) on 4 slots) plus its gradient sum ((N - 1)·P), DDP's ring all-reduce
    2(N - 1)/N·P per rank, labelled modelled; the two totals are the same."""
    scope, printed = run("model-your-size")
    model = scope["gpt2_sized"]
    assert all(t.is_meta for t in [*model.parameters(), *model.buffers()])
    params = sum(p.numel() for p in model.parameters())
    assert params == 124_439_808  # GPT2LMHeadModel(GPT2Config()): its output layer shares the token embedding
    size = costs.state_nbytes(model)
    P, B, n = size["parameters"], size["buffers"], scope["N_gpt"]
    lines = printed.splitlines()[1:]  # after the set-up's slots line
    assert lines[0] == f"{params:,} parameters: P = {P / 1e6:,.1f} MB, and B = {B / 1e6:,.1f} MB of buffers"
    data_parallel = " ".join(" ".join(lines[1:3]).split())
    assert "each copy from or into GPU 0" in data_parallel  # the star dpteach counts, said as such
    assert f"it sends {(n - 1) * (P + B) / 1e6:,.1f} MB of model copies (counted)" in data_parallel
    assert f"and receives (N - 1)·P = {(n - 1) * P / 1e6:,.1f} MB of gradients" in data_parallel
    total = (n - 1) * (2 * P + B)
    assert data_parallel.endswith(f"; {total / 1e6:,.1f} MB in all")
    ddp = lines[3]
    assert (
        f"{total / 1e6:,.1f} MB in all, {2 * (n - 1) / n * P / 1e6:,.1f} MB from each rank, and as much"
        in ddp
    )
    assert "(modelled: ring all-reduce)" in ddp


def test_the_gathered_output_is_counted_beside_the_model_and_no_time_is_modelled_here():
    """What the one rule leaves out, DataParallel's gather of every output onto GPU 0, is counted from
    the shipped GPT-2 small workload: its logits and its keys and values, summed to the workload's
    output bytes, beside the model's. The prose after it states the ratios the printed figures give,
    says why the keys and values come back, and sends the whole step's time to chapter 08: no cell of
    this chapter calls the cost model itself; the one figure of modelled time (tested below) draws
    the moves alone, labelled, and leaves the compute to chapter 08."""
    scope, printed = run("model-your-size", "gather-bytes")
    work = scope["work"]
    assert work == costmodel.large_workload("gpt2-small").scaled(16)
    seqs = work.batch
    logits = seqs * 1024 * 50257 * 4  # fp32, a score per token per position
    cache = 12 * 2 * seqs * 12 * 1024 * 64 * 4  # 12 layers' keys and values, 12 heads of 64
    gathered = next(ln for ln in printed.splitlines() if ln.startswith("the output DataParallel gathers"))
    assert f"logits {logits / 1e9:.1f} GB and keys and values {cache / 1e9:.1f} GB" in gathered
    assert f"the model's parameters: {work.param_bytes / 1e9:.2f} GB" in gathered
    at = next(i for i, c in enumerate(CELLS) if "gather-bytes" in c.metadata.get("tags", []))
    why = " ".join(CELLS[at + 1].source.split())
    assert "gather-why" in CELLS[at + 1].metadata.get("tags", [])
    assert round(work.output_bytes / work.param_bytes) == 9 and "nine times the model's bytes" in why
    assert (
        6.5 < logits / work.param_bytes < 7
        and "the logits alone still weigh over six and a half times" in why
    )
    assert "`use_cache` on" in why and "[Chapter 08](08_real_gpus.ipynb)" in why
    # on the cell's N GPUs all but GPU 0's own piece crosses into GPU 0: more than the model traffic
    n, P, B = scope["N_gpt"], scope["P_gpt"], scope["B_gpt"]
    into_gpu0, model_traffic = (n - 1) / n * work.output_bytes, (n - 1) * (2 * P + B)
    assert into_gpu0 > model_traffic
    assert (
        f"on {n} GPUs {into_gpu0 / 1e9:.1f} GB of it crosses into GPU 0, against the "
        f"{model_traffic / 1e9:.1f} GB of model copies and gradients above" in printed
    )
    assert f"On {n} GPUs the ¾ of it that crosses into GPU 0 outweighs the model copies and gradients" in why
    assert "it grows with the batch; `P` does not" in why
    code = "\n".join(c.source for c in CELLS if c.cell_type == "code")
    assert "costmodel.predict" not in code  # time is chapter 08's: here bytes only
    before = " ".join(CELLS[at - 1].source.split())
    assert "It gathers every output onto GPU 0, which the rule leaves out" in before
    assert "`GPT2LMHeadModel`" in before


def test_the_meta_pair_says_why_broadcast_sends_three_buckets():
    """After the meta pair's counts, the main path says why 11 tensors travel in 3 copies: one dtype a
    bucket, parameters and buffers broadcast apart (derived here from the model's tensors)."""
    scope, printed = run("step-bytes", "meta-counts")
    model = scope["model"]
    kinds = {("param", p.dtype) for p in model.parameters()} | {("buffer", b.dtype) for b in model.buffers()}
    sent = int(re.search(r"broadcast\s+(\d+) copies cross devices", printed)[1])
    assert sent == len(kinds) == 3
    at = next(i for i, c in enumerate(CELLS) if "meta-counts" in c.metadata.get("tags", []))
    after = DETAILS.sub(" ", CELLS[at + 1].source)
    assert CELLS[at + 1].cell_type == "markdown" and f"{sent} copies" in after and "one dtype" in after
    # the gap between "pack" and "broadcast": the int64 counter, a bucket of one tensor, sent unpacked
    ops = eval(re.search(r"broadcast\s+\d+ copies cross.*?(\{.*\})", printed)[1])
    counter = sum(b.nbytes for n, b in model.named_buffers() if n.endswith("num_batches_tracked"))
    assert ops["broadcast"] - ops["pack"] == counter == 8
    after = " ".join(after.split())
    assert "travels unpacked" in after and f"`pack` is {counter} bytes short of `broadcast`" in after


def test_the_gpt2_sized_stack_has_gpt2_smalls_parameters():
    """Where transformers is installed, the stack's parameter count and shapes match GPT-2 small's."""
    transformers = pytest.importorskip("transformers")
    scope, _ = run("model-your-size")
    with torch.device("meta"):
        lm = transformers.GPT2LMHeadModel(transformers.GPT2Config())
    ours = sorted(p.numel() for p in scope["gpt2_sized"].parameters())
    theirs = sorted(p.numel() for p in lm.parameters())
    assert ours == theirs


def test_the_main_path_names_no_pull_request_and_says_why_the_copies_matter():
    """History (PR and issue numbers) sits in the Going-deeper blocks; the main path says once why the
    copies matter in practice, DataParallel's per step against DDP's once, and links chapter 08."""
    main = [DETAILS.sub(" ", c.source) for c in CELLS if c.cell_type == "markdown"]
    found = [n for m in main for n in re.findall(r"#\d{4,}", m)]
    assert not found, found
    text = " ".join(" ".join(main).split())
    assert "every slot but the first (which shares the model's storage), every step" in text
    assert "DistributedDataParallel copies the parameters once, at construction" in text
    assert "(08_real_gpus.ipynb)" in text


def test_2n_minus_1_is_stated_where_it_is_counted():
    """The main path first names 2N − 1 in the table the meta pair counts, never ahead of it."""
    at = next(i for i, c in enumerate(CELLS) if "meta-counts" in c.metadata.get("tags", []))
    assert "2N − 1" in DETAILS.sub(" ", CELLS[at - 1].source)
    first = next(
        i for i, c in enumerate(CELLS) if c.cell_type == "markdown" and "2N − 1" in DETAILS.sub(" ", c.source)
    )
    assert first == at - 1, first


def test_the_rule_names_ddps_buffer_broadcast_as_torch_decides_it():
    """The rule's bullets count DDP's buffer broadcast, (N - 1)·B, under forward_sync_buffers=True, and
    the cell adds it. The installed torch does so: before forward, when the model has buffers and
    forward_sync_buffers (which replaces broadcast_buffers in the forward, not at construction) is on,
    and only after a forward that synced gradients; the fold above says each condition, and that the
    constructor's broadcast is skipped under init_sync=False."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel as DDP

    at = CELLS.index(tagged("model-your-size"))
    rule = " ".join(DETAILS.sub(" ", CELLS[at - 1].source).split())
    assert "DDP's buffer broadcast from rank 0 before each forward, `(N − 1)·B`" in rule
    assert "under `forward_sync_buffers=True`, the default" in rule
    assert "(N_gpt - 1) * B_gpt" in CELLS[at].source
    will = " ".join(inspect.getsource(DDP.will_sync_module_buffers).split())
    assert "self.require_forward_param_sync and self.forward_sync_buffers" in will
    assert "len(self.modules_buffers) > 0" in will
    assert "self._sync_buffers()" in inspect.getsource(DDP._pre_forward)
    assert "return self.forward_sync_buffers" in inspect.getsource(DDP.broadcast_buffers.fget)
    post = " ".join(inspect.getsource(DDP._post_forward).split())
    assert (
        "if torch.is_grad_enabled() and self.require_backward_grad_sync: self.require_forward_param_sync = True"
        in post
    )
    fold = " ".join(DETAILS.findall(CELLS[at - 1].source)[0].split())  # under the rule's bullets
    init = " ".join(inspect.getsource(DDP.__init__).split())
    assert "if init_sync:" in init and "init_sync_buffers = True" in init  # the new flag spares the init sync
    # the deprecated broadcast_buffers still works, and its False also drops the buffers from the init sync
    assert "init_sync_buffers = effective_broadcast" in init and "broadcast_buffers=init_sync_buffers" in init
    assert "deprecated:: 2.13" in DDP.__doc__
    assert "deprecated in 2.13 but still accepted" in fold
    assert (
        "`broadcast_buffers=False` also leaves the buffers out of the sync at construction;"
        " `forward_sync_buffers=False` does not" in fold
    )
    for said in (
        "`forward_sync_buffers` is on",
        "it leaves the sync at construction alone",
        "unless `init_sync=False`",
        "`require_forward_param_sync`",
        "`no_sync()`",
        "`torch.no_grad()`",
    ):
        assert said in fold, said


def test_a_bucket_never_splits_a_tensor_as_the_fold_says():
    """torch's Python bucketing and dpteach's put a tensor over the limit in a bucket of its own; the
    section says "about 10 MiB", not "at most", and the fold says why."""
    from torch._utils import _take_tensors

    from dpteach import comm

    small, big = torch.zeros(256), torch.zeros(4096)  # 1 KiB, 16 KiB; a 4 KiB limit
    assert [len(b) for b in _take_tensors([small, big, small], 4096)] == [1, 1, 1]
    assert comm._buckets([small, big, small], 4096) == [[0], [1], [2]]
    text = CELLS[CELLS.index(tagged("coalesce-counts")) - 1].source
    assert "buckets of about 10 MiB" in " ".join(text.split()) and "at most" not in text
    fold = " ".join(DETAILS.findall(CELLS[CELLS.index(tagged("meta-counts")) + 1].source)[0].split())
    assert "None splits a tensor" in fold and "a tensor over 10 MiB makes a bucket over 10 MiB" in fold


def test_dp_beside_ddp_comes_after_the_copies_it_sums_up():
    """The section that sets DataParallel beside DDP rests on every count before it (the forward's
    model copies, clone-then-.to, coalescing, the meta pair): it is the last before the Summary."""
    at = {
        tag: CELLS.index(tagged(tag))
        for tag in (
            "step-bytes",
            "clone-then-to-counts",
            "coalesce-counts",
            "meta-counts",
            "model-your-size",
            "gather-why",
        )
    }
    summary = next(i for i, c in enumerate(CELLS) if c.source.startswith("## Summary"))
    assert at["step-bytes"] < at["clone-then-to-counts"] < at["coalesce-counts"] < at["meta-counts"]
    assert at["meta-counts"] < at["model-your-size"] < at["gather-why"] < summary
    # then the figure of those moves between distinct GPUs, and its answer, just before the Summary
    assert CELLS.index(tagged("between-gpus")) == at["gather-why"] + 1 == summary - 2
    assert CELLS.index(tagged("between-gpus-answer")) == summary - 1
    heading = CELLS[at["model-your-size"] - 1].source
    assert heading.startswith("## On a model your size") and "the table's `(N − 1)·(P + B)`" in heading


def test_the_overlap_quote_is_on_the_main_path_and_is_torchs():
    """The Summary's "only DDP's can overlap backward" rests on DDP's docstring, quoted on the main path
    after "beside backward", word for word as the installed torch has it."""
    from torch.nn.parallel import distributed

    at = CELLS.index(tagged("model-your-size"))
    main = " ".join(DETAILS.sub(" ", CELLS[at + 1].source).split())
    quote = re.search(
        r'gradient sum waits for every gradient: .*? DDP buckets its gradients "([^"]+)"', main
    )[1]
    docstring = " ".join(distributed.DistributedDataParallel.__doc__.split())
    assert quote in docstring and "overlap with backward computation" in quote
    (fold,) = [d for d in DETAILS.findall(CELLS[at + 1].source) if "count_gpt2" in d]
    assert "overlap" not in fold  # the fold is about the workload only


def test_the_meta_pair_shows_the_table_and_the_summary_on_any_machine():
    """The main path's stand-in for "between devices": replicate onto devices[0] and "meta" (N = 2)
    counts 2N - 1 model copies for clone and rewire and N - 1 for broadcast, the table's forward column
    and the summary's counts, printed beside the table's formula; broadcast in fewer copies than
    tensors (its buckets), packed first."""
    scope, printed = run("step-bytes", "meta-counts")
    model = scope["model"]
    n, tensors = 2, len(list(model.parameters())) + len(list(model.buffers()))
    size = sum(costs.state_nbytes(model).values())
    rows = {line.split()[0]: line for line in printed.splitlines() if " counted " in line}
    for strategy, copies in (("clone", 2 * n - 1), ("rewire", 2 * n - 1), ("broadcast", n - 1)):
        row = " ".join(rows[strategy].split())
        assert f"counted {copies * size:,} bytes" in row  # what traffic() counted ...
        assert f"table: {copies}·(P + B) = {copies * size:,}" in row  # ... beside the table's formula
    # clone: one copy a tensor crosses to slot 1, after two local clones of every tensor
    stays = f"{tensors} copies cross devices, {2 * tensors} stay on {scope['devices'][0]}"
    assert stays in " ".join(rows["clone"].split())
    sent = int(re.search(r"(\d+) copies cross devices", rows["broadcast"])[1])
    assert sent < tensors and "'pack'" in rows["broadcast"]
    summary = next(c.source for c in CELLS if c.source.startswith("## Summary"))
    assert "2N − 1" in summary and '"meta"' in summary
    # the table: a row per strategy, its forward formula the one the cell counts
    table = CELLS[CELLS.index(tagged("meta-counts")) - 1].source
    main = DETAILS.sub(" ", table)
    assert main.count('\n| `"') == 3 and "(2N − 1)·(P + B)" in main and "(N − 1)·(P + B)" in main
    assert "(clone, then `.to`)" in main  # the clone row's 2N - 1 points back to the section that counts it
    after = DETAILS.sub(" ", CELLS[CELLS.index(tagged("meta-counts")) + 1].source)
    assert "num_batches_tracked" in after  # the counter that travels unpacked, named on the main path once
    assert "num_batches_tracked" not in table


def test_the_meta_pair_says_what_a_gpu_would_add_when_there_is_none():
    """On a machine without CUDA the cell's GPU branch prints one line saying it was skipped and what it
    would have counted; with a GPU it prints a step per strategy."""
    _, printed = run("step-bytes", "meta-counts")
    if torch.cuda.is_available():
        assert sum(line.startswith("step on cuda:0 and cpu") for line in printed.splitlines()) == 3
    else:
        assert "no CUDA GPU here: skipped a step over cuda:0 and a CPU slot" in printed
        assert "reduce_add" in printed.splitlines()[-1]


def test_meta_is_explained_where_it_is_first_used():
    """The first markdown cell that names "meta" says what a meta tensor is and why copies onto it count;
    the same cell says that dpteach's clone and rewire still clone, then .to, and that torch dropped
    the clone (the pull request in the fold below it, not on the main path)."""
    at = next(
        i for i, c in enumerate(CELLS) if c.cell_type == "markdown" and '"meta"' in DETAILS.sub(" ", c.source)
    )
    assert at < CELLS.index(tagged("clone-then-to-counts"))
    text = " ".join(CELLS[at].source.split())
    assert "a shape and a dtype but no data" in text and "stands in for a second GPU" in text
    assert 'dpteach\'s `"clone"` and `"rewire"` copy as the 2019 C++ code did' in text
    assert "torch later dropped the clone" in text
    fold = " ".join(CELLS[CELLS.index(tagged("clone-then-to-counts")) + 1].source.split())
    assert "mrshenli's PR #20995 dropped the clone; torch 2.13's `cloneable.h` shows the result" in fold
    # CountCopies, the counter the next cell uses, is introduced here, beside traffic(), before that cell
    first = next(i for i, c in enumerate(CELLS) if "CountCopies" in c.source)
    assert first == at and CELLS[at + 1] is tagged("clone-then-to-counts")
    assert "`costs.CountCopies` lists every copy torch runs; `traffic()` records only dpteach's" in text
    with costs.CountCopies() as counted:  # .to("meta") runs a copy, so it is counted as one onto a GPU
        torch.ones(3).to("meta")
    assert counted.copies == ["_to_copy"]


def test_one_device_backward_copies_nothing_and_the_text_says_why():
    """On one device backward's gradient sums are adds: the step records no reduce_add. The text says so
    and names what the sums move between GPUs, (N - 1)·P, for the two strategies whose replicas have
    edges to the model."""
    scope, _ = run("step-bytes")
    if len({torch.device(d) for d in scope["devices"]}) == 1:
        assert all("reduce_add" not in t.by_op() for t in scope["traffic"].values())
    text = " ".join(DETAILS.sub(" ", CELLS[CELLS.index(tagged("step-bytes")) + 1].source).split())
    assert "Backward copied nothing" in text and "an add, not a copy" in text
    assert '`"rewire"` and `"broadcast"` sum them into GPU 0, `(N − 1)·P`' in text
    summary = next(c.source for c in CELLS if c.source.startswith("## Summary"))
    assert "none in backward" in " ".join(summary.split())


def test_the_scaling_lesson_is_on_the_main_path_with_the_counted_numbers():
    """Where the two wrappers are set side by side the text compares like with like: what GPU 0 sends
    (and receives as much) when every copy starts or ends there, against what each DDP rank sends (and
    receives as much), on the cell's N GPUs, in bytes and in P, as the counts give them. It then says
    plainly that on real GPUs NCCL pipelines the broadcast and the reduce round a ring (NCCL's
    broadcast.h and reduce.h), so GPU 0 sends about P a step at any N, and that torch's DataParallel
    hands its copies and sums to NCCL (torch/nn/parallel/comm.py's reduce_add calls nccl.reduce); then
    the takeaway: the same bytes in all, and three differences, one a bullet: the model copied every
    step, which each replica's forward waits for, a gradient sum that waits for every gradient (torch's DataParallel has one
    Broadcast node for all its parameters), and the gather onto GPU 0. The Summary says the same and
    leaves the star out."""
    import importlib
    import inspect

    replicate = importlib.import_module("torch.nn.parallel.replicate")  # the module, not its function

    scope, printed = run("model-your-size")
    n, P = scope["N_gpt"], scope["P_gpt"]
    assert scope["B_gpt"] == 0  # so (N - 1)·(2P + B) is (N - 1)·2P
    total, gpu0, rank = (n - 1) * 2 * P, (n - 1) * P, 2 * (n - 1) / n * P
    assert f"{total / 1e6:,.1f} MB in all" in printed and f"{rank / 1e6:,.1f} MB from each rank" in printed
    assert f"it sends {gpu0 / 1e6:,.1f} MB" in printed
    at = CELLS.index(tagged("model-your-size"))
    source = DETAILS.sub(" ", CELLS[at + 1].source)
    text = " ".join(source.split())
    # the same bytes only with the gather left out, as the rule leaves it out
    assert text.startswith("Gather aside, the two move the same bytes in all, `(N − 1)·(2P + B)`.")
    assert f"Each DDP rank sends {rank / 1e6:,.1f} MB, `{2 * (n - 1) / n:g}·P`, and receives as much" in text
    # the two accounts of GPU 0's traffic, which path of torch each is, and which panel draws it
    assert f"| copy by copy | {gpu0 / 1e6:,.1f} MB, `{n - 1}·P` | without NCCL | left: bytes |" in text
    assert "| NCCL's ring | about `P` at any `N` | with NCCL | right: time, modelled |" in text
    assert "nccl.reduce(inputs" in inspect.getsource(importlib.import_module("torch.nn.parallel.comm"))
    (ring,) = [" ".join(d.split()) for d in DETAILS.findall(CELLS[at + 1].source) if "NCCL's ring" in d]
    assert "https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md" in ring
    assert "sends or receives all `S` bytes once, at any `n`, so it takes at best `S/B`" in ring
    assert "`_broadcast_out_impl` in `torch/csrc/cuda/comm.cpp`" in ring and "`nccl.reduce`" in ring
    assert "accounting view" not in text and not re.search(r"\bstar\b", text)
    assert "Three things set the wrappers apart:" in text
    bullets = [" ".join(b.split()) for b in re.findall(r"^\* (.*?)(?=^\* |^\s*$|\Z)", source, re.S | re.M)]
    assert len(bullets) == 3, bullets
    assert bullets[0] == (
        "DataParallel copies the model every step, and no replica's forward can start before its copy has arrived."
    )
    assert bullets[1].startswith(
        "Python `nn.DataParallel`'s gradient sum waits for every gradient: one `Broadcast` node takes them all"
    )
    # C++ DataParallel after #20910: one ReduceAdd per parameter, each its own node
    assert (
        "C++'s fixed DataParallel gives each parameter a `ReduceAdd`, run once its gradients exist"
        in bullets[1]
    )
    header = Path(torch.__file__).parent / "include/torch/csrc/api/include/torch/nn/parallel/data_parallel.h"
    cpp = " ".join(header.read_text().split())
    assert (
        "for (auto& parameter : module->named_parameters(/*recurse=*/false)) { auto grad_fn = "
        "c10::make_intrusive<ReduceAdd>((*parameter).device());" in cpp
    )
    assert bullets[2].startswith("It gathers every output onto GPU 0") and "scattered batch" in bullets[2]
    # torch's replicate broadcasts all the parameters in one Broadcast call: one node, whose backward
    # needs every replica's gradient of every parameter
    body = inspect.getsource(replicate.replicate)
    assert body.count("_broadcast_coalesced_reshape(params, devices, detach)") == 1
    assert "Broadcast.apply(devices, *tensors)" in inspect.getsource(replicate._broadcast_coalesced_reshape)
    summary = " ".join(next(c.source for c in CELLS if c.source.startswith("## Summary")).split())
    assert "DataParallel moves as many model and gradient bytes as DDP" in summary
    for said in (
        "a model copy every step",
        "a gradient sum that cannot overlap backward (Python `nn.DataParallel`)",
        "every output gathered onto GPU 0",
    ):
        assert said in summary, said
    assert "star" not in summary and "`3·P`" not in summary


def test_the_explorer_text_names_the_model_it_steps():
    """The explorer's model is not the chapter's: the text gives its shape and, at the width the cell
    opens with, its parameters, its (absent) buffers and its gather, as the lab counts them."""
    from dpteach.widgets import CostLab
    from dpteach.widgets.cost import wide_model

    at = next(i for i, c in enumerate(CELLS) if c.source.startswith("## Try it yourself"))
    text, code = " ".join(CELLS[at].source.split()), CELLS[at + 1].source
    width = int(re.search(r"width=(\d+)", code)[1])
    lab = CostLab(width=width, slots=2, strategies=("broadcast",), max_repeats=1)
    lab.measure()
    (cost,) = lab.costs
    model = wide_model(width)
    params = sum(p.numel() for p in model.parameters())
    assert not list(model.buffers())
    assert f"width {width}" in text and f"{params:,} parameters" in text and "no buffer bytes" in text
    assert f"{cost.bytes_by_op['gather']:,} bytes" in text and "wider" not in text
    assert cost.bytes_by_op["broadcast"] == 4 * params  # one model copy: parameters only, no buffers
    # the answer names the first slider width whose gather is under 1% of broadcast's bytes
    from dpteach.widgets.cost import WIDTHS, width_numel

    first = next(w for w in WIDTHS if cost.bytes_by_op["gather"] < 0.01 * (4 * width_numel(w) + 1024))
    answer = " ".join(CELLS[at + 2].source.split())
    assert "<summary>Answer</summary>" in answer and f"So {first} is the first width under 1%" in answer
    # the question fixes the slots the answer counts (1 slot copies no model), as the cell opens with
    slots = int(re.search(r"slots=(\d+)", code)[1])
    assert f"Predict: on {slots} slots," in text and f"On {slots} slots," in answer
    assert "status()" not in code  # the headline once: the widget's own


def test_the_between_gpus_figure_stacks_each_move_counted_and_modelled_on_a_named_profile():
    """The figure after the gather's bytes: one DataParallel step of GPT-2 small between distinct GPUs,
    on 4 and 8. Left, each operation's bytes by the chapter's rule ((N - 1)·P of model copies and of
    gradients, summed to the bars) plus the gather's (N - 1)/N of the output; right, the time of the same
    moves from costmodel.predict on the profile the title names, every label saying "modelled". The
    legend has one key per operation, each naming it and what it moves, in the first figure's colours."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.close("all")
    scope, _ = run("model-your-size", "gather-bytes", "between-gpus")
    fig, work = scope["fig"], scope["work"]
    left, right = fig.axes
    assert [t.get_text() for t in left.get_xticklabels()] == ["N = 4", "N = 8"]
    for i, n in enumerate((4, 8)):
        stacked = sum(bar.patches[i].get_height() for bar in left.containers) * 1e9
        rule = 2 * (n - 1) * work.param_bytes  # the model copies and the gradients
        extra = (n - 1) / n * (work.input_bytes + work.output_bytes + work.output_grad_bytes)
        assert stacked == pytest.approx(rule + extra, rel=1e-9)
        pred = costmodel.predict(work, "A100-SXM", n)
        moves = sum(bar.patches[i].get_height() for bar in right.containers) * 1e-3
        compute = (pred.seconds("forward") + pred.seconds("backward")) / n
        threads = sum(p.seconds for p in pred.parts if p.name.startswith("start thread"))
        assert moves + compute + threads == pytest.approx(pred.total_s)  # the moves, the compute, the starts
    assert "modelled on A100-SXM" in right.get_title() and "modelled" in right.get_ylabel()
    texts = [t.get_text() for t in right.texts] + [t.get_text() for t in fig.texts]
    assert all("modelled" in t for t in texts), texts
    keys = [t.get_text() for t in fig.legends[0].get_texts()]
    ops = ["scatter", "broadcast", "gather", "scatter grad", "pack", "reduce_add"]
    assert [k.split(":")[0] for k in keys] == ops  # one key per operation, named first
    colours = [h.get_facecolor() for h in fig.legends[0].legend_handles]
    assert colours[1] == matplotlib.colors.to_rgba(costs.OP_COLOURS["broadcast"])  # the first figure's
    assert "scatter: the batch, cut into pieces (too thin to see)" in keys
    alt = tagged("between-gpus").metadata["mystnb"]["image"]["alt"]
    assert "modelled on an A100-SXM" in alt
    answer = " ".join(tagged("between-gpus-answer").source.split())
    assert answer.startswith("<details><summary>Answer</summary>") and "stay the same" in answer
    plt.close("all")


def test_the_first_figure_marks_one_model_dashed():
    """The first figure answers the opening prediction in model copies: a dashed line at one model's
    bytes, P + B, labelled with them; clone's bar is N of them plus the gather, broadcast's N - 1."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.close("all")
    scope, _ = run("step-bytes")
    ax = plt.gca()
    size = scope["P"] + scope["B"]
    (line,) = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
    assert set(line.get_ydata()) == {size / 1e3}
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[-1] == f"one model, P + B ({size / 1e3:,.1f} kB)"  # after the operations
    # one thing per key: each colour is an operation, named as one and said what it copies, never a
    # strategy's name alone (the bars are the strategies, on the x axis)
    assert ax.get_legend().get_title().get_text() == "colour: the copying operation"
    assert ax.get_xlabel().startswith("strategy")
    assert labels[:-1] == [
        costs.OP_WORDS[op] + ("\n(1.3 kB, too thin to see)" if op == "gather" else "")
        for op in ("broadcast", "clone", "gather")
    ]
    assert not set(labels) & {"clone", "rewire", "broadcast"}
    n, traffic = len(scope["devices"]), scope["traffic"]
    assert (
        traffic["clone"].by_op()["clone"] == n * size
        and traffic["broadcast"].by_op()["broadcast"] == (n - 1) * size
    )
    alt = tagged("step-bytes").metadata["mystnb"]["image"]["alt"]
    assert "dashed line at one model's bytes, P + B" in alt
    plt.close("all")


def test_the_nccl_path_records_the_buckets_of_torchs_cpp_take_tensors(monkeypatch):
    """Between distinct GPUs torch buckets a broadcast in C++ (``take_tensors``, closing a bucket once
    it reaches the limit), not by the Python ``_take_tensors`` rule (closing before a tensor would pass
    it). dpteach's records on that path follow the C++ rule: two 6 MiB float32 tensors under the
    10 MiB default travel as one packed 12 MiB bucket, where the Python rule makes two."""
    from torch._utils import _take_tensors

    from dpteach import comm

    mib = 2**20
    six = [torch.zeros(6 * mib // 4), torch.zeros(6 * mib // 4)]  # float32: 6 MiB each
    assert [len(b) for b in _take_tensors(six, comm.BUFFER_SIZE)] == [1, 1]  # the Python rule: two
    assert comm._cpp_buckets(six, comm.BUFFER_SIZE) == [[0, 1]]  # the C++ rule: one, past the limit
    exact = [torch.zeros(10 * mib // 4), torch.zeros(256)]  # a bucket that reaches the limit closes
    assert comm._cpp_buckets(exact, comm.BUFFER_SIZE) == [[0], [1]] == comm._buckets(exact, comm.BUFFER_SIZE)
    mixed = [torch.zeros(4), torch.zeros(2, dtype=torch.int64), torch.zeros(4)]  # one dtype a bucket
    assert comm._cpp_buckets(mixed, 32) == [[0, 2], [1]]
    # the fast path itself, its two GPUs stood in for by the CPU and "meta"
    handed = []

    def fake_broadcast_coalesced(tensors, devices, buffer_size):
        handed.append(buffer_size)
        return [list(tensors), [t.to("meta") for t in tensors]]

    monkeypatch.setattr(comm, "fast_path", lambda slots, tensors=(): True)
    monkeypatch.setattr(comm.torch_comm, "broadcast_coalesced", fake_broadcast_coalesced)
    with comm.traffic() as t:
        comm.broadcast_coalesced(six, ["cpu", "meta"])
    assert handed == [comm.BUFFER_SIZE]
    assert [(c.op, c.nbytes) for c in t.copies] == [("pack", 12 * mib), ("broadcast", 12 * mib)]


def test_the_meta_slots_are_one_device_and_the_text_says_how_they_are_counted():
    """Four "meta" slots are one device to torch: replicating onto them records no copy whose dst is
    not its src, and a whole step on them records no gradient sum (adds on one device, not copies). So
    the rule's text says that slots 1-3 stand in for GPUs, and that the sums are a formula because
    they are adds there (not because meta runs no backward: it does)."""
    import dpteach

    scope, _ = run("model-your-size")
    P, n = scope["P_gpt"], scope["N_gpt"]
    with dpteach.comm.traffic() as t:
        dpteach.replicate(scope["gpt2_sized"], [torch.device("meta")] * n)
    assert t.cross_device_bytes == 0 and t.bytes == (n - 1) * P  # what the cell counts: t.bytes
    with torch.device("meta"):
        small = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))
    step = costs.step_traffic(small, torch.randn(4, 8, device="meta"), [torch.device("meta")] * 4)
    assert "reduce_add" not in step.by_op() and all(p.grad is not None for p in small.parameters())
    at = CELLS.index(tagged("model-your-size"))
    rule = " ".join(DETAILS.sub(" ", CELLS[at - 1].source).split())
    assert 'Four `"meta"` slots stand in for four GPUs: every copy onto slots 1–3 crosses one' in rule
    assert 'a formula, since on the `"meta"` slots, one device, the sums are adds, not copies' in rule
    assert "runs no backward" not in rule


def test_the_meta_pair_text_says_which_strategy_goes_through_torchs_comm():
    """Only "broadcast" hands its copies and sums to torch.nn.parallel.comm on distinct GPUs; "rewire"'s
    ReduceAdd sums one parameter at a time with .to and add_, as C++ DataParallel's does. The cell
    prints the packs beside the copies sent, and says on the main path why two CPU slots pack nothing."""
    import inspect

    from dpteach import comm
    from dpteach.replicate import rewire

    backward = inspect.getsource(rewire.ReduceAdd.backward)
    assert "output.add_(g.to(ctx.destination))" in backward and "torch_comm" not in backward
    assert "_coalesced_copy" not in inspect.getsource(comm.copy_to)  # clone and rewire copy with .to
    # which torch code does the copies is an internal: the table cell's fold says it, not its main path
    table = CELLS[CELLS.index(tagged("meta-counts")) - 1].source
    (which,) = [" ".join(d.split()) for d in DETAILS.findall(table)]
    assert 'On distinct GPUs `"broadcast"` copies and sums through `torch.nn.parallel.comm`' in which
    assert '`"rewire"` sums per parameter, as C++ `ReduceAdd` does' in which
    assert "torch.nn.parallel.comm" not in DETAILS.sub(" ", table)
    scope, printed = run("step-bytes", "meta-counts")
    row = " ".join(next(ln for ln in printed.splitlines() if ln.startswith("broadcast ")).split())
    # the copies that cross devices, apart from the local ones (the packs); no bytes onto meta on screen
    assert f"3 copies cross devices, 2 stay on {scope['devices'][0]}" in row and "onto meta" not in row
    after = " ".join(DETAILS.sub(" ", CELLS[CELLS.index(tagged("meta-counts")) + 1].source).split())
    assert "Between CPU slots dpteach copies tensor by tensor" in after and "on `devices[0]`" in after
    four = [c.source for c in CELLS if "exercise-stub" in c.metadata.get("tags", [])][2]
    assert 'strategy = "clone"' in four  # the count the meta pair did not print
    fold = " ".join(DETAILS.findall(CELLS[CELLS.index(tagged("meta-counts")) + 1].source)[0].split())
    assert "follow the C++ rule (`_cpp_buckets`)" in fold and "the Python one (`_buckets`)" in fold


def test_the_meta_pair_names_each_bucket_with_its_bytes():
    """The three buckets "broadcast" sends are named on the main path with their sizes, derived here from
    the model: its parameters, its float32 running statistics, and its int64 counter."""
    scope, _ = run("step-bytes")
    model = scope["model"]
    params = sum(p.nbytes for p in model.parameters())
    stats = sum(b.nbytes for b in model.buffers() if b.dtype == torch.float32)
    counter = sum(b.nbytes for b in model.buffers() if b.dtype == torch.int64)
    after = " ".join(DETAILS.sub(" ", CELLS[CELLS.index(tagged("meta-counts")) + 1].source).split())
    assert f"the parameters ({params:,} bytes)" in after
    assert f"the float32 running statistics ({stats:,})" in after
    assert f"`num_batches_tracked` ({counter:,})" in after
    # torch's own reason for packing, quoted in the fold, word for word
    from torch.nn.parallel import comm as torch_comm

    said = "Small tensors are first coalesced into a buffer to reduce the number of synchronizations."
    assert said in " ".join(torch_comm.broadcast_coalesced.__doc__.split())
    assert said in " ".join(DETAILS.findall(CELLS[CELLS.index(tagged("meta-counts")) + 1].source)[0].split())


def test_the_table_splits_what_crosses_a_link_from_what_stays():
    """clone and rewire: N - 1 copies across and N local clones make 2N - 1; broadcast's copies all cross
    (its packs are local and left out of the count), as the meta pair counts."""
    scope, printed = run("step-bytes", "meta-counts")
    table = " ".join(DETAILS.sub(" ", CELLS[CELLS.index(tagged("meta-counts")) - 1].source).split())
    assert "`(2N − 1)·(P + B)`: `N − 1` across, `N` clones" in table
    assert "`(N − 1)·(P + B)`, all across, packs aside" in table
    tensors = 11
    rows = {line.split()[0]: " ".join(line.split()) for line in printed.splitlines() if " counted " in line}
    assert f"{tensors} copies cross devices, {2 * tensors} stay" in rows["clone"]  # N = 2: 2 clones a tensor


def test_backward_sums_are_said_to_be_counted_only_on_a_gpu():
    """On CPU (and on "meta") the gradient sum is a formula: a step over a CPU and a "meta" slot cannot
    run (no data leaves "meta"), so the text says dpteach counts it only on a GPU."""
    model = nn.Sequential(nn.Linear(4, 4))
    with pytest.raises(NotImplementedError):
        costs.step_traffic(model, torch.randn(4, 4), ["cpu", "meta"], "broadcast")
    text = " ".join(DETAILS.sub(" ", CELLS[CELLS.index(tagged("step-bytes")) + 1].source).split())
    assert "dpteach counts that only on a GPU" in text


def test_the_gather_fix_returns_only_the_loss():
    """Returning only each replica's loss shrinks the gather to N scalars: gather makes them a vector."""
    import warnings

    import dpteach

    why = " ".join(tagged("gather-why").source.split())
    assert "each replica computes its loss in `forward` and returns only that" in why
    assert "the gather moves `N` scalars" in why
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        out = dpteach.gather([torch.tensor(1.0), torch.tensor(2.0), torch.tensor(3.0)], "cpu")
    assert out.shape == (3,)
    summary = " ".join(next(c.source for c in CELLS if c.source.startswith("## Summary")).split())
    assert "unless replicas return only their loss" in summary
    assert 'plus a local `"pack"` of each bucket of more than one tensor' in summary


def test_the_answer_gives_the_moves_share_of_the_modelled_step():
    """The figure's compute annotation, said in words: the moves' share of the step, modelled on the
    profile the figure names, for GPT-2 small at both N, derived here from the cost model."""
    work = costmodel.large_workload("gpt2-small").scaled(16)
    shares = []
    for n in (4, 8):
        pred = costmodel.predict(work, "A100-SXM", n)
        compute = (pred.seconds("forward") + pred.seconds("backward")) / n
        threads = sum(p.seconds for p in pred.parts if p.name.startswith("start thread"))
        shares.append(round(100 * (pred.total_s - compute - threads) / pred.total_s))
    answer = " ".join(tagged("between-gpus-answer").source.split())
    assert "modelled on the A100-SXM profile" in answer
    assert f"about {shares[0]}% of the modelled step on 4 GPUs and {shares[1]}% on 8" in answer


def test_the_v100_link_count_names_its_topology():
    """150 GB/s between two V100s needs all six links between them (NVSwitch); a DGX-1 pair has one or
    two: the fold gives the two-link share too, derived from the cost model."""
    two = costmodel.clone_over_to(costmodel._gpu("V100-SXM2").with_links(2))
    fold = " ".join(CELLS[CELLS.index(tagged("clone-then-to-counts")) + 1].source.split())
    assert f"Two V100s joined by two links (50 GB/s, `GPU.with_links(2)`) give {two:.3f}" in fold
    assert "only through NVSwitch, as in a DGX-2" in fold and "DGX-1's hybrid cube mesh" in fold
