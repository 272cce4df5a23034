"""Measured step times beside the cost model: published ones (``data/published.json``) and ours.

One loader, two formats, one result type (:class:`Measurement`):

* ``data/published.json``: figures read in a paper, a README or an issue thread, each with its
  citation, hardware, model, batch and the counted workload of one image;
* a ``bench.json`` from ``python -m dpteach.measure.bench`` (``scripts/gpu_check.sh``) run on a GPU
  machine, copied into ``data/ours/``: dpteach's DataParallel step per n, labelled as ours.

``compare(m)`` puts the model's prediction beside each measured point, with the ratio
measured / modelled: above 1, the real step was slower than the model says. Measurements that share
a ``pair`` (DataParallel and DDP on the same machine, model and batch) are also compared with each
other: ``pair_table`` prints DataParallel's step over DDP's, measured and modelled.

Every function here that predicts takes ``**options`` and hands them to ``costmodel.predict`` as
they are: ``latency=True`` adds each message's latency by NCCL's model, ``thread_s=0.0`` charges
nothing for DataParallel's thread starts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .costmodel import GPU, GPUS, STRATEGY_COLOURS, Workload, gap, large_workload, predict

__all__ = [
    "Measurement",
    "Row",
    "load",
    "shipped",
    "curves",
    "pairs",
    "compare",
    "unexplained",
    "table",
    "pair_ratio",
    "pair_table",
    "pair_gap",
    "ratios",
    "measured",
    "figure",
    "PUBLISHED",
    "OURS",
]

DATA = Path(__file__).with_name("data")
PUBLISHED = DATA / "published.json"
OURS = DATA / "ours"  # bench.json files from our own GPU runs


@dataclass(frozen=True)
class Measurement:
    """A measured curve: step seconds at each n, and what it ran (``gpu`` is a profile in ``GPUS``)."""

    id: str
    citation: str
    hardware: str
    gpu: str
    strategy: str
    model: str
    batch: int  # rows per GPU ("weak" scaling) or in all ("strong")
    scaling: str
    points: tuple[tuple[int, float], ...]
    workload: Workload | None
    ours: bool = False
    # DDP on one GPU, where the source gives it apart from the plain step at n = 1 (``points``)
    ddp_one_gpu_s: float | None = None
    # per n, how many links join the slowest hop of the ring the model runs, read from the machine's
    # topology (``nvidia-smi topo -m``); None: the profile's link_bw, all of its links
    ring_links: tuple[tuple[int, int], ...] | None = None
    # the name shared by a DataParallel and a DDP measurement of one set-up, compared with each other
    pair: str | None = None
    # what the source's figure is, in a few words (published.json "figure")
    figure: str = ""
    # machine and source in a line, for tables (published.json "in_short"); ``hardware`` and ``citation``
    # keep the whole provenance
    in_short: str = ""
    # the source does not name the GPU; ``gpu`` is read from elsewhere in it (published.json "gpu_inferred")
    gpu_inferred: bool = False

    @property
    def gpu_label(self) -> str:
        """How tables and figures name the GPU: "(inferred)" after it where the source does not name it."""
        return f"{self.gpu} (inferred)" if self.gpu_inferred else self.gpu

    def profile_at(self, n: int) -> GPU:
        """The GPU profile the model runs at ``n``: with the links of its ring's slowest hop, where read."""
        gpu = GPUS[self.gpu]
        return gpu.with_links(dict(self.ring_links)[n]) if self.ring_links and n > 1 else gpu

    @property
    def plain_at_one(self) -> bool:
        """Whether the point at n = 1 is the plain step, no DDP: the source timed DDP on one GPU apart."""
        return self.strategy == "DDP" and self.ddp_one_gpu_s is not None

    def n_label(self, n: int) -> str:
        """How a table or an axis names ``n``: "1 (no DDP)" where the point at n = 1 is the plain step."""
        return "1 (no DDP)" if n == 1 and self.plain_at_one else str(n)

    def work_at(self, n: int) -> Workload:
        """The workload of the whole step at ``n`` GPUs (weak scaling: ``batch`` rows per GPU)."""
        rows = self.batch * n if self.scaling == "weak" else self.batch
        return self.workload.scaled(rows)


