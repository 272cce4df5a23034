"""``python -m dpteach.measure.bench``: what replication costs, measured on this machine. A benchmark, not a test.

Writes ``bench.json``, ``bench.png`` and ``scaling.png`` to ``--out`` (default ``artifacts/bench``):

1. replicate a ~100 MB model to 2 slots against a plain copy of the same bytes (the memory bound);
2. clone-then-``.to`` against ``.to`` (PR #20995), for every pair of places this machine has;
3. per-tensor against coalesced copies of many small tensors;
4. a DataParallel step against the same model's plain step (an MLP of about 4M parameters, batch 512),
   with the phase breakdown;
5. with CUDA: dpteach against ``torch.nn.DataParallel`` on the same GPUs;
6. scaling: the step of 4 on 1 ... N slots (``dpteach.measure.scaling``), plain and, on distinct
   GPUs, ``torch.nn.DataParallel`` at every n; drawn in ``scaling.png``. On one GPU the batch is 512
   rows, as in chapter 08, so that the copies its shared slots add are not buried under the compute. A ``bench.json`` from a real
   GPU machine, copied into ``dpteach/measure/data/``, is what chapter 08 draws beside the learner's own.

Every figure is a median over repeats, timed in turns by ``dpteach.measure.timer`` (one intra-op
thread per CPU slot); ratios are of medians. ``--quick`` shrinks the
sizes for CI. On Linux the allocator is first told to keep freed memory (glibc ``mallopt``): otherwise
each large copy may or may not pay the kernel's page faults, depending on what ran before, and two
runs of the very same copy differed by 4x here (16 against 67 ms for 100 MB). ``--page-faults``
leaves the allocator alone.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import dataclasses
import json
import platform
import sys
import time
from pathlib import Path

import torch
from torch import nn

from .. import comm
from .._course import VERSION as __version__
from .._devices import default_devices
from ..data_parallel import DataParallel
from ..replicate import STRATEGIES, replicate
from ..replicate.clone import clone_tensor
from . import costmodel, scaling
from .profile import profile_step
from .timer import time_in_turns


def steady_allocator() -> bool:
    """Ask glibc to keep freed memory in the heap (no mmap, no trim), so copies measure bandwidth."""
    name = ctypes.util.find_library("c")
    if not sys.platform.startswith("linux") or not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # from <malloc.h>
        return bool(libc.mallopt(M_MMAP_THRESHOLD, 1 << 30)) and bool(
            libc.mallopt(M_TRIM_THRESHOLD, (1 << 31) - 1)
        )
    except (OSError, AttributeError):
        return False


def big_model(mbytes: float, device) -> nn.Module:
    """Square Linear layers adding up to about ``mbytes`` MB of float32 parameters."""
    width = 2048
    per_layer = (width * width + width) * 4 / 1e6
    layers = max(1, round(mbytes / per_layer))
    return nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)]).to(device)


def mlp(hidden: int, device) -> nn.Module:
    """``1024 -> hidden -> 1024``: about ``2048 * hidden`` parameters (4.2M for hidden=2048)."""
    return nn.Sequential(nn.Linear(1024, hidden), nn.ReLU(), nn.Linear(hidden, 1024)).to(device)


def n_params(module: nn.Module) -> int:
    """The number of scalars in ``module``'s parameters (``widgets.cost.width_numel`` gives it for a width)."""
    return sum(p.numel() for p in module.parameters())


def replicate_vs_copy(devices, mbytes, repeats) -> dict:
    model = big_model(mbytes, devices[0])
    params = list(model.parameters())
    nbytes = sum(comm.nbytes(p) for p in params)
    others = devices[1:]
    fns = {  # the reference: the same tensors copied by hand to every other slot, nothing else (the memory bound)
        "copy": lambda: [p.detach().to(d, copy=True) for d in others for p in params],
        **{s: (lambda s=s: replicate(model, devices, strategy=s)) for s in STRATEGIES},
    }
    med = {name: t.median for name, t in time_in_turns(fns, devices, repeats).items()}
    out = {"model_bytes": nbytes, "slots": [str(d) for d in devices], "plain_copy_s": med["copy"]}
    for strategy in STRATEGIES:
        out[strategy] = {"replicate_s": med[strategy], "ratio_to_copy": med[strategy] / med["copy"]}
    return out


