"""``try_it(key, *answer)``: the last line of a stub cell. It runs the answer once and lets any error out.

The check catches and explains; ``try_it`` does not, so the learner sees the full traceback (and
an untouched stub fails loudly, which is why the stub cells are tagged ``raises-exception``).
"""

from __future__ import annotations

import torch
from torch import nn

from .. import story
from ..data_parallel import DataParallel
from ._models import conv_bn
from .task2_rewire import rewire_with
from .task3_broadcast import broadcast_with

SLOTS = ["cpu", "cpu"]


def _step(strategy, model: nn.Module, x: torch.Tensor) -> str:
    out = DataParallel(model, SLOTS, strategy=strategy)(x)
    out.pow(2).mean().backward()
    missing = [name for name, p in model.named_parameters() if p.grad is None]
    grads = f".grad is None for {', '.join(missing)}" if missing else "every parameter of the original has a .grad"
    return f"one DataParallel step on {len(SLOTS)} CPU slots ran without an error ({grads})"


def try_it(key: str, *answer) -> None:
    """Run exercise ``key`` once with the learner's ``answer``, raising whatever their code raises."""
    x, _ = story.make_data(n=16)
    if key == "clone_bug":
        said = _step(answer[0], story.make_model(), x)
    elif key == "rewire":
        said = _step(rewire_with(answer[0]), story.make_model(), x)
    elif key == "broadcast_pair":
        said = _step(broadcast_with(answer[0]), story.make_model(), x)
    elif key == "batchnorm":
        with torch.random.fork_rng(devices=[]):  # the learner's random state is left alone
            model, x = conv_bn(), torch.randn(8, 1, 5, 5)
        said = _step(answer[0], model, x)
    elif key == "scatter_gather":
        scatter, gather = answer
        pieces = scatter((x, {"n": 3}), SLOTS, 0)
        joined = gather([p[0] for p in pieces], "cpu", 0)
        said = f"scatter gave {len(pieces)} pieces and gather joined them into shape {tuple(joined.shape)}"
    else:
        raise KeyError(f"no exercise {key!r}")
    print(f"Tried it: {said}. Now run the check below.")