def _workload(shipped: dict | str) -> Workload:
    """A dict is one row's counted workload; a name, a large model's from ``data/workloads.json``."""
    return large_workload(shipped) if isinstance(shipped, str) else Workload(**shipped)


def _published(data: dict, path: Path) -> list[Measurement]:
    out = []
    for m in data["measurements"]:
        missing = [
            k for k in ("citation", "hardware", "in_short", "gpu", "points", "workload") if not m.get(k)
        ]
        if missing:
            raise ValueError(f"{path}: measurement {m.get('id', '?')} lacks {', '.join(missing)}")
        if m["gpu"] not in GPUS:
            raise ValueError(f"{path}: {m['id']} ran on {m['gpu']!r}, which has no profile in gpus.json")
        out.append(
            Measurement(
                id=m["id"],
                citation=f"{m['citation']}, {m['url']}" if m.get("url") else m["citation"],
                hardware=m["hardware"],
                gpu=m["gpu"],
                strategy=m["strategy"],
                model=m["model"],
                batch=m["batch_per_gpu"] if m["scaling"] == "weak" else m["batch"],
                scaling=m["scaling"],
                points=tuple((p["n"], float(p["seconds"])) for p in m["points"]),
                workload=_workload(m["workload"]),
                ddp_one_gpu_s=m.get("ddp_one_gpu_seconds"),
                ring_links=tuple((int(n), k) for n, k in m.get("ring_links", {}).items()) or None,
                pair=m.get("pair"),
                figure=m.get("figure", ""),
                in_short=m["in_short"],
                gpu_inferred=bool(m.get("gpu_inferred", False)),
            )
        )
    return out


def _profile(device: str) -> str | None:
    """The profile a CUDA device name belongs to, e.g. "Tesla T4" -> "T4"; None when none does."""
    for name in GPUS:
        if name.split("-")[0].lower() in device.lower():
            return name
    return None


def _ours(data: dict, path: Path) -> list[Measurement]:
    from .scaling import label

    env, s = data["env"], data["scaling"]
    if s.get("kind") != "gpus":
        return []  # slots sharing one device or the CPU: nothing the GPU model predicts
    gpu = _profile(env["device"])
    work = s.get("workload")
    return [
        Measurement(
            id=f"ours-{path.stem}",
            citation=f"ours: {path.name}, {label(env)}",
            hardware=label(env).removeprefix("measured on "),
            gpu=gpu or env["device"],
            strategy="DataParallel",
            model=f"dpteach.measure.bench.mlp, {s['params'] / 1e6:.1f}M parameters",
            batch=s["batch"],
            scaling="strong",
            points=tuple(zip(s["slots"], s["dpteach_s"])),
            workload=Workload(**work) if work and gpu else None,
            ours=True,
        )
    ]


def load(path: str | Path) -> list[Measurement]:
    """Every measurement in ``path``: a ``published.json`` or one of our ``bench.json`` files."""
    path = Path(path)
    data = json.loads(path.read_text())
    if "measurements" in data:
        return _published(data, path)
    if "scaling" in data and "env" in data:
        return _ours(data, path)
    raise ValueError(
        f"{path} is neither a published.json (with 'measurements') nor a bench.json (with 'scaling')"
    )


def shipped() -> list[Measurement]:
    """The published measurements, then ours (``data/ours/*.json``, file-name order)."""
    ours = [m for p in sorted(OURS.glob("*.json")) for m in load(p)]
    return load(PUBLISHED) + ours


