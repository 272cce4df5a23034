"""Ranks refuses a world_size (or threads) that is not a whole number, in a sentence, before any process starts."""

from __future__ import annotations

import pytest

from dpteach.distributed import Ranks


@pytest.mark.parametrize("world_size", ["2", 2.5, 2.0, True, None])
def test_world_size_must_be_a_whole_number(world_size):
    with pytest.raises(TypeError, match=r"world_size must be a whole number.*number of ranks"):
        Ranks(world_size)


def test_threads_must_be_a_whole_number():
    with pytest.raises(TypeError, match=r"threads must be a whole number"):
        Ranks(1, threads="1")


def test_a_world_size_below_one_is_still_refused():
    with pytest.raises(ValueError, match="at least 1"):
        Ranks(0)
