"""Chapter 08: its cells found by tag, its budgets, the published answer it opens with, and the
deterministic evidence it prints (copies, the thread table, the modelled timeline, the published ratios)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import matplotlib
import nbformat
import pytest

matplotlib.use("Agg")

ROOT = Path(__file__).resolve().parents[2]
NB = nbformat.read(ROOT / "notebooks" / "08_real_gpus.ipynb", as_version=4)
TAGGED = {tag: c for c in NB.cells for tag in c.metadata.get("tags", [])}
FIGURES = ("timeline", "over-n", "my-timing")


def main_path_words(nb) -> int:
    text = " ".join(c.source for c in nb.cells if c.cell_type == "markdown")
    return len(re.sub(r"<details>.*?</details>", " ", text, flags=re.S).split())


def flat(text: str) -> str:
    return " ".join(text.split())


def markdown() -> str:
    return " ".join(flat(c.source) for c in NB.cells if c.cell_type == "markdown")


def main_of(cell) -> str:
    """A markdown cell's main path: its Going-deeper blocks cut out, one space between tokens."""
    return flat(re.sub(r"<details>.*?</details>", " ", cell.source, flags=re.S))


def run(*tags: str) -> tuple[dict, str]:
    """Run the chapter's set-up cell and the cells with ``tags`` in one scope; what they printed."""
    scope: dict = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for tag in ("hide-input", *tags):
            exec(compile(TAGGED[tag].source, f"<{tag}>", "exec"), scope)
    return scope, out.getvalue()


def fold_commands() -> tuple[dict, str]:
    """The two commands the model's check names in its fold (the table, the figure), run after the set-up
    cell, as a learner pasting them into a cell would; what they printed."""
    fold = re.search(r"<details>.*?</details>", TAGGED["checked"].source, flags=re.S).group(0)
    commands = [c for c in re.findall(r"`([^`]+)`", fold) if re.match(r"(print\()?published\.\w+\(", c)]
    assert [c.split("(")[1 if c.startswith("print") else 0] for c in commands] == [
        "published.ratios",
        "published.figure",
    ], commands
    scope, _ = run()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(f"{commands[0]}\nfig = {commands[1]}", scope)
    return scope, out.getvalue()


def test_budgets_hold():
    assert main_path_words(NB) <= 1500  # the short chapters' budget (tests/course/test_budgets.py)
    folds = [b for c in NB.cells for b in re.findall(r"<summary>Going deeper", c.source)]
    assert len(folds) <= 4, f"{len(folds)} Going-deeper folds: at most 4"
    long = [c.id for c in NB.cells if c.cell_type == "code" and len(c.source.splitlines()) > 25]
    assert not long, f"code cells over 25 lines: {long}"
    for c in NB.cells:
        for block in re.findall(r"<details>.*?</details>", c.source, flags=re.S):
            assert len(block.split()) <= 400


def test_the_copies_come_early_after_their_heading_and_figures_have_alt_text():
    at = NB.cells.index(TAGGED["copies"])
    assert at <= 4  # the key result within the first five cells, after the prose that says what it shows
    before = next(c for c in reversed(NB.cells[:at]) if c.cell_type == "markdown")
    assert "## What DataParallel repeats every step, on your slots" in before.source
    assert [c.cell_type for c in NB.cells[at - 1 : at + 1]] == ["code", "code"]  # only the set-up between
    # one idea a cell: the copies, what they show, then the thread table's question, the table, its reading
    table = NB.cells.index(TAGGED["thread-table"])
    assert [c.cell_type for c in NB.cells[at : table + 2]] == [
        "code",
        "markdown",
        "markdown",
        "code",
        "markdown",
    ]
    assert "remove-cell" in NB.cells[1].metadata["tags"]
    for tag in FIGURES:
        assert TAGGED[tag].metadata["mystnb"]["image"]["alt"].strip(), tag
    opening = NB.cells[2].source
    assert "The one thing to learn" in opening and opening.count("\n|") >= 4  # the three-row table


# ---------------------------------------------------------------- the opening: the question, answered


def test_the_opening_says_the_one_thing_then_asks_for_a_prediction_before_the_counts():
    """The mechanism and what DDP does instead in two sentences, the three-row table, then a prediction
    the first counted cell answers. No speed-up figure in the opening: the published pair is shown with
    its source and hardware where the model is checked against it."""
    opening = flat(NB.cells[2].source)
    assert "<details>" not in opening and "%" not in opening
    first = opening.split("**The one thing to learn:**")[1].split("|")[0].strip()
    assert len(first.split(". ")) == 2
    assert "every step, DataParallel's one process copies the model out of GPU 0" in first
    assert opening.index("**Predict:**") < opening.index("Then run the next two cells")
    text = markdown()
    assert "~15%" not in text  # the guide's line sets DataParallel with NVLink against DDP without it
    assert "aw_nas" not in text  # a report that names no hardware is not shown
    assert "makes GPU 0" not in text  # the host process starts the threads, not GPU 0


def test_the_opening_table_is_the_readmes():
    readme = (ROOT / "README.md").read_text().splitlines()
    starts = ("| a CPU (laptop, Binder) |", "| one GPU (Colab) |", "| several GPUs |")
    ours = [line for line in NB.cells[2].source.splitlines() if line.startswith(starts)]
    assert ours == [line for line in readme if line.startswith(starts)] and len(ours) == 3


# ---------------------------------------------------------------- the counted half


def test_the_thread_table_puts_every_cpu_backward_node_on_the_caller_thread():
    pytest.importorskip("torch")
    scope, printed = run("thread-table")
    if scope["on_gpu"]:
        pytest.skip("the CPU branch")
    assert scope["recorded"].roles == {"caller thread"}
    measured, simulated = printed.split("simulated on CPU slots:")  # the record, then GPUs' split, simulated
    assert "replica 1" in measured and "autograd thread" not in measured and "slot 1's thread" not in measured
    # the split is run on real threads and labelled a simulation: each replica's nodes on its slot's thread
    assert "slot 1's thread (as cuda:1's)" in simulated and "caller thread ran none of them" in simulated
    _, again = run("thread-table")
    assert printed == again  # the same on every run


def test_the_first_cells_count_the_model_copied_again_on_every_step():
    """The deciding evidence on the learner's own slots: each step's copies, counted, the same twice, and
    replicate's broadcast is the whole model once per slot after the first."""
    from dpteach.measure import costs

    scope, printed = run("copies")
    steps = [line for line in printed.splitlines() if line.startswith("step ")]
    assert len(steps) == 2 and steps[0].split(":", 1)[1] == steps[1].split(":", 1)[1]
    model, slots = scope["model"], scope["slots"]
    size = costs.state_nbytes(model)["parameters"]
    if len({str(d) for d in slots}) == len(slots) or all(d.type == "cpu" for d in slots):
        assert f"broadcast {(len(slots) - 1) * size:,} bytes" in steps[0]
    assert f"(the model's parameters: {size:,} bytes)" in printed


def test_the_prose_names_each_copy_as_the_counted_lines_do():
    """The moves the counted lines print ("broadcast", "gather") are the words the prose after them uses."""
    _, printed = run("copies")
    first = next(line for line in printed.splitlines() if line.startswith("step 1 copied: "))
    ops = re.findall(r"(\w[\w ]*?) [\d,]+ bytes", first.removeprefix("step 1 copied: "))
    assert "broadcast" in ops and "gather" in ops
    prose = main_of(NB.cells[NB.cells.index(TAGGED["copies"]) + 1])
    for op in ops:
        assert f"**{op}**" in prose, op
    assert "**replicate** (the broadcast counted above)" in main_of(
        NB.cells[NB.cells.index(TAGGED["timeline"]) + 1]
    )


