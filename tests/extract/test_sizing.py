"""Batch tokens and shard rows sized to the device (extract/sizing.py): the arithmetic, on given figures."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from transformers import LlamaConfig
from walla.extract import sizing
from walla.extract.sizing import ModelShape, settle_sizes

GIB = 1 << 30
# Llama-3.1-8B's decoder with SmolLM2's 49,152-token vocabulary (the issue's "8B shape"), bfloat16
SHAPE_8B = ModelShape(
    layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=14336, vocab=49152, dtype_bytes=2
)
# Llama-3.2-1B's (tied embeddings)
SHAPE_1B = ModelShape(
    layers=16,
    hidden=2048,
    heads=32,
    kv_heads=8,
    head_dim=64,
    intermediate=8192,
    vocab=49152,
    dtype_bytes=2,
    tied=True,
)


def test_per_token_and_weight_bytes_of_the_8b_shape():
    # widest step: the MLP, 3 x 14336 + 4096; + residual and normed input, final hidden + NLL copy (2 B each),
    # RMSNorm's float32 copies, and the shared-prefix KV cache of 32 layers x 2 x 1024 (2 B)
    assert (
        SHAPE_8B.token_bytes()
        == 2 * (2 * 4096 + 3 * 14336 + 4096 + 2 * 4096) + 8 * 4096 + 32 * 2 * 1024 * 2 + 24
    )
    assert SHAPE_8B.token_bytes() == 290_840
    assert SHAPE_8B.weight_bytes() == 14_764_482_560  # 7.38e9 parameters in bf16 (untied 49k head)
    assert SHAPE_1B.token_bytes() == 118_808
    assert SHAPE_1B.weight_bytes() == 2_147_618_816


def test_cuda_sizes_from_free_memory_and_shape():
    # 40 GiB free: (40 GiB - 14.76e9 weights - 1 GiB reserve) / 2 / 290,840 B = 46,608 tokens -> 32,768
    s = settle_sizes("cuda", None, None, SHAPE_8B, free_bytes=40 * GIB)
    assert (s.batch_tokens, s.shard_rows) == (32_768, 8192)
    assert "batch tokens auto -> 32,768 on cuda: 40.0 GiB free" in s.why and "46,608 tokens" in s.why
    # an 80 GB H100 (~79 GiB free): 116k tokens fit, capped at 65,536
    h100 = settle_sizes("cuda:0", None, None, SHAPE_8B, free_bytes=79 * GIB)
    assert h100.batch_tokens == sizing.GPU_MAX_BATCH_TOKENS == 65_536 and "capped at 65,536" in h100.why
    # the 1B shape on a 4 GiB card: (4 GiB - 2.15e9 - 1 GiB) / 2 / 118,808 = 4,518 -> 4,096
    assert settle_sizes("cuda", None, None, SHAPE_1B, free_bytes=4 * GIB).batch_tokens == 4096
    # fixed costs of the scoring path come off first: 1 GiB of them halves the 1B's budget on a 5 GiB card
    five = settle_sizes("cuda", None, None, SHAPE_1B, free_bytes=5 * GIB)
    fixed = settle_sizes("cuda", None, None, SHAPE_1B, free_bytes=5 * GIB, fixed_bytes=GIB)
    assert (five.batch_tokens, fixed.batch_tokens) == (8192, 4096)
    # weights that do not fit: the floor, and the line says memory is tight
    tight = settle_sizes("cuda", None, None, SHAPE_8B, free_bytes=12 * GIB)
    assert tight.batch_tokens == sizing.GPU_MIN_BATCH_TOKENS and "memory is tight" in tight.why


def test_explicit_flags_override_and_the_cpu_keeps_its_sizes():
    s = settle_sizes("cuda", 4096, 100, SHAPE_8B, free_bytes=79 * GIB)
    assert (s.batch_tokens, s.shard_rows) == (4096, 100)
    assert s.why == "batch tokens 4,096 [--batch-tokens]; shard rows 100 [--shard-rows]"
    one = settle_sizes("cuda", None, 512, SHAPE_8B, free_bytes=79 * GIB)
    assert (one.batch_tokens, one.shard_rows) == (65_536, 512)
    cpu = settle_sizes("cpu", None, None, SHAPE_8B, free_bytes=79 * GIB)  # CPU: shape and memory ignored
    assert (cpu.batch_tokens, cpu.shard_rows) == (8192, 256)
    assert cpu.why == "batch tokens auto -> 8,192 (the CPU size); shard rows auto -> 256 (the CPU size)"
    assert settle_sizes("mps", None, None).batch_tokens == 8192


def test_cuda_without_figures_falls_back_and_says_why():
    s = settle_sizes("cuda", None, None, None, None, unknown="model shape unknown: no config.json")
    assert (s.batch_tokens, s.shard_rows) == (sizing.GPU_FALLBACK_BATCH_TOKENS, 8192)
    assert "(model shape unknown: no config.json)" in s.why


def test_shard_rows_bounded_by_host_memory():
    assert sizing.gpu_shard_rows(4096)[0] == 8192
    # 1 GiB / (6 B x 65,536 hidden) = 2,730 rows -> 2,048
    assert sizing.gpu_shard_rows(65_536)[0] == 2048


def test_shape_from_a_transformers_config():
    cfg = LlamaConfig(
        vocab_size=49152,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        tie_word_embeddings=True,
    )
    assert ModelShape.from_config(cfg, "bfloat16") == SHAPE_1B
    assert ModelShape.from_config(cfg, "float32").dtype_bytes == 4
    # e.g. a mixture-of-experts config that names its MLP widths otherwise
    moe = SimpleNamespace(**{k: v for k, v in cfg.to_dict().items() if k != "intermediate_size"})
    with pytest.raises(ValueError, match="SimpleNamespace has no integer intermediate_size"):
        ModelShape.from_config(moe, "bfloat16")
