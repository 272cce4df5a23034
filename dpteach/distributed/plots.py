"""Chapter 09's pictures: step time against model size, this machine's rounds of four ways to run a
step on its CPU, DDP's buckets in backward's order (and on one run's clock), and the modelled steps,
whole and outside their compute.

Each function returns the matplotlib ``Figure`` and draws its own legend into it.
"""

from __future__ import annotations

from typing import Mapping, Sequence


def _pyplot():
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("the plots need matplotlib: pip install matplotlib") from None
    return plt


def _count(n: int) -> str:
    """12_345 -> '12.3k', 2_100_000 -> '2.1M'."""
    return f"{n / 1e6:.3g}M" if n >= 1e6 else f"{n / 1e3:.3g}k" if n >= 1e3 else str(n)


def step_times(
    results: Mapping[str, Mapping[int, float]],
    title: str = "",
    params: Mapping[int, int] | None = None,
    rounds: Sequence[Mapping[str, Mapping[int, float]]] | None = None,
):
    """One line per way of training: median milliseconds per step against the hidden width.

    ``results`` maps a label ("one process", "DataParallel", "DDP") to ``{hidden: seconds}``;
    ``params`` (hidden -> parameter count) labels the x axis with model sizes too. ``rounds``, the
    per-round results the medians were taken over (each shaped like ``results``), adds an error bar
    from the fastest to the slowest round at every point; the lines are nudged sideways so the bars
    do not hide each other.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    markers = "osD^v"
    nudges = [2 ** (0.06 * (i - (len(results) - 1) / 2)) for i in range(len(results))] if rounds else None
    for i, ((label, times), marker) in enumerate(zip(results.items(), markers)):
        hiddens = sorted(times)
        xs = [h * nudges[i] for h in hiddens] if nudges else hiddens
        ys = [times[h] * 1e3 for h in hiddens]
        line = ax.plot(xs, ys, marker=marker, label=label)[0]
        if rounds:
            low = [min(r[label][h] for r in rounds) * 1e3 for h in hiddens]
            high = [max(r[label][h] for r in rounds) * 1e3 for h in hiddens]
            yerr = [[y - lo for y, lo in zip(ys, low)], [hi - y for y, hi in zip(ys, high)]]
            ax.errorbar(xs, ys, yerr=yerr, fmt="none", ecolor=line.get_color(), capsize=3, lw=1)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    from matplotlib.ticker import FuncFormatter  # plain "2" and "0.5" ms, not "2x10^0"

    def plain(v, _pos):  # label 1, 2 and 5 of each decade, so the minor labels do not crowd
        return f"{v:g}" if f"{v:.0e}"[0] in "125" else ""

    ax.yaxis.set_major_formatter(FuncFormatter(plain))
    ax.yaxis.set_minor_formatter(FuncFormatter(plain))
    hiddens = sorted(next(iter(results.values())))
    ax.set_xticks(hiddens)
    ax.set_xticklabels([f"{h}\n({_count(params[h])} params)" if params else str(h) for h in hiddens])
    ax.set_xlabel("hidden width")
    ax.set_ylabel("median ms per training step (log)")
    ax.set_title(title or "Step time: median over repeats (lower is faster)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(title="how the step runs")
    fig.tight_layout()
    return fig


def cpu_rounds(result, title: str = "", load=None):
    """Every round of ``compare.cpu_rounds`` as a dot per way of running the step, the median marked.

    ``load``: ``(cores, before, after)``, the cores this process may use and the one-minute load average
    before and after the rounds (``os.getloadavg()[0]``), written under the title: on a busy machine
    other programs hold the cores that the ranks and threads need.

    The y value is the per-round ratio: the first kind's step (one process, one thread) over this
    kind's, both timed in the same round, so above the dashed line at 1 this kind's step took less
    time in that round. A short bar marks each kind's median, its value written beside it; the dots'
    spread is how far the rounds moved on this machine, and says nothing of why. Under each kind's name,
    what their range shows (``CpuRounds.reading``): a gap only when every round lies on one side of 1.
    """
    import statistics

    plt = _pyplot()
    kinds = [k for k in result.seconds if k != result.baseline]
    fig, ax = plt.subplots(figsize=(7.2, 4.0))
    for x, kind in enumerate(kinds):
        ratios = result.ratios(kind)
        # the rounds spread a little sideways, in the order they ran, so equal ones do not hide each other
        xs = [x + 0.2 * (i / max(1, len(ratios) - 1) - 0.5) for i in range(len(ratios))]
        ax.plot(xs, ratios, "o", color="tab:blue", alpha=0.7, label="one round" if x == 0 else None)
        median = statistics.median(ratios)
        ax.plot([x - 0.22, x + 0.22], [median] * 2, color="black", lw=2.5, label="median" if x == 0 else None)
        ax.annotate(f" {median:.2f}x", (x + 0.22, median), va="center", fontsize=9)
        # what the dots' range shows, as the printed lines say it: a gap only when all lie on one side of 1;
        # on two lines, the verdict then what it rests on, so that three fit side by side
        said = result.reading(kind).replace(": ", ":\n", 1)
        ax.annotate(said, (x, 0), xycoords=("data", "axes fraction"), xytext=(0, -20), textcoords="offset points",
                    ha="center", va="top", fontsize=7, color="#555555")  # fmt: skip
    ax.axhline(1.0, color="grey", linestyle="--", lw=1, label=f"{result.baseline} (= 1)")
    ax.set_xticks(range(len(kinds)), kinds, fontsize=9)
    ax.set_xlim(-0.5, len(kinds) - 0.3)
    ax.set_ylim(0, max(1.2, 1.1 * max(max(result.ratios(k)) for k in kinds)))
    ax.set_ylabel(f"{result.baseline}'s step\n/ this step, per round", fontsize=9)
    n = len(result.seconds[result.baseline])
    ax.set_title(
        title
        or f"This machine's CPU, {n} rounds: MLP {result.depth} x {result.hidden}, batch {result.global_batch}\n"
        f"({result.baseline}'s step over each's; above 1: that step took less time)"
        + (
            f"\n{load[0]} cores; load average {load[1]:.1f} before the rounds, {load[2]:.1f} after"
            if load
            else ""
        ),
        fontsize=9,
    )
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=3, frameon=False)
    fig.tight_layout()
    return fig


def _label_right(ax, y: float, text: str, pad: float, fontsize: float) -> None:
    """``text`` beside row ``y``, right of the plot area (``pad`` points out), never clipped."""
    ax.annotate(
        text,
        xy=(1.0, y),
        xycoords=("axes fraction", "data"),
        xytext=(pad, 0),
        textcoords="offset points",
        va="center",
        fontsize=fontsize,
        annotation_clip=False,
    )


def buckets(report: Mapping, title: str = ""):
    """Backward on one rank, on this run's clock: when each gradient became ready (dots) and each
    bucket's all-reduce (bars). The times move from run to run; ``bucket_order`` draws the order.

    ``report`` is one rank's result of the ``"buckets"`` task. A bar that starts before the last dot
    is communication overlapping computation: DDP's reason for buckets. A dotted line marks where
    backward's last node had run: left of it is computation, right of it to the dashed line
    (``loss.backward()`` returning) is DDP waiting for the all-reduces still in flight.
    """
    plt = _pyplot()
    rows = report["buckets"]
    fig, ax = plt.subplots(figsize=(9.5, 1.9 + 0.7 * len(rows)))
    ms = 1e3
    end = report["backward"] * ms
    for i, b in enumerate(rows):
        ax.barh(
            i,
            (b["done"] - b["sent"]) * ms,
            left=b["sent"] * ms,
            height=0.5,
            color="tab:orange",
            label="all-reduce of the bucket (sent to done)" if i == 0 else None,
        )
        ready = [report["ready"][n] * ms for n in b["params"] if n in report["ready"]]
        # one dot per gradient, each a little lower than the last: gradients ready at the same
        # moment (a layer's weight and bias) would otherwise hide behind one another
        offsets = [0.36 * (k / (len(ready) - 1) - 0.5) if len(ready) > 1 else 0.0 for k in range(len(ready))]
        ax.plot(
            ready,
            [i + o for o in offsets],
            "o",
            markersize=5,
            color="tab:blue",
            zorder=3,
            label="a gradient is ready" if i == 0 else None,
        )
        # the label sits right of the plot, past the dashed line, so nothing crosses it
        grads = f"{len(b['params'])} gradient{'s' if len(b['params']) != 1 else ''}"
        _label_right(ax, i, f"{grads}, {b['bytes'] / 1024:.0f} KiB: {', '.join(b['params'])}", 6, 8)
    if "nodes_done" in report:  # compute ends here; from here to the dashed line DDP waits for all-reduces
        done = report["nodes_done"] * ms
        ax.axvline(done, color="tab:green", linestyle=":", lw=2, label="backward's last node done")
        ax.axvspan(
            done,
            end,
            color="grey",
            alpha=0.15,
            lw=0,
            zorder=0,
            label="no node left: DDP waits for the all-reduces",
        )
    ax.axvline(end, color="black", linestyle="--", label="loss.backward() returns")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"bucket {b['index']}" for b in rows])
    # bucket 0 on top: it holds the last layers, whose gradients come first
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlabel("milliseconds since backward began")
    ax.set_xlim(0, end * 1.05)
    ax.set_title(title or f"DDP buckets (bucket_cap_mb={report['bucket_cap_mb']}) on one rank")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.32), ncol=2, fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


# what each backward node of a Linear / Tanh / MSE stack computes, in words, and the autograd class
# that runs it (the names the event lines print)
_READABLE = {
    "MseLossBackward0": "MSE\nloss",
    "AddmmBackward0": "Linear\nx·Wᵀ+b",
    "TBackward0": "transpose\nof W",
    "TanhBackward0": "Tanh",
}


def _readable(node: str) -> str:
    """'AddmmBackward0' -> 'Linear x·Wᵀ+b': what the node's forward op did; else the op's name."""
    return _READABLE.get(node, node.removesuffix("0").removesuffix("Backward"))


def bucket_order(steps: Mapping[str, Mapping], title: str = ""):
    """Buckets placed in backward's order, not on a clock: the same picture on every run.

    ``steps`` maps a label to one step of ``tasks.bucket_order`` or ``tasks.scratch_order`` (the data
    ``order.wait_table`` prints). The x axis counts backward's nodes as they start: node k fills
    [k - 1, k], and every other event sits at the number of nodes that had started before it. A bar
    runs from a bucket's launch to the point where backward has its sum (DDP's one wait after the last
    node; ours, the blocking ``all_reduce``'s return): the nodes above a bar ran while that all-reduce
    was allowed to be in flight. A label whose bars all have no length gets one row of diamonds.
    """
    from . import order

    plt = _pyplot()
    first = next(iter(steps.values()))
    nodes = [e[1] for e in first["events"] if e[0] == "node"]

    def at(step, i):  # the nodes that had started before event i
        return sum(e[0] == "node" for e in step["events"][:i])

    rows = []  # (tick label, right-hand label, [(launch, result)])
    for label, s in steps.items():
        spans = [(b, at(s, b["at"]), at(s, b["result_at"])) for b in order.in_flight(s)]
        if all(start == end for _, start, end in spans):
            where = "returns before the next node" if not spans[0][0]["waited"] else "waited for at once"
            rows.append((label, f"{label}: {len(spans)} all-reduces, each {where}", [x[1:] for x in spans]))
            continue
        for b, start, end in spans:
            kib = f"{b['bytes'] / 1024:.0f} KiB"
            rows.append((f"{label} bucket {b['index']}", f"{', '.join(b['params'])} ({kib})", [(start, end)]))
    fig, ax = plt.subplots(figsize=(11, 2.3 + 0.4 * len(rows)))
    # the top row: backward's nodes, green where one of the first label's buckets was out
    busy = {i for b in order.in_flight(first) for i in b["ran_at"]}
    starts = [i for i, e in enumerate(first["events"]) if e[0] == "node"]
    for k, (name, index) in enumerate(zip(nodes, starts)):
        ax.barh(-1.2, 0.94, left=k + 0.03, height=0.9, color="tab:green" if index in busy else "#cccccc")
        ax.text(k + 0.5, -1.2, _readable(name), ha="center", va="center", fontsize=6.5, linespacing=1.1)
    for y, (_, text, spans) in enumerate(rows):
        for start, end in spans:
            ax.barh(y, end - start, left=start, height=0.5, color="tab:orange")
            ax.plot([start], [y], "D", color="tab:red", markersize=5, zorder=3, clip_on=False)
            ax.plot([end], [y], "|", color="black", markersize=14, markeredgewidth=2, zorder=3, clip_on=False)
        _label_right(ax, y, text, 8, 7.5)
    ax.set_yticks([-1.2] + list(range(len(rows))), ["backward"] + [r[0] for r in rows], fontsize=8)
    ax.set_ylim(len(rows) - 0.5, -1.8)
    ax.set_xlim(0, len(nodes))
    ax.set_xticks(range(len(nodes) + 1))
    ax.set_xlabel("backward's nodes started so far (an order, not a clock)")
    ax.grid(True, axis="x", alpha=0.3)
    handles = [
        plt.Line2D([], [], marker="D", color="tab:red", ls="none", label="all-reduce launched"),
        plt.Line2D(
            [],
            [],
            marker="|",
            color="black",
            ls="none",
            markersize=12,
            markeredgewidth=2,
            label="backward has the sum",
        ),
        plt.Rectangle((0, 0), 1, 1, color="tab:orange", label="sum may still be out"),
        plt.Rectangle(
            (0, 0), 1, 1, color="tab:green", label=f"node run while a {next(iter(steps))} bucket is out"
        ),
    ]
    ax.legend(
        handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=4, fontsize=8, frameon=False
    )
    ax.set_title(title or "Backward's order on rank 0: the same on every run and every rank", fontsize=10)
    fig.tight_layout()
    return fig


def _outside(pred) -> tuple[list, list]:
    """``pred``'s parts outside GPU 0's forward and backward: those on the step's path (every part that
    is not forward or backward, each kind once per moment however many GPUs run it) and DDP's
    all-reduces that end before backward does, which run beside it."""
    backward_end = max(p.end for p in pred.parts if p.name == "backward")
    seen, path, beside = set(), [], []
    for p in sorted(pred.parts, key=lambda p: p.start):
        if p.name in ("forward", "backward") or (p.name, p.start, p.seconds) in seen:
            continue
        seen.add((p.name, p.start, p.seconds))
        (beside if p.name == "all-reduce" and p.end < backward_end else path).append(p)
    return path, beside


def _whole(pred) -> list:
    """``pred``'s step laid end to end: the parts on its path (``_outside``) with GPU 0's forward and backward
    put back, each before the first part that starts once it has ended; their lengths add up to the total."""
    path, _ = _outside(pred)
    compute = [p for p in pred.parts if p.lane == "GPU 0" and p.name in ("forward", "backward")]
    # a compute part sits where it ends (and before a part that starts right then); any other, where it starts
    return sorted(path + compute, key=lambda p: (p.end, 0) if p in compute else (p.start, 1))


def _thin_labels(names: Mapping, widest: Mapping, thin: float) -> list[str]:
    """The legend's labels: each part's name, marked where even its widest bar is under ``thin``."""
    return [f"{n} (too thin to see)" if widest[n] < thin else n for n in names]


def _outside_panels(plt, axes, predictions: Mapping, first_title: str = "") -> None:
    """One panel per strategy on ``axes`` (one shared x-axis): the parts of its step outside GPU 0's forward
    and backward, laid end to end; DDP's second row is the buckets whose all-reduce runs beside backward.
    ``first_title`` goes before the first panel's title."""
    from ..measure import costmodel

    ms = 1e3
    for ax, (strategy, pred) in zip(axes, predictions.items()):
        path, beside = _outside(pred)
        rows = [("on the step's path", path, 1.0)] + ([("beside backward", beside, 0.45)] if beside else [])
        names: dict = {}
        for y, (_, parts, alpha) in enumerate(rows):
            left = 0.0
            for p in parts:
                name = "thread start" if p.name.startswith("start thread") else p.name
                colour = costmodel.part_colour(p.name)
                ax.barh(
                    y, p.seconds * ms, left=left, height=0.6, color=colour, alpha=alpha, edgecolor="white"
                )
                names.setdefault(name, colour)
                left += p.seconds * ms
            reduces = [p for p in parts if p.name == "all-reduce"]
            if reduces:  # the buckets, named on their own row
                label = (
                    f"{len(reduces)} buckets' all-reduces, while backward runs"
                    if y
                    else "the last bucket's all-reduce, after backward"
                )
                ax.text(left, y, f"  {label}", va="center", fontsize=8)
        ax.set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=8)
        ax.set_ylim(len(rows) - 0.5, -0.5)
        outside = sum(p.seconds for p in path) * ms
        ax.set_title(
            (first_title if ax is axes[0] else "")
            + f"{strategy} on {pred.n} GPUs: {outside:.3g} ms of its modelled step lie outside GPU 0's"
            f" forward and backward",
            fontsize=9,
        )
        handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in names.values()]
        widest = {
            n: max(
                p.seconds
                for p in path + beside
                if n in (p.name, "thread start") and (p.name == n or p.name.startswith("start thread"))
            )
            for n in names
        }
        thin = 0.005 * max(sum(p.seconds for p in _outside(q)[0]) for q in predictions.values())
        ax.legend(
            handles,
            _thin_labels(names, widest, thin),
            fontsize=7,
            loc="upper left",
            bbox_to_anchor=(1.01, 1),
            frameon=False,
        )
    axes[-1].set_xlabel(
        "ms (modelled; parts laid end to end, in the order they run; the compute cut out)", fontsize=8
    )