def test_each_term_is_defined_where_the_main_path_first_uses_it():
    text = " ".join(main_of(c) for c in NB.cells if c.cell_type == "markdown")
    defined = {
        r"\breplicas?\b": "keeps a replica (a copy of the model) in each",
        r"\bbuckets?\b": "in **buckets**, groups sent together, each by an **all-reduce**",
        r"\ball-reduces?\b": "**all-reduce**, which sums a tensor across the GPUs and leaves the sum on every one",
        r"\bplain step\b": "plain step, the bare model on one GPU",
    }
    for term, definition in defined.items():
        first = re.search(term, text, flags=re.I).start()
        at = text.index(definition)
        assert at <= first < at + len(definition), (term, text[max(0, first - 80) : first + 40])


def test_the_thread_table_says_why_it_matters_and_the_summary_uses_it():
    """Beside the table: one thread on CPU; on GPUs cuda:0's thread takes the loss, gather and sum, the
    forwards' Python threads share the GIL, DDP a process per GPU (the fold's engine rules)."""
    after = main_of(NB.cells[NB.cells.index(TAGGED["thread-table"]) + 1])
    assert "On CPU slots one thread, the one that called `loss.backward()`, ran every node" in after
    assert "cuda:0's engine thread runs the loss, the gather's backward and the sum onto the model" in after
    assert "the sum onto the model beside replica 0's nodes, GPU 0's serial work" in after
    assert "13" not in after  # the per-thread counts are the cell's to print, not the prose's
    assert "GIL" not in after  # a forward-side cost: the summary names it with what is not modelled
    text = markdown()
    summary = text[text.index("## Summary") : text.index("## Exercises")]
    assert "forward runs each replica on a Python thread" in summary  # the two kinds of thread, apart
    assert "Also named, not modelled: the GIL and `replicate`'s Python work" in summary
    assert (
        "backward runs on one engine thread per GPU, cuda:0's with the loss, gather and sum (the thread table)"
        in summary
    )
    scope, printed = run("thread-table")
    if not scope["on_gpu"]:  # what the sentence rests on: the split as the simulated run printed it
        gpus = printed.split("simulated on CPU slots:")[1]
        for part in ("loss and gather", "sum onto the model"):
            assert any(part in line and "as cuda:0's" in line for line in gpus.splitlines()), part
        per_thread = {"cuda:0": 0, "cuda:1": 0}  # the sentence's 13 and 5: the printed rows, per thread
        for k, gpu in re.findall(r"^ +(\d+)  .*thread \(as (cuda:\d)'s\)", gpus, flags=re.M):
            per_thread[gpu] += int(k)
        assert per_thread == {"cuda:0": 13, "cuda:1": 5}


def test_one_bytes_table_at_most_and_chapter_09_holds_the_per_rank_traffic():
    code = " ".join(c.source for c in NB.cells if c.cell_type == "code")
    assert "through_gpu0" not in code  # the GPU-0-against-ring table lives in chapter 09's traffic table
    prose = main_of(NB.cells[NB.cells.index(TAGGED["copies"]) + 1])
    assert "[Chapter 09](09_beyond_one_process.ipynb)" in prose and '"What each moves per step"' in prose
    ch09 = nbformat.read(ROOT / "notebooks" / "09_beyond_one_process.ipynb", as_version=4)
    assert any(c.source.startswith("## What each moves per step") for c in ch09.cells)
    assert "12.6 MB" not in markdown() and "NCCL's ring; it may pick a tree" not in markdown()


# ---------------------------------------------------------------- the model: the shape of a step


def test_the_model_section_states_its_assumptions_and_no_verdict_on_the_thread_start():
    section = NB.cells[NB.cells.index(TAGGED["timeline"]) - 1]
    main = main_of(section)
    assert main.startswith("## What waits for what: one step, modelled")
    assert (
        "The order of the bars comes from the code of DataParallel and DDP; their lengths are modelled"
        in main
    )
    # the four assumptions, named in a fold of their own before the prediction and the figure
    fold = section.source.split("<details><summary>The four assumptions behind the lengths</summary>")[1]
    bullets = flat(fold.split("</details>")[0]).split("- ")[1:]  # each bullet, its lines joined
    assert len(bullets) == 4 and all("assumed" in b for b in bullets)
    whole = flat(section.source)
    # no measurement of a thread start ships: the timeline charges none, and says so
    assert (
        "thread starts are left out (assumed free), since no measurement of them ships, here and in every "
        "modelled step of this chapter" in whole
    )
    for c in NB.cells:  # every call that models a DataParallel step says so: thread_s=0.0
        calls = re.findall(
            r"(?:costmodel|published)\.(?:predict|draw_over_n|against_one|ratios|pair_gap|figure)\(", c.source
        )
        assert c.source.count("thread_s=0.0") + c.source.count("**options") >= len(calls), c.id
    assert "options = dict(latency=True, thread_s=0.0)" in TAGGED["published-ratios"].source
    assert whole.index("**Predict:**") > whole.index("share of backward is done")  # before the figure
    assert (
        "backward is assumed to make the gradient bytes at an even pace, so a DDP bucket is ready once its "
        "share of backward is done" in whole
    )
    # what went: the folded sensitivity grid and stress test, the learner's thread start in the model
    text, code = markdown(), " ".join(c.source for c in NB.cells if c.cell_type == "code")
    for gone in ("sensitivity", "thread_effect", "measure_thread_start", "9 assumed pairs", "stress test"):
        assert gone not in text and gone not in code, gone
    assert "Your own thread start" not in text and "60%" not in text  # no share of an assumed figure in prose


def test_the_timeline_reads_what_waits_for_what():
    from dpteach.measure import costmodel

    scope, printed = run("timeline")
    assert "your model: forward" in printed and "A100-SXM" in printed
    titles = [ax.get_title() for ax in scope["fig"].axes]
    assert all("modelled, A100-SXM" in t for t in titles) and len(titles) == 3  # one GPU, DataParallel, DDP
    assert scope["one"].n == 1 and "forward" in [p.name for p in scope["one"].parts]  # the plain step on top
    assert titles[0].startswith("one GPU, the plain step: ") and "DataParallel" not in titles[0]
    spans = {ax.get_xlim() for ax in scope["fig"].axes}  # one time axis: DataParallel's step spans it
    assert len(spans) == 1 and spans.pop()[1] == pytest.approx(scope["dp"].total_s * 1e3 * 1.02)
    top = scope["fig"].axes[1]  # DataParallel's, under the one-GPU step
    legend = [t.get_text() for t in top.get_legend().get_texts()]
    # thread starts charged nothing: no python row, no thread-start entry, and the x-label says so
    assert not any("thread start" in t for t in legend) and scope["dp"].latency
    assert "python" not in [t.get_text() for t in top.get_yticklabels()]
    assert "thread starts not charged" in top.get_xlabel()
    # the copies charged NCCL's latency by assumption are marked where the figure is, and the bullet says so
    assert any("NCCL's latency (assumed)" in t for t in legend)
    assert "DataParallel's plain copies are charged it too, and hatched" in flat(
        NB.cells[NB.cells.index(TAGGED["timeline"]) - 1].source
    )
    assert all(p.seconds == 0 for p in scope["dp"].parts if p.lane == "python")
    assert costmodel.PYTHON_THREAD_S == 100e-6  # the model's default stays, for the published check
    assert "(**scatter grad**)" in main_of(NB.cells[NB.cells.index(TAGGED["timeline"]) + 1])
    # the prose: DataParallel's copies and sums on the step's path; DDP's all-reduces but the last beside backward
    prose = main_of(NB.cells[NB.cells.index(TAGGED["timeline"]) + 1])
    # read against the plain step drawn on top, as against_one prints it
    assert (
        "Against one GPU's step (top), DataParallel's (middle) puts every copy and sum on the path" in prose
    )
    assert "so all but the last can run beside backward" in prose
    assert "Only once every backward is done are the gradients flattened and summed onto GPU 0" in prose
    assert ":" not in prose.split("**Predict:**")[0]  # plain sentences, no colon chains
    for strategy, prediction in (("DataParallel", scope["dp"]), ("DDP", scope["ddp"])):
        done = max(p.end for p in prediction.parts if p.name == "backward")
        after = {p.name for p in prediction.parts if p.start >= done - 1e-12}
        reduces = [p for p in prediction.parts if p.name == "all-reduce"]
        if strategy == "DataParallel":
            assert after == {"flatten", "reduce"}
        else:  # every bucket but the last starts during backward; the last starts after it
            assert all(p.start < done for p in reduces[:-1]) and reduces[-1].start >= done


