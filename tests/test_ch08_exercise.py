"""Chapter 08's exercise 3 (PR #20995, one copy instead of two) runs on CPU, and its check can fail and pass.

The chapter's own cells are run, as the learner runs them: the stub as shipped must get "Not yet",
the worked answer below must get "Correct!", and each wrong answer its own hint.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
CELLS = {c.id: c.source for c in nbformat.read(ROOT / "notebooks" / "08_real_gpus.ipynb", as_version=4).cells}
STUB, CHECK, COUNT = CELLS["a4f2d6c1"], CELLS["e9b3a8d5"], CELLS["3b5c9e70"]

SOLUTION = '''
def copy_once(tensor, device):
    """A replica's copy of `tensor` on `device`, in ONE copy, with memory of its own (PR #20995)."""
    tensor = tensor.detach()
    return tensor.to(device) if tensor.device != device else tensor.clone()  # FIX (#20995)
'''
ALIAS = "def copy_once(tensor, device):\n    return tensor.detach().to(device)\n"  # no copy on its own device


def run(*sources: str) -> str:
    import torch
    from torch import nn

    import dpteach

    scope = {
        "torch": torch,
        "nn": nn,
        "dpteach": dpteach,
        "model": nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3)),
    }
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for source in sources:
            exec(compile(source, "<cell>", "exec"), scope)
    return out.getvalue()


def test_the_count_shows_two_copies_per_tensor_for_the_meta_slot():
    printed = run(COUNT)  # 2 parameters and 3 buffers of BatchNorm, plus Linear's 2 parameters
    assert "7 tensors" in printed
    assert "clone  onto cpu   14" in printed and "to     onto meta  7" in printed


@pytest.mark.parametrize(
    "answer, verdict",
    [
        (STUB, "Not yet: copies per tensor"),
        (ALIAS, "Not yet: copies per tensor (want 1 each): {'cpu': 0"),
        (SOLUTION, "Correct!"),
    ],
    ids=["stub", "alias", "solution"],
)
def test_the_check_answers_each_kind_of_answer(answer, verdict):
    assert run(answer, CHECK).startswith(verdict)