def curves(measurements: list[Measurement]) -> list[Measurement]:
    """The measurements that are curves over n, not one half of a DataParallel-and-DDP pair."""
    return [m for m in measurements if m.pair is None]


def pairs(measurements: list[Measurement]) -> dict[str, list[Measurement]]:
    """Each pair's measurements (DataParallel first), by the pair's name."""
    found: dict[str, list[Measurement]] = {}
    for m in measurements:
        if m.pair is not None:
            found.setdefault(m.pair, []).append(m)
    return {k: sorted(v, key=lambda m: m.strategy != "DataParallel") for k, v in found.items()}


@dataclass(frozen=True)
class Row:
    n: int
    measured_s: float
    modelled_s: float | None

    @property
    def ratio(self) -> float | None:
        return None if self.modelled_s is None else self.measured_s / self.modelled_s


def compare(m: Measurement, **options) -> list[Row]:
    """Each measured point beside the model's prediction for the same GPU profile, strategy, n and batch
    (``options`` to ``costmodel.predict``)."""
    if m.workload is None or m.gpu not in GPUS:
        return [Row(n, s, None) for n, s in m.points]
    return [
        Row(
            n,
            s,
            predict(m.work_at(n), m.profile_at(n), n, m.strategy, **options).total_s,
        )
        for n, s in m.points
    ]


def overhead(m: Measurement, **options) -> list[tuple[int, float, float]]:
    """DDP's per-step overhead at each n > 1: the step over the plain step at n = 1 (weak scaling: each
    GPU computes what the one GPU did), measured and modelled, in seconds, as ``(n, measured, modelled)``."""
    rows = {r.n: r for r in compare(m, **options)}
    if 1 not in rows:  # no plain step measured: no overhead over it
        return []
    return [
        (n, r.measured_s - rows[1].measured_s, r.modelled_s - rows[1].modelled_s)
        for n, r in rows.items()
        if n > 1
    ]


def unexplained(measurements: list[Measurement], **options) -> list[float]:
    """DDP's per-step overhead the model misses, in seconds, sorted: measured minus modelled (with NCCL's
    latency per message with ``latency=True``) at every n > 1 of every shipped DDP run with weak scaling, as
    ``gap_table`` prints them."""
    gaps = []
    for m in _with_plain_step(measurements):
        gaps += [got - before for _, got, before in overhead(m, **options)]
    return sorted(gaps)


def _with_plain_step(measurements: list[Measurement]) -> list[Measurement]:
    """DDP curves with weak scaling and a point at n = 1: the ones whose overhead over one GPU is known."""
    return [
        m
        for m in measurements
        if m.strategy == "DDP" and m.workload is not None and m.scaling == "weak" and m.gpu in GPUS
        and 1 in dict(m.points)
    ]  # fmt: skip


def gap_table(measurements: list[Measurement]) -> str:
    """Where the model misses DDP's measured per-step overhead, without and with NCCL's latency per message."""
    lines = [
        "DDP's overhead over the plain step, ms: measured, modelled without and with NCCL's latency model"
    ]
    lines.append(f"  {'':<10}{'n':>3}{'measured':>10}{'modelled':>10}{'+latency':>10}   measured/modelled")
    for m in _with_plain_step(measurements):
        name = m.model.split(",")[0].removeprefix("torchvision ")
        if m.ddp_one_gpu_s is not None:  # the source timed DDP on one GPU apart from the plain step
            extra = (m.ddp_one_gpu_s - dict(m.points)[1]) * 1e3
            lines.append(
                f"  {name:<10}{1:>3}{extra:>10.1f}{0:>10.2f}{0:>10.2f}   (DDP on 1 GPU: the model adds 0)"
            )
        for (n, got, before), (_, _, after) in zip(overhead(m), overhead(m, latency=True)):
            lines.append(
                f"  {name:<10}{n:>3}{got * 1e3:>10.1f}{before * 1e3:>10.2f}{after * 1e3:>10.2f}"
                f"   {got / before:5.0f}x -> {got / after:3.0f}x"
            )
    return "\n".join(lines)