def test_the_bucket_aside_is_what_the_model_computes():
    from dpteach.measure import costmodel

    scope, _ = run()
    work = scope["work"]
    assert [round(b / 1e6, 1) for b in costmodel.buckets(work)] == [
        4.2,
        4.2,
    ]  # the last layer, then the first
    assert "Here the last layer's 4 MB make bucket 1" in markdown()
    pred = costmodel.predict(work, "A100-SXM", 4, "DDP")
    [backward] = [p for p in pred.parts if p.name == "backward" and p.lane == "GPU 0"]
    first = next(p for p in pred.parts if p.name == "all-reduce")
    share = costmodel.buckets(work)[0] / work.param_bytes
    assert abs(first.start - (backward.start + share * backward.seconds)) < 1e-12  # ready at its share
    assert first.start < backward.end  # and sent while backward still runs


# ---------------------------------------------------------------- checked against published runs


def test_every_published_measurement_is_drawn_beside_its_prediction_with_its_ratio_printed():
    from dpteach.measure import published

    scope, printed = fold_commands()  # the fold's table and figure, off the main path
    shipped = published.shipped()
    table = published.ratios(shipped, latency=True, thread_s=0.0)
    assert table.splitlines()[1] == "  DataParallel's thread starts not charged"  # as in the timeline
    assert table in printed and max(len(line) for line in table.splitlines()) <= 80  # one compact table
    assert "published" not in {t for c in NB.cells for t in c.metadata.get("tags", [])}  # no cell draws it
    *panels, right = scope["fig"].axes  # one figure: a panel per DDP run, then the pair
    assert len(panels) == len(published.curves(shipped))
    for ax, m in zip(panels, published.curves(shipped)):
        labels = [line.get_label() for line in ax.get_lines()]
        rows = published.compare(m, latency=True, thread_s=0.0)  # the chapter's model: NCCL's latency in
        assert all(r.modelled_s is not None for r in rows), m.id  # the model predicts every point
        name = m.model.split(",")[0]
        at = labels.index(f"measured (published): {name}, {m.strategy}, {m.gpu_label}") + 1
        assert (
            labels[at] == f"modelled, {m.gpu_label}, NVLinks as read"
        )  # "(inferred)": not in the source  # ... beside the modelled line
        texts = [t.get_text() for t in ax.texts]
        for r in rows:
            assert f"{r.ratio:.2f}x" in printed and f"{r.ratio:.2f}x" in texts  # printed, and drawn
        n, got, mod = published.overhead(m, latency=True, thread_s=0.0)[0]  # the miss, in the panel's title
        assert f"DDP adds at n = {n}: {got * 1e3:.1f} ms measured, {mod * 1e3:.2f} modelled" in ax.get_title()
        low, high = ax.get_ylim()
        assert low == 0 and high < 1.2 * max(r.measured_s for r in rows) * 1e3  # from 0: a gap at its size
    legend = scope["fig"].legends[0]  # one legend, under the panels, not beside them
    assert legend.get_bbox_to_anchor().y0 <= 0.1 * scope["fig"].bbox.height
    [pair] = published.pairs(shipped).values()
    bars = [b.get_height() for b in right.patches]
    want = [
        h
        for m in pair
        for r in published.compare(m, latency=True, thread_s=0.0)
        for h in (r.measured_s * 1e3, r.modelled_s * 1e3)
    ]
    assert bars == pytest.approx(want)  # measured beside modelled, DataParallel then DDP
    measured, modelled = published.pair_ratio(pair, latency=True, thread_s=0.0)
    assert (
        f"DataParallel's step / DDP's, TITAN RTX: measured {measured:.3f}, modelled {modelled:.3f}" in printed
    )
    _, again = fold_commands()
    assert printed == again  # the same on every run


def test_the_check_says_plainly_whose_measurements_they_are():
    from dpteach.measure import published

    shipped = published.shipped()
    main = main_of(TAGGED["checked"])
    if not any(m.ours for m in shipped):
        assert f"Beside the {len(shipped)} published runs dpteach ships" in main
    assert "of ours" not in markdown()
    _, printed = fold_commands()
    rows = [line for line in printed.splitlines() if "(no DDP)" in line]
    assert len(rows) == 2  # under ResNet-50 and ResNet-101, n = 1: the README's "no ddp" step


def test_where_the_model_misses_is_computed_from_the_shipped_runs():
    from dpteach.measure import costmodel, published

    shipped = [m for m in published.shipped() if not m.ours]
    section = TAGGED["checked"]
    main, text = main_of(section), markdown()
    # the main path: the ratios' range, then the one published pair beside its model; the rest folded
    assert main.startswith("## How good is the model?") and len(main.split(". ")) == 2
    [pair] = published.pairs(published.shipped()).values()
    measured, modelled = published.pair_ratio(pair, latency=True, thread_s=0.0)
    assert (
        f"DataParallel took {100 * (measured - 1):.1f}% longer than DDP, and the model says "
        f"{100 * (modelled - 1):.1f}%" in main
    )
    ratios = [r.ratio for m in shipped for r in published.compare(m, latency=True)]
    assert max(max(r, 1 / r) - 1 for r in ratios) <= 0.20
    said = f"each measured step over its modelled one lies between {min(ratios):.2f} and {max(ratios):.2f}"
    assert said in main
    curves = published.curves(shipped)
    shares = [100 * mod / got for m in curves for _, got, mod in published.overhead(m, latency=True)]
    without = [100 * mod / got for m in curves for _, got, mod in published.overhead(m)]
    span, span_without = (f"{min(s):.0f}% to {max(s):.0f}%" for s in (shares, without))
    assert f"the model accounts for {span} of what DDP adds" in text and span not in main and max(shares) < 50
    beside_fig1 = main_of(NB.cells[NB.cells.index(TAGGED["timeline"]) + 1])
    # the miss is said once, on the main path beside the table that prints it: no vague "several times"
    assert "several times" not in text and span not in beside_fig1 and "DDP adds" not in beside_fig1
    added = [(got * 1e3, mod * 1e3) for m in curves for _, got, mod in published.overhead(m, latency=True)]
    got, mod = zip(*added)
    factors = [g / m for g, m in added]  # how many times too little the model charges, per point
    reading = main_of(NB.cells[NB.cells.index(TAGGED["published-ratios"]) + 1])
    assert (
        f"on the ResNets {min(got):.0f} to {max(got):.0f} ms measured, {min(mod):.1f} to {max(mod):.1f} ms "
        f'modelled ("DDP adds" rows), {min(factors):.0f} to {max(factors):.0f} times too little' in reading
    )
    assert "The model misses most of what DDP adds to the plain step, the bare model on one GPU" in reading
    # the totals agree though DDP's own overhead is missed: compute is most of every step
    totals = [r.modelled_s * 1e3 for m in curves for r in published.compare(m, latency=True, thread_s=0.0)]
    assert all(90 < t < 110 or 180 < t < 200 for t in totals)  # "about 100 and 190 ms modelled"
    assert (
        "Compute dominates these ResNet steps (about 100 and 190 ms modelled), so the totals agree all the "
        "same, unlike the MLP's, whose all-reduces outlast its compute" in reading
    )
    for gpu in (
        "A100-SXM",
        "H200-SXM",
    ):  # the MLP's first table: its all-reduces after backward outlast the compute
        ddp = costmodel.predict(run()[0]["work"], gpu, 4, "DDP", latency=True)
        compute = (ddp.seconds("forward") + ddp.seconds("backward")) / 4
        assert ddp.total_s - compute > compute
    assert all(got < 0.2 * dict(m.points)[1] for m in curves for _, got, _ in published.overhead(m))
    assert (
        "It leaves out kernel launches and DDP's hooks, which copy each gradient into its bucket" in reading
    )
    assert f"the model accounts for {span} of what DDP adds ({span_without} without NCCL's latency" in text
    [pair] = published.pairs(shipped).values()
    measured, modelled = published.pair_ratio(pair, latency=True, thread_s=0.0)
    assert (
        f"puts DataParallel's step on the TITAN RTX {100 * (modelled - 1):.1f}% over DDP's, where the "
        f"measurement says {100 * (measured - 1):.1f}%" in text
    )
    assert "read the model for the shape of a step, not its size" in main
    one = [round(100 * (m.ddp_one_gpu_s / dict(m.points)[1] - 1)) for m in curves]
    assert f"On one GPU DDP adds {one[0]}% (ResNet-50) and {one[1]}% (ResNet-101)" in text
    assert section.source.count("<details>") == 1


