"""The scaling figure draws the "n times faster" line only for n separate GPUs, and a run's kind counts every list.

CPU slots and slots on one GPU get no such line. No timing is asserted: the medians
below are invented numbers fed to ``draw``.
"""

from __future__ import annotations

import pytest
import torch

from dpteach.measure import scaling

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")


def run(kind, slots=(1, 2), plain=0.030, steps=(0.031, 0.036)):
    return {
        "kind": kind,
        "params": 1000,
        "batch": 8,
        "slots": list(slots),
        "plain_s": plain,
        "dpteach_s": list(steps),
        "torch_dp_s": [None] * len(slots),
    }


def labels(fig):
    return [line.get_label() for line in fig.axes[1].lines]


def test_cpu_slots_get_no_n_times_line():
    assert not [label for label in labels(scaling.draw(run("cpu"))) if label.startswith("n times faster")]


def test_slots_on_one_gpu_get_no_ideal_line_and_separate_gpus_do():
    assert not [label for label in labels(scaling.draw(run("one gpu"))) if "faster" in label]
    shown = labels(scaling.draw(run("gpus", slots=(1, 2, 3), steps=(0.03, 0.02, 0.015))))
    assert "n times faster (n separate GPUs)" in shown


def test_the_kind_of_a_run_counts_the_gpus_of_every_list():
    cuda = [torch.device("cuda", 0), torch.device("cuda", 1)]
    assert scaling._kind([cuda, [cuda[0], cuda[0]]]) == "gpus"  # exercise 4's [[0, 1], [0, 0]]
    assert scaling._kind([[cuda[0], cuda[0]], cuda]) == "gpus"  # whatever the order
    assert scaling._kind([[cuda[0]], [cuda[0], cuda[0]]]) == "one gpu"
    assert scaling._kind([[torch.device("cpu")] * 2]) == "cpu"