def table(m: Measurement, **options) -> str:
    """A measurement and the model's prediction, per n, with measured / modelled."""
    who = "ours" if m.ours else "published"
    per = f"{m.batch} per GPU" if m.scaling == "weak" else f"{m.batch} in all"
    lines = [f"{m.model}, {m.strategy}, batch {per} ({who})", *_provenance(m)]
    if m.ring_links:
        lines.append(f"  {_links(m)}")
    width = max(len(m.n_label(n)) for n, _ in m.points)
    lines.append(f"  {'n':>{width}}  {'measured ms':>12}  {'modelled ms':>12}  {'measured/modelled':>18}")
    for r in compare(m, **options):
        model = "-" if r.modelled_s is None else f"{r.modelled_s * 1e3:12.1f}"
        ratio = "-" if r.ratio is None else f"{r.ratio:17.2f}x"
        lines.append(f"  {m.n_label(r.n):>{width}}  {r.measured_s * 1e3:12.1f}  {model:>12}  {ratio:>18}")
    if m.ddp_one_gpu_s is not None:
        plain = dict(m.points)[1]
        lines.append(
            f"  DDP on 1 GPU: {m.ddp_one_gpu_s * 1e3:.1f} ms measured, {m.ddp_one_gpu_s / plain - 1:+.1%} "
            "over the plain step (the model adds nothing at n = 1)"
        )
    return "\n".join(lines)


def _provenance(m: Measurement) -> list[str]:
    """Where ``m`` ran and who says so: one short line where the data file gives one, else the whole of it."""
    if m.in_short:
        return [f"  on {m.in_short} (the full citation: {PUBLISHED.name}, {m.id})"]
    return [f"  on {m.hardware}", f"  source: {m.citation}"]


def _links(m: Measurement) -> str:
    """What link the model gives each n of ``m``, in words: the links of its ring's slowest hop."""
    ns = ", ".join(str(n) for n, _ in m.ring_links)
    links = ", ".join(str(k) for _, k in m.ring_links)
    bws = ", ".join(f"{m.profile_at(n).link_bw / 1e9:.0f}" for n, _ in m.ring_links)
    return (
        f"modelled at n = {ns}: one ring, at its slowest hop's {links} NVLinks ({bws} GB/s one way), "
        "as the topology reads"
    )


def pair_ratio(pair: list[Measurement], **options) -> tuple[float, float]:
    """DataParallel's step over DDP's at the pair's n: measured, and modelled."""
    dp, ddp = pair
    [(n, dp_s)], [(_, ddp_s)] = dp.points, ddp.points
    modelled = [predict(m.work_at(n), m.profile_at(n), n, m.strategy, **options).total_s for m in pair]
    return dp_s / ddp_s, modelled[0] / modelled[1]


def pair_table(pair: list[Measurement], **options) -> str:
    """A DataParallel-and-DDP pair beside the model: each step measured and modelled, then DataParallel's
    step over DDP's, measured and modelled."""
    dp, ddp = pair
    per = f"{dp.batch} per GPU" if dp.scaling == "weak" else f"{dp.batch} in all"
    [(n, _)] = dp.points
    lines = [
        f"{dp.model}, DataParallel and DDP, batch {per} (published)",
        *_provenance(dp),
        f"  seconds per step on {n} GPUs:",
        f"  {'':<14}{'measured s':>11}{'modelled s':>12}{'measured/modelled':>19}",
    ]
    for m in pair:
        [r] = compare(m, **options)
        lines.append(f"  {m.strategy:<14}{r.measured_s:>11.3f}{r.modelled_s:>12.3f}{r.ratio:>18.2f}x")
    measured, modelled = pair_ratio(pair, **options)
    lines.append(f"  DataParallel's step / DDP's: measured {measured:.3f}, modelled {modelled:.3f}")
    lines.append(f"  ({dp.figure})")
    return "\n".join(lines)