def test_the_published_pair_is_shipped_and_its_set_up_quoted_with_its_source():
    from dpteach.measure import costmodel, published

    section = flat(TAGGED["checked"].source)
    assert "docs/source/en/perf_train_gpu_many.md" in section and "huggingface/transformers" in section
    for seconds in (110.5948, 101.9003, 131.4367):  # the guide's train_runtime values, to one decimal
        assert f"{seconds:.1f} s" in section
    assert "TITAN RTX" in section and "NCCL_P2P_DISABLE=1" in section and "4.3.0.dev0" in section
    assert "Trainer run" in section and "data loading included" in section
    [pair] = published.pairs(published.shipped()).values()
    assert all("TITAN RTX" in m.hardware for m in pair)
    assert {round(m.points[0][1] * 200, 4) for m in pair} == {110.5948, 101.9003}  # NVLink-off: quoted only
    # every published measurement shown carries its source and hardware, in the data and in the fold
    for m in published.shipped():
        assert m.citation and m.hardware, m.id
    assert "benchmarks/distributed/ddp/README.md" in section and "V100s (inferred)" in section
    # the issue thread is what it is: PyTorch's poll on deprecating DataParallel, the reports in its comments
    assert "in comments on pytorch/pytorch issue #65936" in section and "no set-up to reproduce" in section
    assert (
        '"[POLL][RFC] DataParallel Deprecation", PyTorch\'s 2021 poll on deprecating DataParallel' in section
    )
    # the one-GPU figures are the README's p50 rows: 1M/1G over no ddp
    assert 'the README\'s p50 "1M/1G" row over its "no ddp" row' in section
    # GPU 0's extra work: the whole ModelOutput gathered, its sizes by hand, the modelled and measured gaps
    logits, kv = 4 * 1024 * 50257 * 4, 12 * 2 * 4 * 12 * 1024 * 64 * 4  # 4 sequences a replica, fp32
    assert f"4 × 1024 × 50257 fp32 ({logits / 1e6:.0f} MB)" in section and f"({kv / 1e6:.0f} MB;" in section
    assert pair[0].work_at(2).output_bytes / 2 == pytest.approx(logits + kv, abs=64)  # one replica's output
    dp, ddp = (
        costmodel.predict(m.work_at(2), m.profile_at(2), 2, m.strategy, latency=True, thread_s=0.0)
        for m in pair
    )
    assert f"1.1 GB a replica, {dp.seconds('gather') * 1e3:.0f} ms a step modelled" in section
    measured_gap = (pair[0].points[0][1] - pair[1].points[0][1]) * 1e3
    assert (f"DataParallel's step is {(dp.total_s - ddp.total_s) * 1e3:.0f} ms longer than DDP's; measured, "
            f"{measured_gap:.1f} ms") in section  # fmt: skip
    assert "includes the loss" not in section and "the seventh layer" not in markdown()


# ---------------------------------------------------------------- one colour per strategy


def test_each_strategy_has_one_colour_in_every_figure():
    from matplotlib.colors import to_hex

    from dpteach.measure.costmodel import STRATEGY_COLOURS as C

    scope, _ = run("timeline", "over-n")
    top, bottom = scope["top"], scope["bottom"]
    *panels, right = fold_commands()[0]["fig"].axes  # the fold's figure of the published runs
    assert to_hex(top.title.get_color()) == C["DataParallel"] and to_hex(bottom.title.get_color()) == C["DDP"]
    assert to_hex(top.spines["left"].get_edgecolor()) == C["DataParallel"]
    from dpteach.measure import costmodel

    over_n = costmodel.draw_over_n(scope["work"], latency=True, thread_s=0.0)  # the over-n cell's figure
    for ax in over_n.axes:
        lines = {line.get_label(): to_hex(line.get_color()) for line in ax.get_lines()}
        assert lines["DataParallel"] == C["DataParallel"] and lines["DDP"] == C["DDP"]
    measured = [
        line
        for ax in panels
        for line in ax.get_lines()
        if line.get_label().startswith("measured (published)")
    ]
    assert {to_hex(line.get_color()) for line in measured} == {C["DDP"]}  # the ResNets ran DDP
    solid = [to_hex(b.get_facecolor()) for b in right.patches[::2]]
    assert solid == [C["DataParallel"], C["DDP"]]


# ---------------------------------------------------------------- the learner's timing and GPU cells


def test_the_timing_cell_times_dataparallel_beside_ddp_on_a_cpu_and_keeps_the_gpu_timing():
    """On a CPU: one step four ways (compare.cpu_rounds, DDP on 2 gloo ranks, closed after), every round
    drawn, the lines printed. On CUDA: scaling's timing, whose ``result`` the GPU cell and
    scripts/gpu_check.sh's run of the chapter read."""
    from dpteach.distributed.compare import CPU_KINDS

    cell = TAGGED["my-timing"].source
    assert len(cell.splitlines()) <= 25
    gpu, cpu = cell.split("\nelse:")
    assert gpu.startswith("if on_gpu:")
    for needed in (
        "scaling.steps(model, x, lists)",
        "result = scaling.result(",
        "scaling.draw_rounds(times)",
    ):
        assert needed in gpu, needed
    assert 'with Ranks(2, "gloo") as ranks:' in cpu  # the ranks close when the rounds are done
    # cheap by default (batch 1,024, 2 steps a round: a few seconds on 2 cores), and its knobs in sight
    assert "compare.cpu_rounds(ranks, hidden=512, depth=3, global_batch=1024, rounds=5, repeats=2)" in cpu
    assert "plots.cpu_rounds(speed, load=(cores, *load))" in cpu and "speed.lines()" in cpu
    # the machine's load before and after the rounds, and the cores this process may use, printed
    assert "os.getloadavg()" in cpu and "os.sched_getaffinity(0)" in cpu and cpu.count("load.append") == 1
    assert 'ranks.run("bucket_order", steps=1, echo=False)' in cpu  # the thread evidence, per rank
    assert CPU_KINDS == (
        "one process, 1 thread", "DataParallel, 2 CPU slots", "DDP, 2 ranks", "one process, 2 threads",
    )  # fmt: skip
    # the prose before it names the four ways and says what a dot is
    before = main_of(NB.cells[NB.cells.index(TAGGED["my-timing"]) - 1])
    assert before.startswith("## Time it on your machine (optional) Nothing above rests on this section")
    assert TAGGED["my-timing"].metadata["jupyter"][
        "source_hidden"
    ]  # folded in JupyterLab: the section is optional
    # an optional section near the end: after the structural lessons and the model's check, before the summary
    at = NB.cells.index(TAGGED["my-timing"])
    summary = next(i for i, c in enumerate(NB.cells) if c.source.startswith("## Summary"))
    assert NB.cells.index(TAGGED["over-n"]) < NB.cells.index(TAGGED["checked"]) < at < summary
    # a busy machine: one plain line first, before any ratio
    assert "This machine is busy: the ratios below reflect the other programs more than DDP" in cpu
    assert cpu.index("This machine is busy") < cpu.index("speed.lines()")
    assert "DDP on 2 gloo ranks" in before and "one process of 2 intra-op threads" in before
    assert "A dot is one round: the one-thread step over that way's" in before
    assert "faster or slower only if all its rounds lie on one side of 1" in before  # as CpuRounds.verdict
    assert "speed.lines()" in cpu and "what its range shows" in cpu
    assert "1,024 rows" in before
    # what a busy machine does to the figure, on the main path, before it
    assert "How good is the model?" in main_of(TAGGED["checked"]).split("\n")[0]  # the model's check, titled


