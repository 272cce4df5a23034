"""Drop-in scenarios, written the way learners write their own code, each against the plain model.

PyTorch's "Optional: Data Parallelism" tutorial, a d2l-style training loop with BatchNorm and SGD,
state_dict round trips with torch.nn.DataParallel, inference under no_grad, keyword inputs,
dict / namedtuple / None outputs and an LSTM split along dim 1, on 1 to 4 CPU slots. The reference
is always the same model on one device, fed the same pieces (with BatchNorm, each slot normalises
its own piece and only slot 0's statistics are kept, exactly as in torch.nn.DataParallel).
"""

from __future__ import annotations

import copy
from collections import namedtuple

import pytest
import torch
from torch import nn
from torch.func import functional_call
from torch.testing import assert_close
from torch.utils.data import DataLoader, Dataset

import dpteach

SLOT_COUNTS = [1, 2, 3, 4]


def slots(n: int) -> list[str]:
    return ["cpu"] * n


def on_pieces(model: nn.Module, n: int, *inputs, dim: int = 0, **kwargs):
    """The plain model on each slot's piece, as DataParallel runs it: shared parameters, slot 0's buffers kept."""
    pieces = list(zip(*(t.chunk(n, dim) for t in inputs)))
    params = dict(model.named_parameters())
    outs = [model(*pieces[0], **kwargs)]
    for piece in pieces[1:]:
        buffers = {
            k: b.clone() for k, b in model.named_buffers()
        }  # another slot's statistics are thrown away
        outs.append(functional_call(model, {**params, **buffers}, piece, kwargs))
    return torch.cat(outs, dim)


# ------------------------------------------------------------------------------------------------
# PyTorch's tutorial "Optional: Data Parallelism" (beginner_source/blitz/data_parallel_tutorial.py)
# ------------------------------------------------------------------------------------------------

input_size, output_size, batch_size, data_size = 5, 2, 30, 100


class RandomDataset(Dataset):
    def __init__(self, size, length):
        self.len = length
        self.data = torch.randn(length, size)

    def __getitem__(self, index):
        return self.data[index]

    def __len__(self):
        return self.len


class Model(nn.Module):
    # Our model

    def __init__(self, input_size, output_size):
        super(Model, self).__init__()
        self.fc = nn.Linear(input_size, output_size)

    def forward(self, input):
        output = self.fc(input)
        print("\tIn Model: input size", input.size(), "output size", output.size())
        return output


@pytest.mark.parametrize("n", SLOT_COUNTS)
def test_the_tutorial(n, capsys):
    torch.manual_seed(0)
    rand_loader = DataLoader(
        dataset=RandomDataset(input_size, data_size), batch_size=batch_size, shuffle=True
    )
    model = Model(input_size, output_size)
    plain = copy.deepcopy(model)
    model = dpteach.DataParallel(model, slots(n))
    for data in rand_loader:
        output = model(data)
        print("Outside: input size", data.size(), "output_size", output.size())
        assert_close(output, plain(data))  # the same numbers as the plain model
    printed = capsys.readouterr().out
    inside = printed.count("In Model")
    # each batch of 30 (and the last of 10) is split over the slots, one print per piece, plus the plain runs
    pieces = sum(len(torch.zeros(b).chunk(n)) for b in (30, 30, 30, 10))
    assert inside == pieces + 4
    assert printed.count("Outside: input size torch.Size([30, 5]) output_size torch.Size([30, 2])") == 3


# ------------------------------------------------------------------------------------------------
# A d2l-style loop: a conv net with BatchNorm, SGD, CrossEntropy, then evaluation
# ------------------------------------------------------------------------------------------------


def d2l_net():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 4, kernel_size=3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.AvgPool2d(2),
        nn.Flatten(),
        nn.Linear(4 * 4 * 4, 10),
    )


def d2l_data(batches=3, batch=12):
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randn(batch, 1, 8, 8, generator=g), torch.randint(0, 10, (batch,), generator=g))
        for _ in range(batches)
    ]


@pytest.mark.parametrize("n", SLOT_COUNTS)
def test_d2l_training_loop_with_batchnorm(n):
    net, ref = dpteach.DataParallel(d2l_net(), slots(n)), d2l_net()
    loss = nn.CrossEntropyLoss()
    trainer = torch.optim.SGD(net.parameters(), lr=0.1)
    ref_trainer = torch.optim.SGD(ref.parameters(), lr=0.1)
    for X, y in d2l_data():
        net.train(), ref.train()
        l = loss(net(X), y)
        trainer.zero_grad()
        l.backward()
        trainer.step()
        l_ref = loss(on_pieces(ref, n, X), y)
        ref_trainer.zero_grad()
        l_ref.backward()
        ref_trainer.step()
        assert_close(l, l_ref)  # the same loss, step by step
    for (name, p), q in zip(net.module.named_parameters(), ref.parameters()):
        assert_close(p, q, msg=f"{name} after training")  # SGD moved the parameters alike
    for (name, b), c in zip(net.module.named_buffers(), ref.buffers()):
        assert_close(b, c, msg=f"{name}: slot 0's BatchNorm statistics are kept")
    net.eval(), ref.eval()
    with torch.no_grad():
        X, _ = d2l_data(1, 10)[0]
        assert_close(net(X), ref(X))  # evaluation with running statistics: exactly the plain model