def pair_gap(measurements: list[Measurement], **options) -> str:
    """For each DataParallel-and-DDP pair: where the model puts DataParallel's extra time, part by part
    (``costmodel.gap``), then the gap the pair measured."""
    blocks = []
    for dp, ddp in pairs(measurements).values():
        [(n, dp_s)], [(_, ddp_s)] = dp.points, ddp.points
        steps = [predict(m.work_at(n), m.profile_at(n), n, m.strategy, **options) for m in (dp, ddp)]
        text = gap(*steps)
        label = f"  {'DataParallel over DDP, measured':<{len(text.splitlines()[-1]) - len(' ms') - 10}}"
        per = f"{dp.batch} per GPU" if dp.scaling == "weak" else f"{dp.batch} in all"
        blocks.append(
            f"{dp.model.split(',')[0]}, batch {per}, the published pair:\n{text}\n{label}{(dp_s - ddp_s) * 1e3:8.1f} ms"
        )
    return "\n".join(blocks)


def ratios(measurements: list[Measurement], **options) -> str:
    """One compact table (under 80 characters wide): a row per run, a column per n, each cell the measured
    step over the modelled one; under a DDP curve with a plain step, the ms DDP's step adds over the plain
    step, measured / modelled; last, each pair's DataParallel step over DDP's. The steps themselves, in
    ms, are ``table``'s and ``pair_table``'s, and the figure draws them."""
    tag = ", NCCL's latency per message in" if options.get("latency") else ""
    if options.get("thread_s") == 0:
        tag += ";\n  DataParallel's thread starts not charged"
    ns = sorted({n for m in measurements for n, _ in m.points})
    runs = []  # (label, {n: cell}) in the order they ship, a second row for what DDP adds
    for m in measurements:
        name = m.model.split(",")[0].split(" (")[0].removeprefix("torchvision ")
        cells = {r.n: "-" if r.ratio is None else f"{r.ratio:.2f}x" for r in compare(m, **options)}
        runs.append((f"{name}, {m.strategy}, {m.gpu_label}", cells))
        if m.plain_at_one:
            added = {n: f"{got * 1e3:.1f}/{mod * 1e3:.2f}" for n, got, mod in overhead(m, **options)}
            runs.append(("  DDP adds (ms): measured/modelled", {1: "(no DDP)", **added}))
    width = max(len(label) for label, _ in runs)
    col = max(7, *(len(c) + 1 for _, cells in runs for c in cells.values()))
    lines = [
        f"measured step / modelled step{tag}",
        f"  {'run':<{width}}"
        + "".join(f"{('n = ' if i == 0 else '') + str(n):>{col}}" for i, n in enumerate(ns)),
    ]
    for label, cells in runs:
        lines.append((f"  {label:<{width}}" + "".join(f"{cells.get(n, ''):>{col}}" for n in ns)).rstrip())
    for pair in pairs(measurements).values():
        measured, modelled = pair_ratio(pair, **options)
        lines.append(
            f"  DataParallel's step / DDP's, {pair[0].gpu}: measured {measured:.3f}, modelled {modelled:.3f}"
        )
    return "\n".join(lines)


def measured(measurements: list[Measurement]) -> str:
    """What the measurements show, no model in it: each DDP curve's step per n and, with weak scaling,
    the samples per second at the widest n over one GPU's; each pair's DataParallel step over DDP's."""
    lines = []
    for m in curves(measurements):
        points = dict(m.points)
        steps = ", ".join(f"{points[n] * 1e3:.0f} ms at n = {m.n_label(n)}" for n in points)
        name = m.model.split(",")[0].removeprefix("torchvision ")
        lines.append(f"{name}, {m.strategy}, batch {m.batch} per GPU: {steps}")
        n = max(points)
        if m.scaling == "weak" and 1 in points and n > 1:  # each GPU takes the batch one GPU took
            up = n * points[1] / points[n]
            lines.append(
                f"  {n} GPUs take {n} times the samples per step: {up:.1f}x the samples per second of one"
            )
    for dp, ddp in pairs(measurements).values():
        [(n, dp_s)], [(_, ddp_s)] = dp.points, ddp.points
        lines.append(
            f"{dp.model.split(' (')[0]} on {n} {dp.gpu}: DataParallel {dp_s:.3f} s per step, DDP {ddp_s:.3f} s: "
            f"DataParallel's step {100 * (dp_s / ddp_s - 1):.1f}% longer (one run of each)"
        )
    return "\n".join(lines)


