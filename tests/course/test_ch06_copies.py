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
    """Exercises 2-5: the item, a starter cell under it, then its Answer block, in that order."""
    cells = list(CELLS)
    for n in range(2, 6):
        at = next(
            i for i, c in enumerate(cells) if re.search(rf"^(\*\*)?{n}\. ", DETAILS.sub("", c.source), re.M)
        )
        assert cells[at + 1].cell_type == "code", n
        assert f"<summary>Answer {n}</summary>" in cells[at + 2].source, n


def test_the_starter_cells_run_as_given_and_completed_print_the_answers():
    """Exercises 2-5 start from a cell that runs with its ``...`` left open and then prints what to
    fill in; filled in as the answers say, they print what the answers claim (derived here from the
    model and the tensors)."""
    stubs = [c.source for c in CELLS if "exercise-stub" in c.metadata.get("tags", [])]
    two, three, four, five = stubs
    # a replica has no parameters(): the stub says how to reach the weight
    assert "replica[0].weight" in three
    scope, _ = run("step-bytes", "coalesce-counts")
    for stub in stubs:  # as shipped: no error, and a prompt printed, not a bare Ellipsis or nothing
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(stub, scope)
        assert out.getvalue().strip() and "Ellipsis" not in out.getvalue(), stub.splitlines()[0]
    tensors = scope["tensors"]  # 1 KiB each: a 4 KiB bucket holds four, packed, then sent
    per_bucket = 4096 // tensors[0].nbytes
    buckets, sent = len(tensors) // per_bucket, sum(t.nbytes for t in tensors)
    filled = {
        two: [
            ("predicted = ...", "predicted = (len(devices) - 1) * sum(costs.state_nbytes(wide).values())"),
        ],
        three: [
            (
                "shared[strategy] = ...",
                "shared[strategy] = replica[0].weight.data_ptr() == model[0].weight.data_ptr()",
            ),
            ("lands_in = ...", 'lands_in = "model"'),
        ],
        four: [("onto_slot_1 = ...", "onto_slot_1 = sum(c.nbytes for c in t.copies if c.dst == meta)")],
        five: [("predicted = ...", f"predicted = ({buckets}, {2 * buckets}, {2 * sent})")],
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
    assert "checks.model_copy_bytes(" in two and printed[two].startswith("Correct!")  # (N - 1)(P + B) alone
    wide = scope["wide"]
    assert f"{(len(scope['devices']) - 1) * sum(costs.state_nbytes(wide).values()):,} bytes" in printed[two]
    assert "'broadcast' the model's own tensors, 'clone' memory of its own" in printed[three]
    assert f"{scope['P'] + scope['B']:,} bytes" in printed[four]  # (N - 1)(P + B) with N = 2
    assert f"{buckets} sent, {2 * buckets} copies, {2 * sent:,} bytes" in printed[five]


def test_the_clone_then_to_section_rests_on_counts_and_labels_what_is_modelled():
    """The section shows the counts alone, no timing figure; the extra clone's share of the .to's time
    between GPUs is printed per GPU profile from the cost model (a clone reads and writes at mem_bw,
    the .to crosses the link once), and the prose after it gives the printed range, labelled modelled."""
    import json

    assert not any("copy-timings" in c.metadata.get("tags", []) for c in CELLS)
    code = "\n".join(c.source for c in CELLS if c.cell_type == "code")
    assert "clone_then_to" not in code and "plot_timings" not in code and "time_in_turns" not in code
    _, printed = run("model-your-size", "gather-bytes", "clone-over-to")
    printed = printed.strip().splitlines()[-1]  # the clone-over-to cell's line
    gpus = json.loads((ROOT / "dpteach" / "measure" / "data" / "gpus.json").read_text())["gpus"]
    expected = sorted((2 * g["link_bw"] / g["mem_bw"], name) for name, g in gpus.items())
    assert printed.strip() == ", ".join(f"{name} {r:.3f}" for r, name in expected)
    assert costmodel.clone_over_to("T4") == 2 * gpus["T4"]["link_bw"] / gpus["T4"]["mem_bw"]
    at = next(i for i, c in enumerate(CELLS) if "clone-over-to" in c.metadata.get("tags", []))
    after = " ".join(DETAILS.sub(" ", CELLS[at + 1].source).split())
    (low, low_name), (high, high_name) = expected[0], expected[-1]
    assert f"from {low:.3f} ({low_name}) to {high:.3f} ({high_name.split('-')[0]})" in after
    assert "Modelled from the spec sheets" in after
    ratios = [g["mem_bw"] / g["link_bw"] for g in gpus.values()]
    assert "6 to 20 times" in after and 6 <= min(ratios) < 7 and 20 <= max(ratios) < 21  # rounded down


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
    P, B, n = size["parameters"], size["buffers"], scope["N"]
    lines = printed.splitlines()[1:]  # after the set-up's slots line
    assert lines[0] == f"{params:,} parameters: P = {P / 1e6:,.1f} MB, and B = {B / 1e6:,.1f} MB of buffers"
    data_parallel = " ".join(" ".join(lines[1:3]).split())
    assert f"{(n - 1) * (P + B) / 1e6:,.1f} MB of model copies (counted)" in data_parallel
    assert f"+ {(n - 1) * P / 1e6:,.1f} MB of gradients into GPU 0, (N - 1)·P" in data_parallel
    total = (n - 1) * (2 * P + B)
    assert data_parallel.endswith(f": {total / 1e6:,.1f} MB in all")
    ddp = lines[3]
    assert f"{total / 1e6:,.1f} MB, {2 * (n - 1) / n * P / 1e6:,.1f} MB from each rank" in ddp
    assert "(modelled: ring all-reduce)" in ddp


def test_the_gathered_output_is_counted_beside_the_model_and_no_time_is_modelled_here():
    """What the one rule leaves out, DataParallel's gather of every output onto GPU 0, is counted from
    the shipped GPT-2 small workload: its logits and its keys and values, summed to the workload's
    output bytes, beside the model's. The prose after it states the ratios the printed figures give,
    says why the keys and values come back, and sends the step's time to chapter 08: this chapter
    models no time."""
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
    assert int(logits / work.param_bytes) == 6 and "the logits alone still weigh six times the model" in why
    assert "`use_cache` on" in why and "[Chapter 08](08_real_gpus.ipynb)" in why
    code = "\n".join(c.source for c in CELLS if c.cell_type == "code")
    assert "costmodel.predict" not in code  # time is chapter 08's: here bytes only
    before = " ".join(CELLS[at - 1].source.split())
    assert "The rule leaves out what DataParallel alone moves" in before and "`GPT2LMHeadModel`" in before


def test_the_meta_pair_says_why_broadcast_sends_three_buckets():
    """After the meta pair's counts, the main path says why 11 tensors travel in 3 copies: one dtype a
    bucket, parameters and buffers broadcast apart (derived here from the model's tensors)."""
    scope, printed = run("step-bytes", "meta-counts")
    model = scope["model"]
    kinds = {("param", p.dtype) for p in model.parameters()} | {("buffer", b.dtype) for b in model.buffers()}
    sent = int(re.search(r"broadcast\s+counted\s+[\d,]+ bytes in\s+(\d+) copies", printed)[1])
    assert sent == len(kinds) == 3
    at = next(i for i, c in enumerate(CELLS) if "meta-counts" in c.metadata.get("tags", []))
    after = DETAILS.sub(" ", CELLS[at + 1].source)
    assert CELLS[at + 1].cell_type == "markdown" and f"{sent} copies" in after and "one dtype" in after


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
    assert "on every step, while DistributedDataParallel copies the parameters once" in text
    assert "(08_real_gpus.ipynb)" in text


def test_2n_minus_1_is_stated_where_it_is_counted():
    at = next(i for i, c in enumerate(CELLS) if "meta-counts" in c.metadata.get("tags", []))
    assert "2N − 1" in DETAILS.sub(" ", CELLS[at - 1].source)


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
    assert f"in {(2 * n - 1) * tensors} copies" in " ".join(rows["clone"].split())
    sent = int(re.search(r"in\s+(\d+) copies", rows["broadcast"])[1])
    assert sent < tensors and "'pack'" in rows["broadcast"]
    summary = next(c.source for c in CELLS if c.source.startswith("## Summary"))
    assert "2N − 1" in summary and '"meta"' in summary
    # the table: a row per strategy, its forward formula the one the cell counts
    table = CELLS[CELLS.index(tagged("meta-counts")) - 1].source
    main = DETAILS.sub(" ", table)
    assert main.count('\n| `"') == 3 and "(2N − 1)·(P + B)" in main and "(N − 1)·(P + B)" in main
    assert "num_batches_tracked" in table  # why broadcast's int64 counter travels unpacked: in the fold


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
