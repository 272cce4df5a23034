"""The small exercises' checks, one block per chapter: each says "Correct!" or what to change.

A check takes what the learner built and compares it with what the chapter's rule predicts,
computed here, so the notebook cell under a question holds one call and no answer.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

# ---------------------------------------------------------------------------------------------
# Chapter 10: break the fix (exercise 3)


def dead_ends_are_back(graph, step) -> None:
    """Exercise 3 of chapter 10: with the parameters' ``set_history`` line deleted, every replica
    parameter is a dead end again and the original's ``.grad`` stays ``None``, as under ``"clone"``.

    ``graph`` is ``dpteach.autograd_graph(step.output, ...)`` of ``step``, the ``rewire_step`` of the
    recompiled module."""
    replica_params = len(graph.replica_params)
    if replica_params == 0:
        raise AssertionError(
            "The graph has no replica parameters: draw it with the step's own tensors, "
            "original, replicas = step.modules(), then autograd_graph(step.output, module=original, "
            "replicas=replicas)."
        )
    if not graph.dead_ends:
        raise AssertionError(
            "No dead ends: every replica parameter still leads to the original, so the line you deleted "
            "is not the one that rewires the parameters. Delete the set_history line inside the loop over "
            "named_parameters (the first line marked FIX (#20910)), compile again and run this cell again."
        )
    if len(graph.dead_ends) != replica_params:
        raise AssertionError(
            f"{len(graph.dead_ends)} of {replica_params} replica parameters are dead ends: only part of the "
            "rewiring is gone. Delete only the set_history line of the parameters' loop, and keep the rest "
            "of the source as it was."
        )
    if any(g is not None for g in step.grads.values()):
        raise AssertionError(
            "The replicas are dead ends but the original got a gradient: run rewire_step with "
            "extension=my_dp (the module you just compiled), not the chapter's."
        )
    print(
        f"Correct! All {replica_params} replica parameters are dead ends again and the original's .grad "
        "is None: without set_history, clone() alone is issue #19540."
    )
