"""The small exercises' checks, one block per chapter: each says "Correct!" or what to change.

A check takes what the learner built and compares it with what the chapter's rule predicts,
computed here, so the notebook cell under a question holds one call and no answer.
"""

from __future__ import annotations

import torch

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


# ---------------------------------------------------------------------------------------------
# Chapter 04: a Replicatable module of your own (exercise 2)


def replicatable_scale(cls: type, devices=("cpu", "cpu")) -> None:
    """Exercise 2 of chapter 04: ``cls()`` is a C++-style ``Scale`` (forward ``x * self.members.scale``)
    that implements ``demos.Replicatable``; under ``demos.option_two`` its gradient must match one device's."""
    import copy

    from ..data_parallel import DataParallel
    from . import demos

    torch.manual_seed(0)
    module = cls()
    if "scale" not in dict(module.named_parameters()):
        raise AssertionError(
            "Scale() has no parameter named 'scale': in reset(), register_parameter('scale', ...) and keep the "
            "same tensor as self.members.scale."
        )
    x = torch.randn(8, *module.scale.shape)
    reference = copy.deepcopy(module)
    reference(x).pow(2).mean().backward()
    try:
        DataParallel(module, list(devices), strategy=demos.option_two)(x).pow(2).mean().backward()
    except TypeError as err:
        raise AssertionError(
            f"Option Two refused the module ({err}). Make Scale inherit from demos.Replicatable as well as "
            "nn.Module, and define load_replica_params(self, tensors)."
        ) from None
    except NotImplementedError:
        raise AssertionError(
            "load_replica_params still raises NotImplementedError: define it in Scale, putting "
            "tensors['scale'] into self._parameters['scale'] and into self.members.scale."
        ) from None
    if module.scale.grad is None:
        raise AssertionError(
            "The original's scale.grad is None: the replicas' forward still read the clone's own leaf. In "
            "load_replica_params, point the member too: self.members.scale = tensors['scale']."
        )
    torch.testing.assert_close(
        module.scale.grad,
        reference.scale.grad,
        msg=lambda m: (
            "scale.grad differs from one device's; does forward return x * self.members.scale? " + m
        ),
    )
    print(
        "Correct! Scale under Option Two gets one device's gradient: the module itself re-pointed its member."
    )


# ---------------------------------------------------------------------------------------------
# Chapter 05: a counter that survives DataParallel (exercise 1)


def counter_survives(cls: type, devices=("cpu", "cpu"), forwards: int = 3) -> None:
    """Exercise 1 of chapter 05: ``cls()`` is a ``demos.CallCounter`` whose ``calls_rebound`` is updated in
    place; after ``forwards`` DataParallel forwards under ``"broadcast"`` it must count ``forwards``."""
    from ..data_parallel import DataParallel

    counter = cls()
    net = DataParallel(counter, list(devices), strategy="broadcast")
    x = torch.randn(2 * len(devices), counter.linear.in_features)
    for _ in range(forwards):
        net(x)
    counted = int(counter.calls_rebound.item())
    if counted == 0:
        raise AssertionError(
            "calls_rebound is still 0 in the model: the replicas' increments were bound to new tensors. Replace "
            "`self.calls_rebound = self.calls_rebound + 1` with an in-place update, `self.calls_rebound.add_(1)`."
        )
    if counted != forwards:
        raise AssertionError(
            f"calls_rebound counts {counted} after {forwards} forwards: increment it by 1 once per forward, in "
            "place, and leave the other counters as they were."
        )
    print(
        f"Correct! calls_rebound counts {counted} after {forwards} forwards: slot 0's in-place update writes into "
        "the model's own buffer; slot 1's goes to its own copy."
    )