def time_clone_then_to(mbytes, repeats) -> list[dict]:
    places = [("cpu", "cpu")]
    if torch.cuda.is_available():
        places += [("cpu", "cuda:0"), ("cuda:0", "cuda:0")]
        if torch.cuda.device_count() > 1:
            places.append(("cuda:0", "cuda:1"))
    rows = []
    for src, dst in places:
        t = torch.randn(int(mbytes * 1e6) // 4, device=src)
        dst_dev = torch.device(dst)
        both = [src, dst]
        fns = {"a": lambda: clone_tensor(t, dst_dev), "b": lambda: t.to(dst_dev, copy=True)}
        med = time_in_turns(fns, both, repeats)
        a, b = med["a"].median, med["b"].median
        rows.append(
            {"src": src, "dst": dst, "bytes": comm.nbytes(t), "clone_then_to_s": a, "to_s": b, "ratio": a / b}
        )
    return rows


def per_tensor_vs_coalesced(n_tensors, numel, repeats) -> list[dict]:
    places = [("cpu", "cpu")]
    if torch.cuda.is_available():
        places.append(("cpu", "cuda:0"))
        if torch.cuda.device_count() > 1:
            places.append(("cuda:0", "cuda:1"))
    rows = []
    for src, dst in places:
        tensors = [torch.randn(numel, device=src) for _ in range(n_tensors)]
        dst_dev = torch.device(dst)
        both = [src, dst]
        med = time_in_turns(
            {
                "per": lambda: [t.to(dst_dev, copy=True) for t in tensors],
                "co": lambda: comm._coalesced_copy(tensors, dst_dev, comm.BUFFER_SIZE),
            },
            both,
            repeats,
        )
        per, co = med["per"].median, med["co"].median
        rows.append(
            {
                "src": src,
                "dst": dst,
                "tensors": n_tensors,
                "numel": numel,
                "per_tensor_s": per,
                "coalesced_s": co,
                "ratio": co / per,
            }
        )
    return rows


def step_vs_plain(devices, hidden, batch, repeats) -> dict:
    model = mlp(hidden, devices[0])
    x = torch.randn(batch, 1024, device=devices[0])

    def plain():
        model.zero_grad(set_to_none=True)
        model(x).float().pow(2).mean().backward()

    dp = DataParallel(model, devices)

    def parallel():
        model.zero_grad(set_to_none=True)
        dp(x).float().pow(2).mean().backward()

    med = time_in_turns({"plain": plain, "dp": parallel}, devices, repeats)
    plain_s, dp_s = med["plain"].median, med["dp"].median
    profile = profile_step(model, x, devices, repeats=repeats)
    return {
        "params": n_params(model),
        "batch": batch,
        "slots": [str(d) for d in devices],
        "plain_step_s": plain_s,
        "dp_step_s": dp_s,
        "ratio": dp_s / plain_s,
        "phases_median_s": profile.medians,
        "bytes_per_step": profile.bytes_by_op,
    }


def against_torch(hidden, batch, repeats) -> dict | None:
    """dpteach against torch.nn.DataParallel on the same GPUs (needs CUDA)."""
    if not torch.cuda.is_available():
        return None
    n = torch.cuda.device_count()
    ids = list(range(n))
    model = mlp(hidden, "cuda:0")
    x = torch.randn(batch, 1024, device="cuda:0")
    theirs = nn.DataParallel(model, device_ids=ids)
    ours = DataParallel(
        model, ids
    )  # like with like: the same GPUs, one slot each (one GPU: both pass through)

    def step(net):
        def run():
            model.zero_grad(set_to_none=True)
            net(x).float().pow(2).mean().backward()

        return run

    slots = [torch.device("cuda", i) for i in ids]
    steps = {"plain_s": step(model), "torch_dp_s": step(theirs), "dpteach_s": step(ours)}
    if n == 1:
        steps["dpteach_two_slots_s"] = step(DataParallel(model, ["cuda:0", "cuda:0"]))
    med = time_in_turns(steps, slots, repeats)
    out = {
        "gpus": n,
        "gpu_name": torch.cuda.get_device_name(0),
        "params": n_params(model),
        "batch": batch,
        **{name: t.median for name, t in med.items()},
        "dpteach_slots": [str(d) for d in ours.device_ids],
    }
    if n == 1:
        out["note"] = (
            "one GPU: torch.nn.DataParallel and dpteach with one slot both run the module itself "
            "(no replicas), so torch_dp_s and dpteach_s compare like with like; dpteach_two_slots_s "
            "is dpteach with two slots on cuda:0, replicating every step, which torch cannot do"
        )
    return out


def _paired_bars(ax, rows, first, second, title) -> None:
    """Two bars per source->destination pair: ``first`` and ``second`` are (key, label)."""
    xs = range(len(rows))
    for offset, (key, label) in ((-0.2, first), (0.2, second)):
        ax.bar([i + offset for i in xs], [x[key] * 1e3 for x in rows], 0.4, label=label)
    ax.set_xticks(list(xs), [f"{x['src']}→{x['dst']}" for x in rows])
    ax.set_ylabel("ms (median)")
    ax.set_title(title)
    ax.legend(fontsize=8)


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    r = results["replicate_vs_copy"]
    ax = axes[0][0]
    names = ["plain copy", *STRATEGIES]
    vals = [r["plain_copy_s"]] + [r[s]["replicate_s"] for s in names[1:]]
    colours = {"plain copy": "#999999", "broadcast": "#2b83ba", "rewire": "#abdda4", "clone": "#d7191c"}
    ax.bar(names, [v * 1e3 for v in vals], color=[colours.get(n, "#777777") for n in names])
    ax.set_ylabel("ms (median)")
    ax.set_title(f"replicate {r['model_bytes'] / 1e6:.0f} MB to {len(r['slots'])} slots ({r['slots'][0]})")

    _paired_bars(
        axes[0][1],
        results["clone_then_to"],
        ("clone_then_to_s", "clone then .to (before #20995)"),
        ("to_s", ".to (after)"),
        "one copy or two",
    )
    rows = results["per_tensor_vs_coalesced"]
    _paired_bars(
        axes[1][0],
        rows,
        ("per_tensor_s", "per tensor"),
        ("coalesced_s", "coalesced (10 MiB buckets)"),
        f"{rows[0]['tensors']} small tensors of {rows[0]['numel']} floats",
    )

    ax = axes[1][1]
    s = results["step_vs_plain"]
    bottom = 0.0
    for phase, sec in s["phases_median_s"].items():
        ax.bar(["DataParallel step"], [sec * 1e3], bottom=bottom, label=phase)
        bottom += sec * 1e3
    ax.bar(["plain step"], [s["plain_step_s"] * 1e3], color="#999999")
    ax.set_ylabel("ms (median)")
    ax.set_title(f"MLP {s['params'] / 1e6:.1f}M params, batch {s['batch']}, {len(s['slots'])} slots")
    ax.legend(fontsize=8)
    fig.suptitle(f"dpteach {__version__} on {results['env']['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(out: Path, quick: bool = False, repeats: int | None = None, page_faults: bool = False) -> dict:
    devices = default_devices()
    steady = False if page_faults else steady_allocator()
    on_gpu = devices[0].type == "cuda"
    repeats = repeats or (5 if quick else 15)
    mb = 8 if quick else 100
    results = {
        "env": {
            "dpteach": __version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "device": torch.cuda.get_device_name(0)
            if on_gpu
            else f"CPU ({torch.get_num_threads()} threads; timed with 1 per slot)",
            "gpus": torch.cuda.device_count() if on_gpu else 0,
            "cuda": torch.version.cuda if on_gpu else None,
            "slots": [str(d) for d in devices],
            "repeats": repeats,
            "statistic": "median",
            "allocator": "glibc keeps freed memory (mallopt)"
            if steady
            else "as it comes (page faults included)",
            "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        },
        "replicate_vs_copy": replicate_vs_copy(devices, mb, repeats),
        "clone_then_to": time_clone_then_to(mb / 4, repeats),
        "per_tensor_vs_coalesced": per_tensor_vs_coalesced(64 if quick else 256, 4096, repeats),
        "step_vs_plain": step_vs_plain(
            devices,
            512 if quick else (8192 if on_gpu else 2048),
            64 if quick else (4096 if on_gpu else 512),
            repeats,
        ),
        "against_torch": against_torch(512 if quick else 8192, 64 if quick else 4096, repeats),
    }
    # on one GPU, 512 rows as in chapter 08: its slots share the card, and at 4096 rows the compute hides their copies
    several = torch.cuda.is_available() and torch.cuda.device_count() > 1
    hidden, batch = (512, 64) if quick else ((8192, 4096 if several else 512) if on_gpu else (2048, 512))
    start = scaling.slot_lists()[0][0]
    model, x = mlp(hidden, start), torch.randn(batch, 1024, device=start)
    results["scaling"] = scaling.scaling(model, x, repeats=repeats)
    # what the step costs, counted: the cost model's input, so published.load can set ours beside it
    results["scaling"]["workload"] = dataclasses.asdict(costmodel.workload(model, x))
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(results, indent=2))  # the format published.load reads
    plot(results, out / "bench.png")
    _plot_scaling(results, out / "scaling.png")
    return results


def _plot_scaling(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = scaling.draw(results["scaling"])
    fig.suptitle(f"dpteach {__version__}, {scaling.label(results['env'])}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary(results: dict) -> str:
    r, s = results["replicate_vs_copy"], results["step_vs_plain"]
    lines = [
        f"device: {results['env']['device']}, slots {', '.join(results['env']['slots'])}, medians of "
        f"{results['env']['repeats']}, allocator: {results['env']['allocator']}",
        f"replicate {r['model_bytes'] / 1e6:.0f} MB to {len(r['slots'])} slots: plain copy {r['plain_copy_s'] * 1e3:.1f} ms; "
        + "; ".join(
            f"{k} {r[k]['replicate_s'] * 1e3:.1f} ms ({r[k]['ratio_to_copy']:.2f}x)" for k in STRATEGIES
        ),
    ]
    for row in results["clone_then_to"]:
        lines.append(
            f"clone-then-.to vs .to {row['src']}->{row['dst']}: {row['clone_then_to_s'] * 1e3:.2f} vs {row['to_s'] * 1e3:.2f} ms ({row['ratio']:.2f}x)"
        )
    for row in results["per_tensor_vs_coalesced"]:
        lines.append(
            f"coalesced vs per-tensor {row['src']}->{row['dst']}: {row['coalesced_s'] * 1e3:.2f} vs {row['per_tensor_s'] * 1e3:.2f} ms ({row['ratio']:.2f}x)"
        )
    lines.append(
        f"DataParallel step vs plain ({s['params'] / 1e6:.1f}M params, batch {s['batch']}): "
        f"{s['dp_step_s'] * 1e3:.1f} vs {s['plain_step_s'] * 1e3:.1f} ms ({s['ratio']:.2f}x)"
    )
    sc = results["scaling"]
    lines.append(
        f"scaling over {', '.join(map(str, sc['slots']))} slots ({sc['kind']}): plain {sc['plain_s'] * 1e3:.1f} ms; dpteach "
        + ", ".join(f"{t * 1e3:.1f}" for t in sc["dpteach_s"])
        + " ms"
        + (
            "; torch.nn.DataParallel "
            + ", ".join("-" if t is None else f"{t * 1e3:.1f}" for t in sc["torch_dp_s"])
            + " ms"
            if any(t is not None for t in sc["torch_dp_s"])
            else ""
        )
    )
    t = results.get("against_torch")
    if t:
        lines.append(
            f"vs torch.nn.DataParallel on {t['gpus']} x {t['gpu_name']}: dpteach {t['dpteach_s'] * 1e3:.2f} ms "
            f"({', '.join(t['dpteach_slots'])}), torch {t['torch_dp_s'] * 1e3:.2f} ms, plain {t['plain_s'] * 1e3:.2f} ms"
            + (
                f"; dpteach on two slots of cuda:0 {t['dpteach_two_slots_s'] * 1e3:.2f} ms (replicating)"
                if "dpteach_two_slots_s" in t
                else ""
            )
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dpteach.measure.bench", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--out", type=Path, default=Path("artifacts/bench"))
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats")
    parser.add_argument("--repeats", type=int)
    parser.add_argument(
        "--page-faults", action="store_true", help="leave the allocator alone (see the docstring)"
    )
    args = parser.parse_args(argv)
    results = run(args.out, args.quick, args.repeats, args.page_faults)
    print(summary(results))
    print(f"wrote {args.out / 'bench.json'}, {args.out / 'bench.png'} and {args.out / 'scaling.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
