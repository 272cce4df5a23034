"""Chapter 08's scaling figure draws only a ceiling the run could reach, and a run's kind counts every list.

The "n times faster" line belongs to n separate GPUs; CPU slots split only the forward, so their
ceiling is the forward-only bound; slots on one GPU get neither. No timing is asserted: the medians
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


def test_cpu_slots_get_the_forward_only_bound_and_no_n_times_line():
    fig = scaling.draw(run("cpu"), forward_s=0.010)
    shown = labels(fig)
    assert "best with only the forward split n ways" in shown
    assert not [label for label in shown if label.startswith("n times faster")]
    bound = fig.axes[1].lines[shown.index("best with only the forward split n ways")]
    assert list(bound.get_ydata()) == pytest.approx([1.0, 0.030 / (0.030 - 0.010 + 0.010 / 2)])
    assert "best with only the forward split n ways" not in labels(scaling.draw(run("cpu")))


def test_slots_on_one_gpu_get_no_ideal_line_and_separate_gpus_do():
    assert not [label for label in labels(scaling.draw(run("one gpu"), forward_s=0.01)) if "faster" in label]
    shown = labels(scaling.draw(run("gpus", slots=(1, 2, 3), steps=(0.03, 0.02, 0.015))))
    assert "n times faster (n separate GPUs)" in shown
    assert "best with only the forward split n ways" not in shown


def test_the_kind_of_a_run_counts_the_gpus_of_every_list():
    cuda = [torch.device("cuda", 0), torch.device("cuda", 1)]
    assert scaling._kind([cuda, [cuda[0], cuda[0]]]) == "gpus"  # exercise 4's [[0, 1], [0, 0]]
    assert scaling._kind([[cuda[0], cuda[0]], cuda]) == "gpus"  # whatever the order
    assert scaling._kind([[cuda[0]], [cuda[0], cuda[0]]]) == "one gpu"
    assert scaling._kind([[torch.device("cpu")] * 2]) == "cpu"


@pytest.mark.parametrize("noise, band", [(None, 1.2), (1.1, 1.2), (1 / 1.5, 1.5), (1.5, 1.5)])
def test_the_grey_band_widens_to_the_measured_noise_margin_never_below_claims_margin(noise, band):
    from dpteach.course.claims import MARGIN

    assert MARGIN == 1.2  # the parametrized bands assume it
    fig = scaling.draw(run("cpu"), noise=noise)
    (patch,) = [p for p in fig.axes[1].patches if "about the same" in p.get_label()]
    box = patch.get_bbox()  # axhspan: a rectangle, x in axes units, y in data units
    assert box.y0 == pytest.approx(1 / band) and box.y1 == pytest.approx(band)
    assert ("measured noise margin" in patch.get_label()) == (band != MARGIN)