def test_the_cpu_figure_is_explained_by_what_is_counted_and_no_verdict():
    after = main_of(NB.cells[NB.cells.index(TAGGED["my-timing"]) + 1])
    assert "timing-why" in NB.cells[NB.cells.index(TAGGED["my-timing"]) + 1].metadata["tags"]
    # the times are shown and not read; what is said rests on counts
    assert after.startswith(
        "These times are for looking at, not for conclusions: a busy machine moves them. What the counts show"
    )
    # backward on the caller's thread and the slots' forwards in turn: DataParallel on a CPU uses one core
    assert (
        "thread that called `backward()` (the thread table) and its forwards in turn, one thread at a time"
        in after
    )
    # what the ranks do that the two threads do not: a process and thread each, and an all-reduce per step
    assert "ran all its backward nodes on its own thread (the rank lines)" in after  # thread evidence
    assert "all-reduces every gradient over gloo" in after
    # the two threads: what they do, and what they need, not how long they took
    assert "The two intra-op threads split each large operation and send no gradients" in after
    assert "they run side by side only on two free cores" in after
    # no ratio foretold and none judged here: the printed lines read each way's range themselves
    busy = "so a 2-thread ratio far under 1 likely means the cores were busy"
    assert busy in after  # how to read a ratio the load made, not a verdict on the ways
    for verdict in ("faster", "slower", "wins", "beats", "sits near 1", "below 1", "above 1"):
        assert verdict not in after.replace(busy, ""), verdict
    scope, _ = run("thread-table")
    if not scope["on_gpu"]:  # the counted evidence the prose rests on: every node on the caller thread
        assert scope["recorded"].roles == {"caller thread"}
    code = TAGGED["my-timing"].source  # the rank lines the prose names: each rank's nodes, its thread
    # each rank line says what it is: a DDP rank in its own process, and the yes/no question its value answers
    assert "DDP rank {r}, its own process" in code
    assert "did all {nodes} backward nodes run on the thread " in code and "that called backward()? {" in code


def test_the_gpu_cell_shows_torchs_dataparallel_on_a_cpu():
    """Without CUDA the cell shows what torch.nn.DataParallel does there (torch 2.13's data_parallel.py:
    no device ids, and forward returns ``self.module(*inputs, **kwargs)``), by running it."""
    import inspect

    from torch import nn

    cell = TAGGED["gpu-cards"]
    assert cell is TAGGED["against-torch"]  # one cell: the cards, the table, torch's DataParallel
    source = inspect.getsource(nn.DataParallel)
    assert "self.device_ids = []" in source and "return self.module(*inputs, **kwargs)" in source
    scope, printed = run("gpu-cards")
    if scope["on_gpu"]:
        pytest.skip("the CPU branch")
    assert printed.count("\n") == 2  # the set-up cell's line, then this cell's one line
    line = printed.splitlines()[-1]
    assert "device_ids here: []" in line and "its output is model(x)'s: True" in line
    assert "### On a GPU runtime" not in markdown()  # no heading over a one-line placeholder


def test_the_engine_and_reducer_asides_say_what_the_sources_say():
    text = markdown()
    assert "an AccumulateGrad per parameter to store its gradient" in text  # leaves, not ops
    assert "one node per op of forward" not in text
    assert "(`should_run_in_cpu_ready_queue`)" in text and "CPU, Meta or Lazy" in text
    assert "the deepest reentrant backward first, then the one with the highest sequence number" in text
    assert '"this sequence number is *thread local*"' in text
    import inspect

    import torch

    doc = " ".join(inspect.getsource(torch.nn.parallel.DistributedDataParallel).split())
    quoted = "`gradient_as_bucket_view` alone cannot avoid copies because the bucket view alias is destroyed every iteration"
    assert quoted.replace("`", "``") in doc and quoted in text
    assert "zero_grad(set_to_none=True)" in TAGGED["thread-table"].source  # the chapter calls it


def test_ddp_copies_no_parameters_per_step_but_syncs_buffers_and_the_mlp_has_none():
    scope, _ = run()
    text = markdown()
    assert (
        "it broadcasts the buffers from rank 0 (`forward_sync_buffers=True` by default in torch 2.13; `broadcast_buffers` before it), and this MLP has none"
        in text
    )
    assert not list(scope["model"].buffers())
    beside = main_of(NB.cells[NB.cells.index(TAGGED["copies"]) + 1])
    assert "but broadcasts buffers (BatchNorm's running statistics) before each forward" in beside
    _, printed = run("copies")
    assert printed.splitlines()[-1].endswith("buffers broadcast, 0 bytes")  # the MLP has none
    summary = text[text.index("## Summary") : text.index("## Exercises")]
    for mechanism in (
        "**The model is copied every step:**",
        "**GPU 0 does the serial work:** the model lives on it",
        "**A Python thread per replica:**",
        "**One machine:**",
    ):
        assert mechanism in summary
    from dpteach.measure import published

    [pair] = published.pairs(published.shipped()).values()
    measured, _ = published.pair_ratio(pair)
    said = f"In the published pair on 2 TITAN RTX, DataParallel took {100 * (measured - 1):.1f}% longer"
    assert said in summary and "users report the reverse too" in summary


# ---------------------------------------------------------------- the exercises


