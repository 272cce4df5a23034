"""transformers' Trainer on a tail batch: ``num_items_in_batch`` has one row per GPU, the batch fewer pieces.

Trainer (transformers 5.24, ``_get_num_items_in_batch``) turns the count into ``count.unsqueeze(0).expand(
n_gpu, -1)`` so that DataParallel hands each replica a row. A last batch of 4 rows over 3 slots splits
into 2 + 2, the count into 3 rows; torch's zip drops the third row with the slot that gets no data, and
nothing is lost, since every row holds the same count. The refusal stays where a row would be lost.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from dpteach.data_parallel import DataParallel
from dpteach.scatter_gather import scatter_kwargs


class SumLoss(nn.Module):
    """A model whose loss is summed and divided by the count it is given, as a causal LM's is."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 1)

    def forward(self, input_ids, labels, num_items_in_batch):
        return ((self.lin(input_ids).squeeze(-1) - labels) ** 2).sum() / num_items_in_batch.reshape(())


def per_gpu_count(total: int, n_gpu: int) -> torch.Tensor:
    """What Trainer passes: the count split per GPU, one row per GPU."""
    return (torch.tensor(total) // n_gpu).unsqueeze(0).expand(n_gpu, -1) / 1


def test_a_tail_batch_with_fewer_pieces_than_slots_runs_as_in_torch():
    torch.manual_seed(0)
    net, x, y = SumLoss(), torch.randn(4, 4), torch.randn(4)
    count = per_gpu_count(4, 3)
    losses = DataParallel(net, ["cpu"] * 3)(input_ids=x, labels=y, num_items_in_batch=count)
    assert losses.shape == (2,)  # two slots got data; the third row of the count went with the third slot
    want = torch.stack([net(x[:2], y[:2], count[:1]), net(x[2:], y[2:], count[:1])])
    assert_close(losses, want)
    losses.mean().backward()  # Trainer's loss.mean() on multi-GPU


def test_the_extra_rows_are_dropped_with_the_slots_that_get_no_data():
    x = torch.randn(4, 4)
    inputs, kwargs = scatter_kwargs(
        (), {"input_ids": x, "num_items_in_batch": per_gpu_count(4, 3)}, ["cpu"] * 3
    )
    assert len(kwargs) == 2 and len(inputs) == 2
    assert [k["num_items_in_batch"].shape for k in kwargs] == [(1, 1), (1, 1)]


def test_positional_batch_and_keyword_count_are_cut_alike():
    inputs, kwargs = scatter_kwargs(
        (torch.randn(4, 4),), {"num_items_in_batch": per_gpu_count(4, 3)}, ["cpu"] * 3
    )
    assert len(inputs) == len(kwargs) == 2  # no third slot with a count and no batch


def test_rows_that_differ_are_still_refused():
    # one row per slot, but different rows: dropping one would lose it
    with pytest.raises(ValueError, match=r"extra pieces would be dropped"):
        scatter_kwargs(
            (), {"input_ids": torch.randn(4, 4), "per_slot": torch.tensor([[1.0], [2.0], [3.0]])}, ["cpu"] * 3
        )


def test_a_tensor_that_is_not_one_row_per_slot_is_still_refused():
    with pytest.raises(ValueError, match=r"extra pieces would be dropped"):
        scatter_kwargs((), {"input_ids": torch.randn(4, 4), "other": torch.ones(6, 1)}, ["cpu"] * 3)