def outside_compute(predictions: Mapping):
    """Modelled steps with GPU 0's forward and backward cut out: one panel per strategy, on one axis.

    The top row of each panel is what lies on the step's path besides the compute, its parts laid end
    to end in the order they run; DDP's second row is the buckets whose all-reduce runs beside backward.
    """
    plt = _pyplot()
    fig, axes = plt.subplots(len(predictions), 1, figsize=(9, 1.5 + 1.3 * len(predictions)), sharex=True)
    _outside_panels(plt, axes, predictions)
    fig.tight_layout()
    return fig


def modelled_steps(predictions: Mapping):
    """Modelled steps (``costmodel.predict``, by strategy), first whole, then with the compute cut out.

    The top panel lays each whole step end to end on one axis, GPU 0's forward and backward included, so
    its bars compare as the totals do: DataParallel's over DDP's is the ratio ``compare.modelled_steps``
    prints. Most of each bar is compute, and most other parts are too thin to see beside it; the panels
    below (``outside_compute``'s) cut the compute out and draw those parts on a scale of their own.
    """
    from ..measure import costmodel

    plt = _pyplot()
    fig = plt.figure(figsize=(9, 3.0 + 1.3 * len(predictions)))
    grid = fig.add_gridspec(len(predictions) + 1, 1, height_ratios=[1.4] + [1.0] * len(predictions))
    whole = fig.add_subplot(grid[0])
    below = [fig.add_subplot(grid[1])]
    below += [fig.add_subplot(grid[i + 1], sharex=below[0]) for i in range(1, len(predictions))]
    ms, names, widest = 1e3, {}, {}
    for y, pred in enumerate(predictions.values()):
        left = 0.0
        for p in _whole(pred):
            name = "thread start" if p.name.startswith("start thread") else p.name
            colour = costmodel.part_colour(p.name)
            whole.barh(y, p.seconds * ms, left=left, height=0.6, color=colour, edgecolor="white", lw=0.3)
            if p.name in ("forward", "backward"):  # wide enough to name inside
                middle = left + p.seconds * ms / 2
                whole.text(
                    middle, y, f"GPU 0's {p.name}", ha="center", va="center", fontsize=8, color="white"
                )
            names.setdefault(name, colour)
            widest[name] = max(widest.get(name, 0.0), p.seconds)
            left += p.seconds * ms
        whole.text(left, y, f"  {pred.total_s * ms:.4g} ms", va="center", fontsize=8)
    totals = [pred.total_s for pred in predictions.values()]
    whole.set_yticks(
        range(len(predictions)), [f"{s} on {p.n} GPUs" for s, p in predictions.items()], fontsize=8
    )
    whole.set_ylim(len(predictions) - 0.5, -0.5)
    whole.set_xlim(0, 1.12 * max(totals) * ms)  # room for the totals beside the bars
    if {"DataParallel", "DDP"} <= set(predictions):
        ratio = predictions["DataParallel"].total_s / predictions["DDP"].total_s
        said = f": DataParallel's step is {ratio:.3f} times DDP's"
    else:
        said = ""
    whole.set_title(f"The whole modelled step, compute included{said}", fontsize=9)
    whole.set_xlabel("ms (modelled; each step's parts laid end to end, in the order they run)", fontsize=8)
    # the parts wide enough to see at this scale (forward and backward are named on their bars)
    seen = [n for n in names if n not in ("forward", "backward") and widest[n] >= 0.005 * max(totals)]
    handles = [plt.Rectangle((0, 0), 1, 1, color=names[n]) for n in seen]
    handles.append(plt.Line2D([], [], ls="none"))
    labels = [*seen, "every other part: too thin\nat this scale (zoomed in below)"]
    whole.legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    _outside_panels(plt, below, predictions, first_title="Zoomed in, the compute cut out. ")
    fig.tight_layout()
    return fig
