"""scatter / scatter_kwargs / gather over nested inputs, namedtuples and dataclasses (#41327, #45840)."""

from __future__ import annotations

import dataclasses
from collections import namedtuple
from typing import NamedTuple, Optional

import pytest
import torch
from torch import nn
from torch.testing import assert_close

import dpteach
from dpteach import gather, scatter, scatter_kwargs

CPU2 = ["cpu", "cpu"]


@dataclasses.dataclass
class Batch:
    x: torch.Tensor
    mask: torch.Tensor
    name: str = "batch"


@dataclasses.dataclass(frozen=True)
class Output:
    logits: torch.Tensor
    loss: Optional[torch.Tensor] = None


class Pair(NamedTuple):
    a: torch.Tensor
    b: torch.Tensor


def test_scatter_splits_tensors_and_shares_everything_else():
    x = torch.randn(4, 2)
    tag = object()
    pieces = scatter((x, tag), CPU2)
    assert len(pieces) == 2
    assert_close(pieces[0][0], x[:2])
    assert_close(pieces[1][0], x[2:])
    assert pieces[0][1] is tag and pieces[1][1] is tag  # non-tensors are shared, not copied


def test_scatter_may_give_fewer_pieces_than_slots():
    assert len(scatter(torch.randn(3, 1), ["cpu"] * 4)) == 3  # 3 rows over 4 slots: 3 pieces


@pytest.mark.parametrize("kind", ["namedtuple", "NamedTuple"])
def test_namedtuples_round_trip(kind):
    cls = namedtuple("P", ["a", "b"]) if kind == "namedtuple" else Pair
    value = cls(torch.randn(4, 3), torch.randn(4, 5))
    pieces = scatter(value, CPU2)
    assert all(type(p) is cls for p in pieces)  # the type survives the split
    back = gather(pieces, "cpu")
    assert type(back) is cls and back._fields == cls._fields
    assert_close(back.a, value.a)
    assert_close(back.b, value.b)


def test_dataclasses_are_split_and_joined():
    mask = torch.tensor(
        [1, 0, 0, 1, 1, 1], dtype=torch.bool
    )  # halves differ, so a gather that reuses slot 0's shows
    batch = Batch(torch.randn(6, 3), mask)
    pieces = scatter(batch, CPU2)
    assert [type(p) for p in pieces] == [Batch, Batch]  # PyTorch passes a dataclass through unsplit
    assert pieces[0].x.shape == (3, 3) and pieces[1].mask.shape == (6 // 2,)
    assert pieces[0].name == "batch"
    back = gather(pieces, "cpu")
    assert_close(back.x, batch.x)
    assert_close(back.mask, batch.mask)


def test_frozen_dataclass_outputs_gather_through_data_parallel():
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(3, 2)

        def forward(self, batch: Batch):
            return Output(logits=self.l(batch.x), loss=None)

    model = Model()
    batch = Batch(torch.randn(6, 3), torch.ones(6, dtype=torch.bool))
    out = dpteach.DataParallel(model, CPU2)(batch)
    assert isinstance(out, Output) and out.loss is None  # a dataclass output comes back as one (#41327)
    assert_close(out.logits, model.l(batch.x))


def test_dicts_keep_their_type_and_keys():
    from collections import OrderedDict

    outs = [OrderedDict(a=torch.ones(1), b=torch.zeros(1)), OrderedDict(a=torch.ones(1), b=torch.zeros(1))]
    back = gather(outs, "cpu")
    assert type(back) is OrderedDict and list(back) == ["a", "b"]
    with pytest.raises(ValueError, match="same number of keys"):
        gather([{"a": torch.ones(1)}, {"a": torch.ones(1), "b": torch.ones(1)}], "cpu")
    with pytest.raises(ValueError, match="same keys"):
        gather([{"a": torch.ones(1)}, {"b": torch.ones(1)}], "cpu")


def test_non_tensor_outputs_come_back_one_per_replica():
    assert gather([("x", torch.ones(1)), ("y", torch.ones(1))], "cpu")[0] == ["x", "y"]  # not "<map object>"
    assert gather([None, None], "cpu") is None


def test_scalar_outputs_become_a_vector_with_a_warning():
    with pytest.warns(UserWarning, match="scalars"):
        out = gather([torch.tensor(1.0), torch.tensor(2.0)], "cpu")
    assert_close(out, torch.tensor([1.0, 2.0]))


def test_scatter_kwargs_pads_the_shorter_side():
    inputs, kwargs = scatter_kwargs((torch.randn(4, 1),), {}, CPU2)
    assert len(inputs) == 2 and kwargs == ({}, {})
    inputs, kwargs = scatter_kwargs((), {"x": torch.randn(4, 1)}, CPU2)
    assert inputs == ((), ()) and len(kwargs) == 2


def test_invalid_dim_is_refused():
    with pytest.raises(IndexError, match="out of range"):
        scatter(torch.randn(4), CPU2, dim=1)


def test_scatter_along_dim_1_and_gather_back():
    x = torch.randn(2, 6)
    pieces = scatter(x, CPU2, dim=1)
    assert pieces[0].shape == (2, 3)
    assert_close(gather(pieces, "cpu", dim=1), x)
