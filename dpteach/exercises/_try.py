"""``try_it(key, *answer)``: the last line of a stub cell. It runs the answer once and lets any error out.

The check catches and explains; ``try_it`` does not, so a learner's own error shows its full
traceback. An untouched stub fails loudly too (which is why the stub cells are tagged
``raises-exception``), but as two lines, not as a traceback through dpteach's frames: its
``raise NotImplementedError("Task N (...): ...")`` becomes ``NotWrittenYet``, whose
``_render_traceback_`` (the hook IPython uses in place of a traceback) names the task and what to do.
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


class NotWrittenYet(NotImplementedError):
    """A stub's own ``NotImplementedError("Task N (...): ...")``: the part of the task still to write."""

    def _render_traceback_(self) -> list[str]:
        return [
            f"\x1b[31mNotImplementedError\x1b[39m: {self}",
            "Not written yet: replace the `raise NotImplementedError(...)` in this cell with your code, "
            "run the cell again, then run the check below it.",
        ]


def try_it(key: str, *answer) -> None:
    """Run exercise ``key`` once with the learner's ``answer``, raising whatever their code raises.

    A stub's own ``NotImplementedError`` (its message starts with ``"Task "``) is raised again as
    ``NotWrittenYet``, which Jupyter shows in two lines; every other error is raised as it was.
    """
    from ._records import module_of

    try:
        said = module_of(key).try_answer(*answer)
    except NotImplementedError as error:
        if type(error) is not NotImplementedError or not str(error).startswith("Task "):
            raise
        raise NotWrittenYet(str(error)) from None
    print(f"Tried it: {said}. Now run the check below.")