# ------------------------------------------------------------------------------------------------
# state_dict round trips with torch.nn.DataParallel
# ------------------------------------------------------------------------------------------------


def test_state_dict_round_trips_with_torch_dataparallel():
    ours = dpteach.DataParallel(d2l_net(), slots(2))
    theirs = nn.DataParallel(d2l_net())
    assert list(ours.state_dict()) == list(theirs.state_dict())  # the same 'module.'-prefixed keys
    torch.manual_seed(5)
    trained = d2l_net()
    for p in trained.parameters():
        p.data.normal_()
    theirs.load_state_dict(
        nn.DataParallel(trained).state_dict()
    )  # a checkpoint saved from torch's wrapper ...
    ours.load_state_dict(theirs.state_dict())  # ... loads into dpteach's
    plain = d2l_net()
    plain.load_state_dict(ours.module.state_dict())  # and back out into a plain model
    theirs_again = nn.DataParallel(d2l_net())
    theirs_again.load_state_dict(ours.state_dict())  # and into torch's again
    x = torch.randn(4, 1, 8, 8)
    for m in (ours, plain, theirs_again, trained):
        m.eval()
    with torch.no_grad():
        for m in (ours, plain, theirs_again):
            assert_close(m(x), trained(x))


# ------------------------------------------------------------------------------------------------
# Inference under no_grad, with dropout in eval mode
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", SLOT_COUNTS)
@pytest.mark.parametrize("strategy", ["broadcast", "rewire", "clone"])
def test_inference_under_no_grad(n, strategy):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.5), nn.ReLU(), nn.Linear(8, 2)).eval()
    x = torch.randn(9, 6)
    with torch.no_grad():
        out = dpteach.DataParallel(model, slots(n), strategy=strategy)(x)
        expected = model(x)
    assert out.grad_fn is None and not out.requires_grad  # no graph built
    assert_close(out, expected)
    assert all(p.grad is None for p in model.parameters())


# ------------------------------------------------------------------------------------------------
# Keyword inputs; dict, namedtuple and None outputs
# ------------------------------------------------------------------------------------------------

Output = namedtuple("Output", ["logits", "hidden"])


class Rich(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.encoder = nn.Linear(4, 6)
        self.head = nn.Linear(6, 3)

    def forward(self, x, mask=None, scale=1.0, return_dict=False):
        hidden = torch.tanh(self.encoder(x)) * scale
        if mask is not None:
            hidden = hidden * mask
        logits = self.head(hidden)
        if return_dict:
            return {"logits": logits, "hidden": hidden, "attention": None}
        return Output(logits, hidden)


@pytest.mark.parametrize("n", SLOT_COUNTS)
@pytest.mark.parametrize("strategy", ["broadcast", "rewire"])
def test_kwargs_and_structured_outputs(n, strategy):
    x, mask = torch.randn(10, 4), (torch.rand(10, 6) > 0.3).float()
    model, ref = Rich(), Rich()
    dp = dpteach.DataParallel(model, slots(n), strategy=strategy)
    out = dp(x, mask=mask, scale=0.5)  # a tensor keyword is split with the batch, a float is shared
    expected = ref(x, mask=mask, scale=0.5)
    assert type(out) is Output  # the namedtuple comes back as itself
    assert_close(out.logits, expected.logits)
    assert_close(out.hidden, expected.hidden)
    out.logits.sum().backward()
    expected.logits.sum().backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert_close(p.grad, q.grad)  # gradients through keyword inputs reach the original
    as_dict = dp(x, return_dict=True)
    assert (
        set(as_dict) == {"logits", "hidden", "attention"} and as_dict["attention"] is None
    )  # None stays None
    assert_close(as_dict["logits"], ref(x, return_dict=True)["logits"])
    functional = dpteach.data_parallel(model, (x,), slots(n), module_kwargs={"mask": mask}, strategy=strategy)
    assert_close(functional.logits, ref(x, mask=mask).logits)


# ------------------------------------------------------------------------------------------------
# An LSTM with the batch along dim 1 (batch_first=False)
# ------------------------------------------------------------------------------------------------


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lstm = nn.LSTM(input_size=3, hidden_size=5, num_layers=2)
        self.out = nn.Linear(5, 2)

    def forward(self, seq):  # seq: (time, batch, features)
        output, (h, c) = self.lstm(seq)
        return self.out(output), (h, c)


@pytest.mark.parametrize("n", SLOT_COUNTS)
@pytest.mark.parametrize("strategy", ["broadcast", "rewire"])
def test_lstm_split_along_dim_1(n, strategy):
    seq = torch.randn(7, 6, 3)  # 7 time steps, a batch of 6
    model, ref = Tagger(), Tagger()
    tags, (h, c) = dpteach.DataParallel(model, slots(n), dim=1, strategy=strategy)(seq)
    ref_tags, (ref_h, ref_c) = ref(seq)
    assert tags.shape == (7, 6, 2) and h.shape == (2, 6, 5)  # gathered along the batch dim of every output
    assert_close(tags, ref_tags)
    assert_close(h, ref_h)
    assert_close(c, ref_c)
    (tags.sum() + h.sum()).backward()
    (ref_tags.sum() + ref_h.sum()).backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert_close(p.grad, q.grad, msg=name)