def test_each_exercise_calls_its_check_and_its_answer_states_what_the_check_accepts():
    import torch
    from torch import nn

    from dpteach.course import checks
    from dpteach.measure import costmodel

    scope, _ = run()
    for k, call in (
        (1, "checks.copied_per_step("),
        (2, "checks.ddp_also_copies("),
        (3, "checks.nodes_per_thread("),
        (4, "checks.wait_for_backward("),
        (5, "checks.bucket_count("),
    ):
        cell = TAGGED[f"exercise-{k}"]
        stub = cell.source.replace(
            "= ...", ": ..."
        )  # "predicted = ..." and {"DDP": ...}: what the learner fills
        assert call in cell.source and ": ..." in stub
        answer = NB.cells[NB.cells.index(cell) + 1]
        assert answer.source.startswith(f"<details><summary>Answer {k}</summary>")
    text = markdown()
    # Answer 1: the bytes the check counts on 4 slots
    model, x, slots = scope["model"], scope["x"], scope["slots"]
    assert checks.copied_per_step(26_238_976, model, x, [slots[0]] * 4).ok
    assert "26,238,976 bytes in all" in text and "3·8,396,800 = 25,190,400 bytes" in text
    # between GPUs the scatter copies the pieces bound for GPUs 1 to 3, as comm.traffic records them
    import dpteach

    with dpteach.comm.traffic() as moved:
        dpteach.comm.scatter(x, [x.device, "meta", "meta", "meta"])  # three pieces leave x's device
    assert moved.by_op() == {"scatter": 786_432} and [c.nbytes for c in moved.copies] == [262_144] * 3
    assert "3·262,144 = 786,432 bytes" in text
    # Answer 2: the parts the check reads off the timelines
    checks.reset()
    right = {"DataParallel": {"flatten", "reduce"}, "DDP": {"bucket 2"}}
    assert checks.wait_for_backward(right, scope["work"]).ok
    assert 'DataParallel: `{"flatten", "reduce"}`' in text and '`{"bucket 2"}`' in text
    # Answer 3: three buckets, with the bytes the answer states, as torch itself assigns them
    deep = nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(12)])
    assert checks.bucket_count(3, deep).ok
    work = costmodel.workload(deep, torch.randn(2, 1024))
    assert costmodel.buckets(work) == [4_198_400, 29_388_800, 16_793_600]
    for nbytes in ("4,198,400", "25,190,400", "29,388,800", "16,793,600"):
        assert nbytes in text
    # Answer 4: DDP makes none of DataParallel's moves for the MLP, and broadcasts only bn's buffers
    checks.reset()
    bn = nn.Sequential(nn.Linear(1024, 1024), nn.BatchNorm1d(1024))
    assert checks.ddp_also_copies({"model": set(), "bn": {"broadcast"}}, {"model": model, "bn": bn}).ok
    assert '`{"model": set(), "bn": {"broadcast"}}`' in text and "8,200 bytes for `bn`" in text
    assert sum(b.nbytes for b in bn.buffers()) == 8_200
    # Answer 3: the nodes each GPU's engine thread runs on 4 GPUs for `three`, as the check counts them;
    # `model`'s own counts (printed for 2 GPUs by the thread table) are not its answer
    three = {}
    exec(TAGGED["exercise-3"].source.split("answer =")[0], {**scope, "nn": nn}, three)
    right = {"cuda:0": 18, "cuda:1": 8, "cuda:2": 8, "cuda:3": 8}
    assert checks.nodes_per_thread(right, three["three"], x).ok
    assert '`{"cuda:0": 18, "cuda:1": 8, "cuda:2": 8, "cuda:3": 8}`' in text and "3 + 8 + 7 = 18" in text
    checks.reset()
    assert not checks.nodes_per_thread(
        {"cuda:0": 13, "cuda:1": 5, "cuda:2": 5, "cuda:3": 5}, three["three"], x
    ).ok
    checks.reset()


def test_the_opening_promises_what_the_exercises_practise_and_the_summary_agrees():
    """The opening's skills each have a checked exercise; its count of reasons is the summary's."""
    opening = flat(NB.cells[2].source)
    assert "counts or models four reasons for DDP" in opening and "It names a fifth, one machine" in opening
    text = markdown()
    summary = text[text.index("## Summary") : text.index("## Exercises")]
    counted = summary.split("four reasons, the same on every run:")[1].split("A fifth, named only.")[0]
    assert counted.count("- **") == 4 and "**One machine:**" in summary.split("A fifth, named only.")[1]
    code = " ".join(c.source for c in NB.cells if c.cell_type == "code")
    for skill, check in (
        ("say which of them DDP does not copy", "checks.ddp_also_copies("),
        ("read which thread runs each backward node", "checks.nodes_per_thread("),
    ):
        assert skill in opening and check in code, skill


def test_the_h200_prediction_is_asked_before_it_is_answered():
    """The A100 result is given with the question (it was printed with the timeline); the H200 one is not."""
    ask = main_of(NB.cells[NB.cells.index(TAGGED["mlp-breakdown"]) - 1]).split("**Predict:**")[1]
    assert "H200" in ask and "slower" not in ask and "latency" not in ask
    answer = main_of(NB.cells[NB.cells.index(TAGGED["mlp-breakdown"]) + 1])
    assert answer.startswith("No, with NCCL's latency charged (first table)")


# ---------------------------------------------------------------- over n: readable, and why


def test_the_over_n_figure_is_a_real_sized_step_and_the_prose_says_why_from_the_models_parts():
    """Fig 2 is GPT-2 small, the published pair's workload: DDP nearly n-fold, DataParallel behind, most
    on the T4, where the gather is a third of its step; the MLP's line is the model's own parts, as the
    cell prints them (costmodel.breakdown): on 4 H200s its all-reduces outlast the compute they save."""
    from dpteach.measure import costmodel

    scope, printed = run("over-n", "mlp-breakdown")
    assert scope["gpt2"] == costmodel.large_workload("gpt2-small").scaled(16)
    at_8 = {}
    for ax in scope["fig"].axes:
        assert not any("n times" in line.get_label() for line in ax.get_lines())
        lines = {line.get_label(): line.get_ydata() for line in ax.get_lines()}
        at_8[ax.get_title()] = (lines["DataParallel"][-1], lines["DDP"][-1])
        assert lines["DDP"][-1] > 7 and ax.get_ylim()[1] < 10  # the curves fill the panel
    lag = {title: ddp - dp for title, (dp, ddp) in at_8.items()}
    assert max(lag, key=lag.get).startswith("modelled, T4")
    t4 = costmodel.predict(scope["gpt2"], "T4", 8, "DataParallel", latency=True, thread_s=0.0)
    assert 0.3 < t4.seconds("gather") / t4.total_s < 0.37  # "a third of its modelled step at n = 8"
    for latency in (True, False):  # both tables: the verdict with the assumed latency, then without it
        assert costmodel.breakdown(scope["work"], ("A100-SXM", "H200-SXM"), 4, latency=latency) in printed
    without = costmodel.breakdown(scope["work"], ("A100-SXM", "H200-SXM"), 4)
    assert "without NCCL's latency" in without and without.endswith("quicker than one GPU")
    at = NB.cells.index(TAGGED["over-n"])
    intro, prose = (main_of(NB.cells[i]) for i in (at - 1, at + 1))  # what it shows before, the reading after
    assert "a third of its modelled step at n = 8" in prose and "**Predict:**" not in prose
    # the MLP's story ends before GPT-2's starts: its parts come in a predict-then-run of their own, right
    # after the timeline's reading, and the reading after them; then GPT-2's figure
    mlp = NB.cells.index(TAGGED["mlp-breakdown"])
    # the timeline, its reading, DDP's real buckets and their reading, the H200 question, its table
    assert mlp == NB.cells.index(TAGGED["ddp-buckets"]) + 3 == NB.cells.index(TAGGED["timeline"]) + 5
    assert mlp + 3 == at
    assert "breakdown(" not in TAGGED["over-n"].source
    prose = main_of(NB.cells[mlp + 1])
    assert "slower than one GPU's" in prose
    assert "Without the latency (second table) it is quicker: this one assumption flips the answer" in prose
    assert "falls behind" not in intro and "third" not in intro  # the figure first, then what it shows
    said = "on 4 H200s the all-reduces add more time after backward than splitting the compute saves"
    assert said in prose
    saved, after, plain = {}, {}, {}
    for gpu in ("A100-SXM", "H200-SXM"):
        ddp = costmodel.predict(scope["work"], gpu, 4, "DDP", latency=True)
        plain[gpu] = costmodel.predict(scope["work"], gpu, 1).total_s * 1e6
        compute = (ddp.seconds("forward") + ddp.seconds("backward")) / 4 * 1e6  # each GPU's share
        saved[gpu], after[gpu] = plain[gpu] - compute, ddp.total_s * 1e6 - compute
    assert saved["H200-SXM"] < after["H200-SXM"] and saved["A100-SXM"] > after["A100-SXM"]
    assert "H200-SXM: splitting the compute saves" in printed and "slower than one GPU" in printed
    # the model leaves out launches and Python: the prose reads the curves' shape
    assert max(plain.values()) < 300 and "models a real-sized step" in intro  # the figure names its inputs
    assert "read the shape, not the heights" in intro and "µs" not in prose + intro
    share = f"DataParallel's gather {t4.seconds('gather'):.3f} s of its {t4.total_s:.3f} s step (modelled)"
    assert printed.splitlines()[1] == f"T4, n = 8: {share}"  # the third, shown: the cell's first line
    read = main_of(NB.cells[at + 1])
    assert "is a third of its modelled step at n = 8 (printed above the figure)" in read
    # why NVLink keeps DataParallel near DDP for GPT-2: its compute, against the MLP's copies
    assert (
        "On NVLink the curves are closer: GPT-2's compute dwarfs the copies, unlike the MLP's short step"
        in read
    )
    for gpu in ("A100-SXM", "H200-SXM"):
        big = costmodel.predict(scope["gpt2"], gpu, 8, "DataParallel", latency=True, thread_s=0.0)
        small = costmodel.predict(scope["work"], gpu, 4, "DataParallel", latency=True, thread_s=0.0)
        assert costmodel._compute(big) > 0.5 * big.total_s > 0  # GPT-2: mostly compute
        assert costmodel._compute(small) < 0.5 * small.total_s  # the MLP: mostly copies
    assert (
        "(modelled from compute, bandwidth and NCCL's latency estimates only)"
        in scope["fig"]._suptitle.get_text()
    )


