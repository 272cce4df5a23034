"""``try_it(key, *answer)``: the last line of a stub cell. It runs the answer once and lets any error out.

The check catches and explains; ``try_it`` does not, so the learner sees the full traceback (and
an untouched stub fails loudly, which is why the stub cells are tagged ``raises-exception``).
Each task's module says how it is tried (its ``try_answer``).
"""

from __future__ import annotations

import torch
from torch import nn

from ..data_parallel import DataParallel

SLOTS = ["cpu", "cpu"]


def step(strategy, model: nn.Module, x: torch.Tensor) -> str:
    """One DataParallel step on two CPU slots under ``strategy``; a sentence on what reached the original."""
    out = DataParallel(model, SLOTS, strategy=strategy)(x)
    out.pow(2).mean().backward()
    missing = [name for name, p in model.named_parameters() if p.grad is None]
    grads = (
        f".grad is None for {', '.join(missing)}"
        if missing
        else "every parameter of the original has a .grad"
    )
    return f"one DataParallel step on {len(SLOTS)} CPU slots ran without an error ({grads})"


def try_it(key: str, *answer) -> None:
    """Run exercise ``key`` once with the learner's ``answer``, raising whatever their code raises."""
    from ._records import module_of

    said = module_of(key).try_answer(*answer)
    print(f"Tried it: {said}. Now run the check below.")
