"""One bad answer never breaks a later check, nor the learner's notebook.

An answer can change torch's global settings (grad mode, the default dtype, a mode it enters and
never leaves...). The check runs in torch's defaults and gives back the learner's settings after;
an answer that calls ``sys.exit()`` is the learner's bug, said in a sentence, not an escape.
"""

from __future__ import annotations

import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dpteach import exercises
from dpteach.exercises import solutions


class Quiet(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def settings() -> dict:
    """Every global setting a leak below changes, as the learner would read it."""
    return {
        "grad": torch.is_grad_enabled(),
        "inference": torch.is_inference_mode_enabled(),
        "autocast": torch.is_autocast_enabled("cpu"),
        "dtype": torch.get_default_dtype(),
        "device": torch.get_default_device(),
        "threads": torch.get_num_threads(),
        "rng": torch.get_rng_state(),
        "anomaly": torch.is_anomaly_enabled(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "precision": torch.get_float32_matmul_precision(),
        "multithreading": torch._C._is_multithreading_enabled(),
        "modes": (torch._C._len_torch_dispatch_stack(), torch._C._len_torch_function_stack()),
    }


LEAKS = {  # what an answer can do to torch's global state, once per kind of setting
    "grad": lambda: torch.set_grad_enabled(False),
    "inference": lambda: torch.inference_mode().__enter__(),
    "autocast": lambda: torch.set_autocast_enabled("cpu", True),
    "dtype": lambda: torch.set_default_dtype(torch.float64),
    "device": lambda: torch.set_default_device("meta"),
    "threads": lambda: torch.set_num_threads(1),
    "rng": lambda: torch.rand(5),
    "anomaly": lambda: torch.set_anomaly_enabled(True),
    "deterministic": lambda: torch.use_deterministic_algorithms(True),
    "precision": lambda: torch.set_float32_matmul_precision("medium"),
    "multithreading": lambda: torch.autograd.set_multithreading_enabled(False),
    "modes": lambda: Quiet().__enter__(),
}


def leaking(leak):
    """The worked Task 6 answer, which changes one global setting before it copies."""

    def copy_once(tensor, device):
        leak()
        return solutions.copy_once(tensor, device)

    return copy_once


def equal(a: dict, b: dict) -> bool:
    return all(torch.equal(a[k], b[k]) if k == "rng" else a[k] == b[k] for k in a)


@pytest.mark.parametrize("setting", list(LEAKS))
def test_an_answer_that_changes_a_global_setting_leaves_it_unchanged(setting):
    before = settings()
    exercises.check_copy_once(leaking(LEAKS[setting]))
    after = settings()
    assert equal(before, after), {
        k: (before[k], after[k]) for k in before if not equal({k: before[k]}, {k: after[k]})
    }


@pytest.mark.parametrize("setting", ["grad", "inference", "dtype", "device", "modes"])
def test_the_next_check_still_passes_the_worked_answer(setting):
    exercises.check_copy_once(leaking(LEAKS[setting]))
    result = exercises.check_clone_bug(solutions.replicate_by_clone)
    assert result.passed, str(result)


def test_a_check_runs_in_torchs_defaults_whatever_the_notebook_set():
    torch.set_grad_enabled(False)  # a learner's own cell, before the check
    try:
        result = exercises.check_clone_bug(solutions.replicate_by_clone)
    finally:
        torch.set_grad_enabled(True)
    assert result.passed, str(result)


@pytest.mark.parametrize("leave", [sys.exit, lambda: sys.exit(3), exit, quit])
def test_sys_exit_in_an_answer_is_the_learners_bug(leave):
    def copy_once(tensor, device):
        leave()

    result = exercises.check_copy_once(copy_once)  # must not raise SystemExit
    assert not result.passed and result.implemented
    assert "exit" in result.kinds


def test_keyboard_interrupt_still_stops_the_check():
    def copy_once(tensor, device):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        exercises.check_copy_once(copy_once)