def draw_pair(pair: list[Measurement], ax=None, **options):
    """A DataParallel-and-DDP pair: each strategy's measured step (solid) beside its modelled one (hatched),
    measured / modelled above each pair of bars, and the two ratios of DataParallel's step to DDP's."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(4, 3.4))
    ticks, labels = [], []
    for i, m in enumerate(pair):
        [r] = compare(m, **options)
        colour = STRATEGY_COLOURS[m.strategy]  # as in the chapter's other figures
        ax.bar(i - 0.2, r.measured_s * 1e3, 0.38, color=colour)
        ax.bar(i + 0.2, r.modelled_s * 1e3, 0.38, color="white", edgecolor=colour, hatch="//")
        ax.text(i, r.measured_s * 1e3 * 1.02, f"{r.ratio:.2f}x", ha="center", va="bottom", fontsize=7)
        ticks += [i - 0.2, i + 0.2]
        labels += [f"{m.strategy}\nmeasured", f"{m.strategy}\nmodelled"]
    ax.set_xticks(ticks, labels, fontsize=7)
    ax.set_ylabel("ms per step")
    ax.set_ylim(0, max(r.measured_s for m in pair for r in compare(m, **options)) * 1e3 * 1.15)
    measured, modelled = pair_ratio(pair, **options)
    [(n, _)] = pair[0].points
    ax.set_title(
        f"{pair[0].model.split(' (')[0]} on {n} {pair[0].gpu}, published; above: measured/modelled\n"
        f"DataParallel / DDP: {measured:.3f} measured, {modelled:.3f} modelled",
        fontsize=8,
    )
    return ax


def draw(measurements: list[Measurement], ax=None, **options):
    """Measured (points) and modelled (line) step time against n, one colour per strategy and one marker
    and line style per measurement.

    A point at n = 1 that is the plain step (no DDP) is drawn hollow, and its tick and legend say so.
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 3.4))
    plain, ticks = [], {}
    markers = "o^sD"  # one colour per strategy (costmodel.STRATEGY_COLOURS); one marker per run
    for i, m in enumerate(measurements):
        colour, marker = STRATEGY_COLOURS.get(m.strategy, "#777777"), markers[i % len(markers)]
        rows = compare(m, **options)
        tag = "ours" if m.ours else "published"
        ticks.update({r.n: m.n_label(r.n) for r in rows})
        shown = [r for r in rows if not (r.n == 1 and m.plain_at_one)]
        ax.plot([r.n for r in shown], [r.measured_s * 1e3 for r in shown], marker, color=colour, ls="none",
                label=f"measured ({tag}): {m.model.split(',')[0]}, {m.strategy}, {m.gpu_label}")  # fmt: skip
        modelled = [(r.n, r.modelled_s * 1e3) for r in rows if r.modelled_s is not None]
        if modelled:
            links = ", NVLinks as read" if m.ring_links else ""
            ax.plot(*zip(*modelled), ["-", "--", ":", "-."][i % 4], color=colour, alpha=0.6,
                    label=f"modelled, {m.gpu_label}{links}")  # fmt: skip
        plain += [(r.n, r.measured_s * 1e3, marker) for r in rows if r.n == 1 and m.plain_at_one]
    for k, (n, ms, marker) in enumerate(plain):  # one legend entry for all of them
        ax.plot([n], [ms], marker, mfc="white", color=STRATEGY_COLOURS["plain"],
                label="measured at 1 (no DDP): the plain step" if k == 0 else "_nolegend_")  # fmt: skip
    ax.set_xticks(sorted(ticks), [ticks[n].replace(" (", "\n(") for n in sorted(ticks)])
    ax.set_xlabel("GPUs (n)")
    ax.set_ylabel("ms per step")
    ax.set_ylim(bottom=0)
    # beside the axes, not on them: inside, five entries would cover the lower half of the panel
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    ax.set_title("measured beside modelled (lines: the cost model)", fontsize=9)
    return ax


