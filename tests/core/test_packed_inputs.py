"""Inputs whose fields are not batch-aligned are refused with a sentence, never split into a wrong answer.

A PackedSequence is a namedtuple, but its ``data`` interleaves every sequence's time steps and its
``batch_sizes`` has one count per time step: split field by field, each slot got half the time steps
of every sequence, with the right type and shapes. A nested tensor's rows have different lengths.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from torch.testing import assert_close

from dpteach.data_parallel import DataParallel
from dpteach.scatter_gather import gather, scatter

SLOTS = ["cpu", "cpu"]


def packed() -> torch.nn.utils.rnn.PackedSequence:
    x = torch.randn(4, 5, 3)
    return pack_padded_sequence(x, torch.tensor([5, 3, 4, 2]), batch_first=True, enforce_sorted=False)


@pytest.mark.parametrize("strategy", ["broadcast", "rewire", "clone"])
def test_a_packed_sequence_input_is_refused_with_what_to_do(strategy):
    with pytest.raises(ValueError, match=r"inputs\[0\] is a PackedSequence.*pack_padded_sequence"):
        DataParallel(nn.LSTM(3, 6, batch_first=True), SLOTS, strategy=strategy)(packed())


def test_a_packed_sequence_anywhere_in_the_input_is_refused():
    with pytest.raises(ValueError, match=r"inputs\['seq'\] is a PackedSequence"):
        scatter({"seq": packed()}, SLOTS)


def test_a_packed_sequence_output_is_refused():
    out = packed()
    with pytest.raises(ValueError, match=r"gather: .*PackedSequence at output\[0\]"):
        gather([(out,), (out,)], "cpu")


class PacksInside(nn.Module):
    """The way that works: the padded batch and its lengths go in, packing happens in forward."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(3, 6, batch_first=True)

    def forward(self, x, lengths):
        seq = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = self.lstm(seq)
        return pad_packed_sequence(out, batch_first=True, total_length=x.size(1))[0]


def test_the_advice_works_and_equals_one_device():
    torch.manual_seed(0)
    net = PacksInside()
    x, lengths = torch.randn(4, 5, 3), torch.tensor([5, 3, 4, 2])
    assert_close(DataParallel(net, SLOTS)(x, lengths), net(x, lengths))


def test_a_nested_tensor_is_refused_with_a_sentence():
    nt = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)])
    with pytest.raises(ValueError, match=r"inputs is a nested tensor.*to_padded_tensor"):
        scatter(nt, SLOTS)
