"""How long building and drawing the autograd graph of a ResNet-18-sized model takes, and against torchviz.

    python scripts/bench_graph.py [--runs 51] [--svg]

Measured separately: walking the graph (``autograd_graph``), making the DOT text (collapsed by
module, and every node), and, with ``--svg``, Graphviz laying it out as SVG. Cases: the model on
one device, and under ``"rewire"`` on two CPU slots (twice the backward nodes, plus ReduceAdd).
torchvision is not needed: the ResNet-18 below is built from nn.Conv2d / BatchNorm2d / residual blocks.

When torchviz is installed (``pip install torchviz``; it is not a dependency), each case also times
graph + DOT text (``autograd_graph(out, ...).dot``) against torchviz's ``make_dot(out,
params=dict(model.named_parameters())).source`` on the same output, in turns (one run of each,
alternating which goes first), and reports both medians and their ratio, by the wall clock and by
the process's CPU time (what other programs on a busy machine do not stretch).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from torch import nn

from dpteach.graph import autograd_graph, replicated_forward


class BasicBlock(nn.Module):
    """conv-bn-relu-conv-bn plus the input (through a 1x1 conv when the shape changes): torchvision's block."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


class ResNet18(nn.Module):
    """ResNet-18's layout (2-2-2-2 basic blocks, 62 parameter tensors) at a small width, so it runs fast on a CPU."""

    def __init__(self, width: int = 8, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        chans = [width, width, 2 * width, 4 * width, 8 * width]
        for i in range(1, 5):
            stride = 1 if i == 1 else 2
            setattr(
                self,
                f"layer{i}",
                nn.Sequential(BasicBlock(chans[i - 1], chans[i], stride), BasicBlock(chans[i], chans[i])),
            )
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(chans[4], classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def in_turns(ours, theirs, runs: int) -> dict[str, tuple[float, float]]:
    """Medians (ms) of ``ours`` and ``theirs`` timed in turns, by wall clock and by this process's CPU."""
    times: dict[str, tuple[list[float], list[float]]] = {"wall": ([], []), "cpu": ([], [])}
    for i in range(runs):
        pair = ((0, ours), (1, theirs)) if i % 2 == 0 else ((1, theirs), (0, ours))
        for which, fn in pair:
            wall, cpu = time.perf_counter(), time.process_time()
            fn()
            times["cpu"][which].append((time.process_time() - cpu) * 1000)
            times["wall"][which].append((time.perf_counter() - wall) * 1000)
    return {clock: (statistics.median(a), statistics.median(b)) for clock, (a, b) in times.items()}


def median_ms(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=51)
    parser.add_argument("--svg", action="store_true", help="also time Graphviz's layout to SVG")
    args = parser.parse_args()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{os.cpu_count()} CPUs, load average {load:.1f} (a busy machine stretches every figure below)")
    torch.manual_seed(0)
    model = ResNet18()
    x = torch.randn(4, 3, 32, 32)
    cases = {"one device": (model(x).pow(2).mean(), None)}
    loss, replicas = replicated_forward(model, x, ["cpu", "cpu"], "rewire")
    cases["rewire, 2 slots"] = (loss, replicas)
    try:
        from torchviz import make_dot
    except ImportError:  # optional: pip install torchviz
        make_dot = None
        print("torchviz is not installed (pip install torchviz): no comparison with make_dot")
    params = dict(model.named_parameters())
    for name, (out, reps) in cases.items():
        g = autograd_graph(out, module=model, replicas=reps)
        ops = sum(n.kind in ("op", "join") for n in g.nodes.values())
        print(f"{name}: {len(g.nodes)} nodes ({ops} backward functions), {len(g.edges)} edges")
        if make_dot is not None:
            medians = in_turns(
                lambda: autograd_graph(out, module=model, replicas=reps).dot,
                lambda: make_dot(out, params=params).source,
                args.runs,
            )
            for clock, (ours, theirs) in medians.items():
                print(
                    f"  graph + DOT vs torchviz make_dot, {clock:>4}: median {ours:6.2f} ms vs "
                    f"{theirs:6.2f} ms, ratio {ours / theirs:.2f} ({args.runs} runs each, in turns)"
                )
        build = median_ms(lambda: autograd_graph(out, module=model, replicas=reps), args.runs)
        print(f"  autograd_graph (walk, name, facts)   median {build:7.1f} ms")
        for label, kwargs in (
            ("DOT, default (auto-collapse)", {}),
            ("DOT, collapse=2", {"collapse": 2}),
            ("DOT, every node", {"collapse": False, "max_nodes": None}),
        ):
            ms = median_ms(
                lambda: autograd_graph(out, module=model, replicas=reps).draw(**kwargs).dot, args.runs
            )
            print(f"  build + {label:<30} median {ms:7.1f} ms")
            if args.svg:
                drawing = g.draw(**kwargs)
                svg = median_ms(lambda: g.draw(**kwargs).svg(), max(3, args.runs // 2))
                print(f"    SVG layout by dot ({len(drawing.view.nodes)} nodes drawn)  median {svg:7.1f} ms")


if __name__ == "__main__":
    main()
