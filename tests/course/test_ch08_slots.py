"""Chapter 08's slot lists: two lists of one length keep their own timings, and the table names them compactly.

Exercise 4 asks for ``scaling.scaling(model, x, [[0, 1], [0, 0]])``: both lists have two slots, and the
steps used to be keyed by the length alone, so the second overwrote the first without a word. CUDA is
faked here (availability patched, DataParallel constructors recorded): what is checked is the keying.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpteach.measure import scaling
from dpteach.measure.timer import Timing


def test_lists_of_one_length_get_names_of_their_own():
    assert scaling.names([[0], [0, 1], [0, 0]]) == ["1", "2 (cuda:0-1)", "2 (2 × cuda:0)"]
    assert scaling.names([["cpu"], ["cpu", "cpu"]]) == ["1", "2"]  # lengths alone tell these apart


def test_a_list_given_twice_is_refused_by_name():
    with pytest.raises(ValueError, match="more than once: 2 × cpu"):
        scaling.names([["cpu", "cpu"], ["cpu", "cpu"]])


def test_the_slots_column_is_compact():
    assert scaling.compact(["cuda:0", "cuda:1", "cuda:2", "cuda:3"]) == "cuda:0-3"
    assert scaling.compact(["cuda:0"] * 4) == "4 × cuda:0"
    assert scaling.compact(["cpu"]) == "cpu"
    assert scaling.compact(["cuda:1", "cuda:3"]) == "cuda:1, cuda:3"


@pytest.fixture
def two_fake_gpus(monkeypatch):
    """CUDA reported available with two devices; DataParallel constructors record their slots."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    built = []

    def ours(model, slots):
        built.append(("dpteach", [str(d) for d in slots]))
        return model

    def theirs(model, device_ids):
        built.append(("torch", list(device_ids)))
        return model

    monkeypatch.setattr(scaling, "DataParallel", ours)
    monkeypatch.setattr(nn, "DataParallel", theirs)
    return built


def test_two_gpus_and_two_slots_on_one_gpu_are_timed_apart(two_fake_gpus):
    model, x = nn.Linear(4, 2), torch.randn(4, 4)
    lists = [[0, 1], [0, 0]]
    fns = scaling.steps(model, x, lists)
    assert list(fns) == ["plain", "dpteach 2 (cuda:0-1)", "torch 2 (cuda:0-1)", "dpteach 2 (2 × cuda:0)"]
    assert two_fake_gpus == [
        ("dpteach", ["cuda:0", "cuda:1"]),
        ("torch", [0, 1]),
        ("dpteach", ["cuda:0", "cuda:0"]),
    ]
    times = {name: Timing([0.001 * (i + 1)]) for i, name in enumerate(fns)}  # each name its own median
    out = scaling.result(times, lists, model, x)
    assert out["dpteach_s"] == [0.002, 0.004] and out["torch_dp_s"] == [0.003, None]
    table = scaling.table(out)
    assert "cuda:0-1" in table and "2 × cuda:0" in table


def test_against_torch_on_two_gpus_prints_both_medians_and_no_verdict():
    """Chapter 08's cell on torch.nn.DataParallel, on a (faked) two-GPU machine: the two medians, no verdict."""
    import contextlib
    import io
    import types
    from pathlib import Path

    import nbformat

    root = Path(__file__).resolve().parents[2]
    cells = nbformat.read(root / "notebooks" / "08_real_gpus.ipynb", as_version=4).cells
    [cell] = [c for c in cells if "against-torch" in c.metadata.get("tags", [])]
    fake_nn = types.SimpleNamespace(DataParallel=lambda model: types.SimpleNamespace(device_ids=[0, 1]))
    fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(device_count=lambda: 0))
    fake_scaling = types.SimpleNamespace(table=lambda result: "")
    result = {"slots": [1, 2], "dpteach_s": [0.010, 0.030], "torch_dp_s": [0.010, 0.010]}
    scope = {"on_gpu": True, "torch": fake_torch, "scaling": fake_scaling, "nn": fake_nn, "model": None}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(cell.source, {**scope, "result": result})
    printed = out.getvalue()
    assert "-> 2 GPUs: dpteach 30.00 ms, torch.nn.DataParallel 10.00 ms (medians)" in printed
    assert not any(word in printed for word in ("slower", "faster", "about the same"))
