"""The large model the cost model predicts: GPT-2 small, counted once and shipped, checked by hand and recounted."""

from __future__ import annotations

import dataclasses
import json

import pytest

from dpteach.measure import costmodel as cm

LAYERS, WIDTH, SEQ, VOCAB = 12, 768, 1024, 50257  # GPT2Config()'s n_layer, n_embd, n_positions, vocab_size


def test_the_shipped_gpt2_has_gpt2_smalls_parameters():
    work = cm.large_workload("gpt2-small")
    # per block: 2 layer norms, attention (its input and output layers), the MLP
    block = 2 * WIDTH * 2 + (WIDTH * 3 * WIDTH + 3 * WIDTH) + (WIDTH * WIDTH + WIDTH)
    block += (WIDTH * 4 * WIDTH + 4 * WIDTH) + (4 * WIDTH * WIDTH + WIDTH)
    params = VOCAB * WIDTH + SEQ * WIDTH + LAYERS * block + 2 * WIDTH  # embeddings, blocks, the last norm
    assert params == 124_439_808  # GPT-2 small's 124M; the output layer shares the token embedding
    assert work.param_bytes == 4 * params == sum(work.grad_bytes)  # fp32, every parameter once
    assert work.param_tensors == len(work.grad_bytes) == 2 + LAYERS * 12 + 2
    assert work.grad_bytes[-1] == 4 * VOCAB * WIDTH  # the token embedding, first in parameter order
    assert (work.batch, work.input_bytes) == (1, 8 * SEQ)  # int64 ids in
    # out, all of it gathered by DataParallel: the loss, the logits and a key and a value per layer
    kv = LAYERS * 2 * SEQ * WIDTH * 4  # use_cache is on in GPT2Config(); heads x head size = WIDTH
    assert work.output_bytes == 4 + SEQ * VOCAB * 4 + kv
    assert work.grad_output_bytes == work.output_grad_bytes == 4  # only the loss gets a gradient back


def test_the_shipped_gpt2_flops_by_hand():
    work = cm.large_workload("gpt2-small")
    matmul = LAYERS * (WIDTH * 3 * WIDTH + WIDTH * WIDTH + 2 * WIDTH * 4 * WIDTH) + WIDTH * VOCAB
    # Q K^T and the weights times V, per token: SEQ keys each, counted whole (no causal half)
    attention = LAYERS * 2 * SEQ * WIDTH
    assert work.flops_fwd == SEQ * 2 * (matmul + attention)  # 2 FLOPs per multiply-add
    assert work.flops_bwd == 2 * work.flops_fwd  # gradients of both operands of every product


def test_the_shipped_file_says_how_it_was_counted():
    entry = json.loads(cm.WORKLOADS_FILE.read_text())["workloads"]["gpt2-small"]
    assert "count_gpt2" in entry["counted"] and "meta device" in entry["counted"]
    assert entry["parameters"] == 124_439_808
    with pytest.raises(ValueError, match="gpt2-small"):
        cm.large_workload("gpt3")


def test_a_lone_embedding_is_not_flattened_by_data_parallel():
    work = cm.large_workload("gpt2-small")
    # the 154 MB token embedding is a 10 MiB chunk on its own, flattened as a view; every other chunk
    # holds several tensors (the position embedding shares one with the first block's first tensors)
    assert cm.packed_bytes(work) == work.param_bytes - 4 * VOCAB * WIDTH


@pytest.mark.slow  # imports transformers (seconds)
def test_recounting_gpt2_with_transformers_gives_the_shipped_workload():
    pytest.importorskip("transformers")
    counted = cm.count_gpt2()
    assert dataclasses.asdict(counted) == dataclasses.asdict(cm.large_workload("gpt2-small"))


HEADS = 12  # GPT2Config()'s n_head


def test_the_shipped_memory_count_holds_the_attention_weights_by_hand():
    entry = json.loads(cm.WORKLOADS_FILE.read_text())["workloads"]["gpt2-small"]["saved_for_backward"]
    # sdpa's math path on the meta device keeps three fp32 tensors of SEQ x SEQ per head in each layer
    assert entry["attention_bytes_per_sequence"] == 3 * LAYERS * HEADS * SEQ * SEQ * 4
    logits = SEQ * VOCAB * 4  # the fp32 logits, kept by the loss
    assert entry["bytes_per_sequence"] > entry["attention_bytes_per_sequence"] + logits
    assert "count_gpt2_saved" in entry["counted"] and "meta device" in entry["counted"]


def test_saved_for_backward_counts_each_kept_tensor_once_and_no_parameter():
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    x = torch.randn(5, 4, requires_grad=True)
    kept = cm.saved_for_backward(model, x)
    # Linear keeps its input (its weight is a parameter, left out); ReLU keeps its output
    assert sorted(tuple(t.shape) for t in kept) == [(5, 3), (5, 4)]
    assert not any(t is p for t in kept for p in model.parameters())


@pytest.mark.slow  # imports transformers (seconds)
def test_recounting_gpt2s_memory_gives_the_shipped_count():
    pytest.importorskip("transformers")
    entry = json.loads(cm.WORKLOADS_FILE.read_text())["workloads"]["gpt2-small"]["saved_for_backward"]
    counted = cm.count_gpt2_saved()
    assert counted == {
        "saved_bytes": entry["bytes_per_sequence"],
        "attention_bytes": entry["attention_bytes_per_sequence"],
    }


def test_the_no_cache_workload_is_gpt2_small_less_its_keys_and_values():
    cached, lean = cm.large_workload("gpt2-small"), cm.large_workload("gpt2-small-no-cache")
    keys_and_values = LAYERS * 2 * HEADS * SEQ * (WIDTH // HEADS) * 4  # fp32, per sequence
    assert cached.output_bytes - lean.output_bytes == keys_and_values
    assert lean.output_bytes == 4 + SEQ * VOCAB * 4  # the loss and the logits
    assert dataclasses.replace(lean, output_bytes=cached.output_bytes) == cached  # nothing else differs


@pytest.mark.slow  # imports transformers (seconds)
def test_recounting_gpt2_without_its_cache_gives_the_shipped_workload():
    pytest.importorskip("transformers")
    counted = cm.count_gpt2(use_cache=False)
    assert dataclasses.asdict(counted) == dataclasses.asdict(cm.large_workload("gpt2-small-no-cache"))