def test_exercise_3_states_the_bucket_rule_on_the_main_path():
    text = main_of(NB.cells[NB.cells.index(TAGGED["exercise-5"]) - 1])
    assert "a bucket closes on the tensor that takes it to or past its cap, so it can hold more" in text


def test_the_timeline_names_where_the_bytes_go_and_sets_both_wrappers_beside_one_gpu():
    """The shared row is labelled by where its bytes go; against_one prints one GPU's step beside
    DataParallel's and DDP's on 4 A100s (modelled), and the summary's speed-ups are those printed."""
    from dpteach.measure import costmodel

    scope, printed = run("timeline")
    _, top, bottom = scope["fig"].axes  # under the one-GPU step
    assert "to and from GPU 0\n(over the links)" in [t.get_text() for t in top.get_yticklabels()]
    assert "among all GPUs\n(over the links)" in [t.get_text() for t in bottom.get_yticklabels()]
    options = dict(latency=True, thread_s=0.0)
    plain = costmodel.predict(scope["work"], "A100-SXM", 1, **options).total_s
    ups = {}
    for strategy in costmodel.STRATEGIES:
        step = costmodel.predict(scope["work"], "A100-SXM", 4, strategy, **options).total_s
        line = next(x for x in printed.splitlines() if x.strip().startswith(f"{strategy} on 4 GPUs"))
        assert f"{step * 1e6:.0f} µs" in line and f"{plain / step:.2f}x one GPU's speed" in line
        ups[strategy] = plain / step
    assert re.search(rf"^  one GPU +{plain * 1e6:.0f} µs$", printed, flags=re.M)
    summary = next(flat(c.source) for c in NB.cells if c.source.startswith("## Summary"))
    assert summary.index("What you counted") < summary.index("published pair")  # counts first
    assert (
        f"{ups['DataParallel']:.2f}x one GPU's speed under DataParallel and {ups['DDP']:.2f}x under DDP"
        in summary
    )
    assert "the gathered outputs and the summed gradients land in its memory alone" in summary
    assert "starts every bucket's all-reduce but the last while backward runs" in summary


def test_against_one_is_the_plain_step_over_each_wrappers():
    """Hand-checkable: on infinitely fast links the copies cost nothing, so DDP's step is compute / n
    and its speed-up n; DataParallel's is n too once thread starts are free."""
    import dataclasses

    from dpteach.measure import costmodel

    work = costmodel.Workload(
        flops_fwd=1e12, flops_bwd=2e12, param_bytes=4_000, param_tensors=2, input_bytes=400,
        output_bytes=40, batch=8, grad_bytes=(2_000, 2_000),
    )  # fmt: skip
    fast = dataclasses.replace(costmodel.GPUS["A100-SXM"], link_bw=float("inf"), mem_bw=float("inf"))
    text = costmodel.against_one(work, fast, 4, thread_s=0.0)
    assert text.count("4.00x one GPU's speed") == 2, text
    plain = 3e12 / fast.rate("fp32", None)
    assert f"{plain * 1e6:8.0f} µs" in text.splitlines()[1]


def test_scatter_is_defined_where_it_first_appears():
    opening = flat(NB.cells[2].source)
    assert (
        "**scatters** the batch (cuts it into one piece per GPU and copies each piece to its GPU)" in opening
    )


# ---------------------------------------------------------------- what makes DataParallel's gap


def test_the_pairs_gap_is_split_part_by_part_and_the_reading_says_what_the_lines_print():
    """Beside the published pair: DataParallel's modelled parts beyond the compute, less what DDP's
    all-reduces add after backward, make the modelled gap, printed beside the measured one; the reading
    after the cell names the parts that make most of it, GPU 0's serial work, with the printed figures."""
    from dpteach.measure import costmodel, published

    shipped = published.shipped()
    _, printed = run("published-ratios")
    assert published.pair_gap(shipped, latency=True, thread_s=0.0) in printed
    [pair] = published.pairs(shipped).values()
    dp, ddp = (
        costmodel.predict(m.work_at(2), m.profile_at(2), 2, m.strategy, latency=True, thread_s=0.0)
        for m in pair
    )
    text = costmodel.gap(dp, ddp)
    rows = {k: float(v) for k, v in re.findall(r"^ {4}(\S.*?)\s+([\d.]+) ms$", text, flags=re.M)}
    parts = {k: v for k, v in rows.items() if k != "in all"}
    assert sum(parts.values()) == pytest.approx(rows["in all"], abs=0.15)  # the rows add up
    compute = dp.seconds("forward") / 2 + dp.seconds("backward") / 2
    assert rows["in all"] == pytest.approx((dp.total_s - compute) * 1e3, abs=0.05)
    measured_gap = (pair[0].points[0][1] - pair[1].points[0][1]) * 1e3
    assert f"DataParallel over DDP, measured {measured_gap:.1f} ms" in " ".join(printed.split())
    assert f"DataParallel over DDP {(dp.total_s - ddp.total_s) * 1e3:.1f} ms" in " ".join(text.split())
    # GPU 0's serial work (gather, replicate, reduce) is most of the modelled gap
    serial = sum(dp.seconds(name) for name in ("gather", "replicate", "reduce"))
    assert serial > 0.9 * (dp.total_s - ddp.total_s)
    reading = flat(
        NB.cells[NB.cells.index(TAGGED["published-ratios"]) + 1].source
    )  # its fold reads the lines
    assert (
        "<summary>The pair's gap, line by line</summary> Modelled, the pair's gap is GPU 0's serial work (the last lines)"
        in reading
    )
    gather, replicate = dp.seconds("gather") * 1e3, dp.seconds("replicate") * 1e3
    assert f"{gather:.1f} ms gathering both replicas' outputs onto it" in reading
    assert f"{dp.seconds('reduce') * 1e3:.1f}" == f"{replicate:.1f}"  # "each": the same figure
    assert (
        f"{replicate:.1f} ms each replicating the model out of it and reducing the gradients onto it"
        in reading
    )
    assert any("Python thread starts (assumed free)" in line for line in text.splitlines())  # as the timeline