def figure(measurements: list[Measurement], **options):
    """Every measurement in one figure: a panel per DDP curve (measured points, the modelled line, each
    point's measured / modelled under it, the y axis from 0 so that a gap reads at its size),
    then a panel per DataParallel-and-DDP pair (``draw_pair``); one legend, under the panels."""
    import matplotlib.pyplot as plt

    runs, duos = curves(measurements), list(pairs(measurements).values())
    fig, axes = plt.subplots(1, len(runs) + len(duos), figsize=(3.6 * (len(runs) + len(duos)), 3.3),
                             squeeze=False, gridspec_kw={"width_ratios": [1.2] * len(runs) + [1] * len(duos)})  # fmt: skip
    axes = list(axes[0])
    for ax, m in zip(axes, runs):
        draw([m], ax=ax, **options)
        ax.get_legend().remove()  # one legend for the figure, below
        # from 0, as draw's: a y axis cut to the points makes a gap of a few percent look large
        ax.set_ylim(0, 1.12 * max(r.measured_s * 1e3 for r in compare(m, **options)))
        for r in compare(m, **options):
            if r.ratio is not None:
                ax.annotate(f"{r.ratio:.2f}x", (r.n, r.measured_s * 1e3), xytext=(0, -11),
                            textcoords="offset points", ha="center", fontsize=7)  # fmt: skip
        added = overhead(m, **options) if m.plain_at_one else []
        if added:  # what DDP adds over the plain step at the smallest n > 1: where the model misses
            n, got, mod = added[0]
            ax.set_title(f"{m.model.split(',')[0].removeprefix('torchvision ')} on {m.gpu_label}, DDP\n"
                         f"DDP adds at n = {n}: {got * 1e3:.1f} ms measured, {mod * 1e3:.2f} modelled", fontsize=8)  # fmt: skip
        else:
            ax.set_title(f"{m.model.split(',')[0]} on {m.gpu_label}, {m.strategy}", fontsize=8)
    for ax, pair in zip(axes[len(runs) :], duos):
        draw_pair(pair, ax=ax, **options)
        # narrower than draw_pair's own: a tick per strategy, the solid bar measured, the hatched modelled
        ax.set_xticks(range(len(pair)), [f"{m.strategy}\nmeasured, modelled" for m in pair], fontsize=7)
        measured, modelled = pair_ratio(pair, **options)
        [(n, _)] = pair[0].points
        ax.set_title(f"{pair[0].model.split(' (')[0]} on {n} {pair[0].gpu}; DataParallel / DDP:\n"
                     f"{measured:.3f} measured, {modelled:.3f} modelled", fontsize=8)  # fmt: skip
    handles, labels = {}, {}
    for ax in axes[: len(runs)]:
        for h, label in zip(*ax.get_legend_handles_labels()):
            key = label.split(":")[0].split(",")[0]  # "measured (published)", "modelled", the plain step
            handles.setdefault(key, h)
            labels.setdefault(key, "modelled (the cost model)" if key == "modelled" else key)
    fig.legend(list(handles.values()), list(labels.values()), loc="lower center", ncol=len(handles),
               fontsize=8, frameon=False)  # fmt: skip
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig
