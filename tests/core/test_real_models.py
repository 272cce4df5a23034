"""Models nobody here wrote train on 2 and 3 CPU slots as on one device.

transformers' GPT-2 (tied input and output embeddings), BERT (tied too), T5 and Wav2Vec2 (its
positional convolution under ``weight_norm``), built from small configs with no weights
downloaded; ``nn.TransformerEncoder``; an LSTM language model whose batch is in dim 1. Dropout is
off (a slot's mask cannot match one device's), so each slot computes exactly what one device
computes on its rows. Under ``"broadcast"`` and ``"rewire"`` the gradients, and the parameters
after a few SGD steps, equal one device's. ``"clone"`` is the pre-fix bug, whose gradients never
reach the module, so it is not among them.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from dpteach.data_parallel import DataParallel

STRATEGIES = ["broadcast", "rewire"]
STEPS = 2
BATCH = 6  # splits evenly and unevenly: 3 + 3 and 2 + 2 + 2, 6 rows for the LSTM in dim 1


def transformers_or_skip():
    return pytest.importorskip(
        "transformers", reason="transformers is not installed (pip install dpteach[test])"
    )


def gpt2():
    t = transformers_or_skip()
    cfg = t.GPT2Config(
        n_embd=16, n_layer=1, n_head=2, vocab_size=40, n_positions=16, bos_token_id=0, eos_token_id=0
    )
    cfg.resid_pdrop = cfg.embd_pdrop = cfg.attn_pdrop = 0.0
    model = t.GPT2LMHeadModel(cfg)
    assert model.lm_head.weight is model.transformer.wte.weight  # tied
    ids = torch.randint(0, 40, (BATCH, 8))
    return model, (ids,), lambda out: out.logits


def bert():
    t = transformers_or_skip()
    cfg = t.BertConfig(
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        vocab_size=40,
        max_position_embeddings=16,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    model = t.BertForMaskedLM(cfg)
    ids = torch.randint(0, 40, (BATCH, 8))
    return model, (ids, torch.ones_like(ids)), lambda out: out.logits


def t5():
    t = transformers_or_skip()
    cfg = t.T5Config(
        d_model=16,
        d_kv=8,
        d_ff=32,
        num_layers=1,
        num_decoder_layers=1,
        num_heads=2,
        vocab_size=40,
        dropout_rate=0.0,
    )
    model = t.T5ForConditionalGeneration(cfg)
    ids, dec = torch.randint(0, 40, (BATCH, 8)), torch.randint(0, 40, (BATCH, 5))
    return model, (ids, None, dec), lambda out: out.logits


class Wav2Vec2Hidden(nn.Module):
    """Wav2Vec2's encoder output, called with the audio alone."""

    def __init__(self):
        super().__init__()
        t = transformers_or_skip()
        cfg = t.Wav2Vec2Config(
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            conv_dim=(8, 8),
            conv_kernel=(10, 3),
            conv_stride=(5, 2),
            num_conv_pos_embeddings=8,
            num_conv_pos_embedding_groups=2,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            activation_dropout=0.0,
            feat_proj_dropout=0.0,
            final_dropout=0.0,
            layerdrop=0.0,
            mask_time_prob=0.0,  # SpecAugment masks random time steps in training
        )
        self.model = t.Wav2Vec2Model(cfg)

    def forward(self, audio):
        return self.model(audio).last_hidden_state


def wav2vec2():
    model = Wav2Vec2Hidden()
    conv = model.model.encoder.pos_conv_embed.conv
    assert hasattr(conv, "parametrizations") or hasattr(conv, "weight_g")  # weight_norm, either form
    return model, (torch.randn(BATCH, 200),), None


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.encoder, self.head = (
            nn.TransformerEncoder(layer, 2, enable_nested_tensor=False),
            nn.Linear(16, 3),
        )

    def forward(self, x):
        return self.head(self.encoder(x))


def transformer_encoder():
    return Encoder(), (torch.randn(BATCH, 7, 16),), None


class LstmLM(nn.Module):
    """Time first, batch second: DataParallel(..., dim=1)."""

    def __init__(self):
        super().__init__()
        self.embed, self.lstm, self.out = (
            nn.Embedding(30, 12),
            nn.LSTM(12, 16, num_layers=2),
            nn.Linear(16, 30),
        )

    def forward(self, ids):
        return self.out(self.lstm(self.embed(ids))[0])


def lstm_lm():
    return LstmLM(), (torch.randint(0, 30, (9, BATCH)),), None


MODELS = {
    "gpt2": (gpt2, 0),
    "bert": (bert, 0),
    "t5": (t5, 0),
    "wav2vec2": (wav2vec2, 0),
    "transformer_encoder": (transformer_encoder, 0),
    "lstm_lm": (lstm_lm, 1),
}


def train(model, inputs, pick, run=None, steps=STEPS):
    """``steps`` SGD steps of ``model`` (called through ``run``) on the mean square of the output;
    the gradients of each step."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    grads = []
    for _ in range(steps):
        opt.zero_grad()
        out = (run or model)(*inputs)
        out = pick(out) if pick else out
        out.float().pow(2).mean().backward()
        grads.append({n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()})
        opt.step()
    return grads


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("n_slots", [2, 3])
@pytest.mark.parametrize("name", list(MODELS))
def test_trains_on_cpu_slots_like_one_device(name, n_slots, strategy):
    make, dim = MODELS[name]
    torch.manual_seed(0)
    model, inputs, pick = make()
    model.train()
    twin = copy.deepcopy(model)
    want = train(model, inputs, pick)
    got = train(twin, inputs, pick, DataParallel(twin, ["cpu"] * n_slots, dim=dim, strategy=strategy))
    for step, (g, w) in enumerate(zip(got, want)):
        assert g.keys() == w.keys()
        for n in w:
            if w[n] is None:
                # an unused parameter: None under "rewire" as on one device; zero under "broadcast" as in torch
                assert g[n] is None or not g[n].any(), (step, n)
            else:
                assert_close(
                    g[n], w[n], rtol=1e-4, atol=1e-5, msg=lambda m, s=step, n=n: f"step {s}, {n}: {m}"
                )
    for (n, p), q in zip(model.named_parameters(), twin.parameters()):
        assert_close(q, p, rtol=1e-4, atol=1e-5, msg=lambda m, n=n: f"{n} after {STEPS} steps: {m}")