def test_the_gap_is_the_thread_starts_alone_when_bytes_cost_nothing():
    """Hand-checkable: on infinitely fast links and memory, with no latency, every copy costs nothing,
    DDP's all-reduces add nothing after backward, and DataParallel's step is longer by its n serial
    thread starts alone."""
    import dataclasses

    from dpteach.measure import costmodel

    work = costmodel.Workload(
        flops_fwd=1e12, flops_bwd=2e12, param_bytes=4_000, param_tensors=2, input_bytes=400,
        output_bytes=40, batch=8, grad_bytes=(2_000, 2_000),
    )  # fmt: skip
    fast = dataclasses.replace(costmodel.GPUS["A100-SXM"], link_bw=float("inf"), mem_bw=float("inf"))
    steps = [costmodel.predict(work, fast, 4, s, thread_s=1e-3) for s in costmodel.STRATEGIES]
    text = costmodel.gap(*steps)
    assert "Python thread starts (4, assumed 1 ms each)" in text
    rows = {k: float(v) for k, v in re.findall(r"^ {4}(\S.*?)\s+([\d.]+) ms$", text, flags=re.M)}
    assert (
        rows.pop("in all") == pytest.approx(4.0)
        and rows.pop("Python thread starts (4, assumed 1 ms each)") == 4.0
    )
    assert set(rows.values()) == {0.0}
    assert "DDP, its all-reduces after backward 0.0 ms" in " ".join(text.split())
    with pytest.raises(ValueError, match="DataParallel's prediction, then DDP's"):
        costmodel.gap(steps[1], steps[0])


# ---------------------------------------------------------------- what fresh readers asked for


def test_the_exercises_follow_the_chapter_and_none_is_answered_above_it():
    """Copies, DDP's copies, threads, the timeline, buckets: the order the chapter teaches them. The thread
    exercise asks about `three`, whose counts no cell above prints (the thread table prints `model`'s)."""
    at = {k: NB.cells.index(TAGGED[f"exercise-{k}"]) for k in range(1, 6)}
    assert list(at.values()) == sorted(at.values())
    checks_in_order = [re.search(r"checks\.(\w+)\(", TAGGED[f"exercise-{k}"].source)[1] for k in range(1, 6)]
    assert checks_in_order == [
        "copied_per_step", "ddp_also_copies", "nodes_per_thread", "wait_for_backward", "bucket_count",
    ]  # fmt: skip
    for k in range(1, 5):  # each answer cell ends with the next question, numbered in turn
        after = NB.cells[at[k] + 1].source
        assert after.startswith(f"<details><summary>Answer {k}</summary>")
        assert after.split("</details>")[-1].strip().startswith(f"{k + 1}. **")
    above = " ".join(c.source for c in NB.cells[: at[3]])
    assert "three" not in TAGGED["thread-table"].source and "18" not in main_of(TAGGED["thread-table"])
    assert '"cuda:0": 18' not in above


def test_latency_and_the_trusted_table_are_on_the_main_path():
    section = main_of(NB.cells[NB.cells.index(TAGGED["timeline"]) - 1])
    assert "**Latency** is NCCL's fixed cost per call." in section
    read = main_of(NB.cells[NB.cells.index(TAGGED["mlp-breakdown"]) + 1])
    assert "Every NCCL call pays it, so trust the first, as a model" in read
    # the model's miss stands beside the speed-ups it qualifies, with the figures the timeline cell prints
    assert "as a model 4 to 22 times short of DDP's measured overhead (under the timeline)" in read
    _, printed = run("timeline")
    assert "the model gives 4 to 22 times too little of DDP's measured overhead" in printed
    assert printed.index("DDP on 4 GPUs") < printed.index("4 to 22 times too little")


def test_the_thread_reason_is_counted_not_timed_and_the_model_says_why_once():
    opening = flat(NB.cells[2].source)
    assert "and a thread per replica, counted, not timed." in opening
    text = markdown()
    assert text.count("since no measurement of them ships") == 1  # the why, in the timeline's fold


def test_ddp_overlaps_only_from_its_second_step_as_torch_buckets_it():
    """torch 2.13: find_unused_parameters=False or static_graph puts every parameter in one bucket at
    first (compute_bucket_size_limits); the reducer rebuilds once, after the first iteration."""
    import inspect
    import sys

    import torch
    from torch.nn.parallel import distributed

    config = distributed._BucketCapacityConfig.create(
        bucket_cap_mb=None, bucket_cap_mb_list=None, use_python_reducer=False
    )
    assert config.compute_bucket_size_limits(static_graph=False, find_unused_parameters=False)[0] == [
        sys.maxsize
    ]
    assert config.compute_bucket_size_limits(static_graph=True, find_unused_parameters=True)[0] == [
        sys.maxsize
    ]
    assert config.compute_bucket_size_limits(static_graph=False, find_unused_parameters=True)[0] == [
        torch.distributed._DEFAULT_FIRST_BUCKET_BYTES, 25 * 1024 * 1024,
    ]  # fmt: skip
    capped = distributed._BucketCapacityConfig.create(
        bucket_cap_mb=50, bucket_cap_mb_list=None, use_python_reducer=False
    )
    assert capped.compute_bucket_size_limits(static_graph=False, find_unused_parameters=False)[0] == [
        sys.maxsize
    ]
    assert (
        capped.first_bucket_bytes_cap == capped.bucket_bytes_cap
    )  # "a bucket_cap_mb given caps the first too"
    header = Path(torch.__file__).parent / "include/torch/csrc/distributed/c10d/reducer.hpp"
    assert "return (static_graph_ || !find_unused_parameters_) && !has_rebuilt_bucket_;" in header.read_text()
    assert "self.reducer._rebuild_buckets()" in inspect.getsource(
        distributed.DistributedDataParallel._pre_forward
    )
    text = markdown()
    for said in (
        "With `find_unused_parameters=False`, the default, or `static_graph=True`, and no "
        "`bucket_cap_mb_list`, its first step puts every gradient in one bucket, whatever `bucket_cap_mb`",
        "Before the second forward (`_pre_forward`) the reducer rebuilds the buckets, once",
        "`find_unused_parameters=True` alone uses both caps from the first step",
    ):
        assert said in text, said
    assert "In DDP's step (bottom), any after its first, each bucket's all-reduce starts" in text
    summary = text[text.index("## Summary") : text.index("## Exercises")]
    assert "from its second step DDP starts every bucket's all-reduce but the last" in summary


def test_sources_are_named_where_they_live_and_the_quote_is_attributed():
    text = markdown()
    assert "pytorch/pytorch's `torch/csrc/autograd/engine.cpp` (source only, not in the wheel)" in text
    assert "in pytorch/pytorch's `torch/csrc/autograd/engine.cpp` reads" in text
    assert "`engine.cpp`" not in text  # never as if torch 2.13's wheel shipped it
    # the comment on pytorch/pytorch#65936, byte-exact, with who wrote it
    assert 'micahcc "turned my trainer back to DataParallel and got a 25% training time speedup"' in text
    assert "25% shorter" not in text
    # the A100 profile's memory bandwidth is the 80 GB card's
    assert "2039 GB/s is the 80 GB A100's memory" in TAGGED["timeline"].source
    assert "the A100's 2,039 GB/s is the 80 GB card's" in text


def test_the_bucket_cell_prints_ddps_own_buckets_rebuilt_before_step_2():
    """Two DDP steps on 2 gloo ranks, as the cell runs them: one bucket in step 1, then buckets cut in the
    order backward made the gradients (last layer first), the same on both ranks; the reading says so."""
    from dpteach.distributed import order

    scope, printed = run("ddp-buckets")
    lines = printed.splitlines()
    assert lines[1].startswith("step 1: 1 bucket: ") and lines[2].startswith("step 2: ")
    assert lines[2].endswith("(rebuilt)") and "both ranks cut the same buckets: True" in printed
    first, second = (order.bucket_params(step) for step in scope["report"][0]["steps"])
    assert len(first) == 1 and len(second) > 1
    assert [p for bucket in second for p in bucket] == order.grad_order(scope["report"][0]["steps"][0])
    assert second[0][0].startswith("6.")  # the last layer's gradients come first
    reading = main_of(NB.cells[NB.cells.index(TAGGED["ddp-buckets"]) + 1])
    assert reading.startswith("No: step 1 had one bucket, sent after backward; DDP then rebuilt them")
    ask = main_of(NB.cells[NB.cells.index(TAGGED["ddp-buckets"]) - 1])
    assert ask.endswith("**Predict:** does DDP cut the same buckets in its first two steps?")
