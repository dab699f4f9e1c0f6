"""Frozen router embeddings: computed once per (encoder spec, text set) and reused across seeds and methods.

    emb = encode_texts(texts, spec, store, device)          # [n, D] float32, read-only
    x = frozen_features(data, with_context, spec, store, device)   # [N, T*D] router input per question

Cached on disk under ``<store>/embeddings/<encoder>/<key>.npy`` when a store directory is known (atomic
write), and always in an in-process LRU. The key hashes the encoder spec (id, pooling, max length,
normalization, truncation side) and every text, so any change re-encodes. Duplicate texts are encoded
once. The encoder runs on `device` (the run's env.device).
"""

from __future__ import annotations

import hashlib
import json
import re
import zlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from walla.store.atomic import write_atomic
from walla.store.location import is_remote
from walla.train.methods.encoders import (
    EncoderSpec,
    _dedupe,
    load_encoder,
    pad_batch,
    pad_id,
    pool_hidden,
    router_texts,
    tokenize,
)

HASHING_DIM = 256
MEMORY_CACHE_ENTRIES = 16  # embedding matrices kept in memory (LRU) across fits of one process
_MEMORY: OrderedDict[str, np.ndarray] = OrderedDict()
_WORD = re.compile(r"\w\w+")  # words of 2+ characters (as scikit-learn's default token pattern)


def _hashing_embed(texts: Sequence[str]) -> np.ndarray:
    """Lower-cased word 1-2-gram counts hashed (crc32) into HASHING_DIM bins, L2-normalized: [n, D] float32."""
    out = np.zeros((len(texts), HASHING_DIM), dtype=np.float32)
    for j, text in enumerate(texts):
        words = _WORD.findall(text.lower())
        grams = words + [a + " " + b for a, b in zip(words, words[1:], strict=False)]
        bins = np.fromiter(
            (zlib.crc32(g.encode()) % HASHING_DIM for g in grams), dtype=np.int64, count=len(grams)
        )
        np.add.at(out[j], bins, 1.0)
    norm = np.linalg.norm(out, axis=1, keepdims=True)
    return out / np.maximum(norm, 1e-12)


def _encode_uncached(
    texts: Sequence[str], spec: EncoderSpec, device: str, batch_size: int = 64
) -> np.ndarray:
    """Encode texts (already unique) with no cache on `device`: [n, D] float32. Longest first (padding)."""
    if spec.name == "hashing":
        return _hashing_embed(texts)
    tokenizer, model = load_encoder(spec.name, spec.truncation_side)
    model.to(device)
    ids = tokenize(tokenizer, texts, spec.max_len)
    order = sorted(range(len(texts)), key=lambda j: -len(ids[j]))
    out = np.zeros((len(texts), int(model.config.hidden_size)), dtype=np.float32)
    with torch.inference_mode():
        for s in range(0, len(order), batch_size):
            idx = order[s : s + batch_size]
            batch_ids, mask = pad_batch([ids[j] for j in idx], pad_id(tokenizer), device)
            out_j = model(input_ids=batch_ids, attention_mask=mask)
            out[idx] = pool_hidden(out_j, mask, spec.pooling, spec.normalize).float().cpu().numpy()  # [b, D]
    return out


def cache_key(spec: EncoderSpec, texts: Sequence[str]) -> str:
    """sha256 over the encoder spec and every text (order included): 24 hex chars."""
    h = hashlib.sha256(json.dumps(asdict(spec), sort_keys=True).encode())
    for t in texts:
        b = t.encode("utf-8")
        h.update(len(b).to_bytes(8, "little"))  # length prefix: ["ab","c"] != ["a","bc"]
        h.update(b)
    return h.hexdigest()[:24]


def cache_path(store: Path, spec: EncoderSpec, key: str) -> Path:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", spec.name.strip("/")).strip("_") or "encoder"
    return Path(store) / "embeddings" / slug / f"{key}.npy"


def _remember(key: str, arr: np.ndarray) -> None:
    _MEMORY[key] = arr
    _MEMORY.move_to_end(key)
    while len(_MEMORY) > MEMORY_CACHE_ENTRIES:
        _MEMORY.popitem(last=False)


def _save_npy(path: Path, arr: np.ndarray) -> None:
    """Atomic .npy write (np.save on an open file: it would append '.npy' to a temp path)."""

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            np.save(f, arr)

    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, write)


def encode_texts(
    texts: Sequence[str], spec: EncoderSpec, store: str | Path | None = None, device: str = "cpu"
) -> np.ndarray:
    """Frozen embeddings of ``texts``: [n, D] float32 (read-only), computed once per (spec, texts)."""
    texts = list(texts)
    for j, t in enumerate(texts):
        if not isinstance(t, str):
            raise ValueError(f"text {j} must be a str, got {type(t).__name__}")
    key = cache_key(spec, texts)
    if key in _MEMORY:
        _MEMORY.move_to_end(key)
        return _MEMORY[key]
    local = store is not None and not is_remote(store)  # a remote store: no cache, encode in memory
    path = cache_path(Path(store), spec, key) if local else None
    if path is not None and path.is_file():
        arr = np.load(path)
        if arr.shape[0] != len(texts):
            raise ValueError(
                f"embedding cache {path} has {arr.shape[0]} rows, expected {len(texts)}; delete it"
            )
    else:
        uniq, inverse = _dedupe(texts)
        arr = np.ascontiguousarray(_encode_uncached(uniq, spec, device)[inverse], dtype=np.float32)  # [n, D]
        if path is not None:
            _save_npy(path, arr)
    arr.setflags(write=False)
    _remember(key, arr)
    return arr


def frozen_features(
    data, with_context: bool, spec: EncoderSpec, store: str | Path | None, device: str
) -> np.ndarray:
    """Frozen router input per question: [N, T*D] float32 (T = 1, or M concatenated prompt embeddings)."""
    texts, index = router_texts(data, with_context)
    emb = encode_texts(texts, spec, store, device)  # [U, D]
    return emb[index].reshape(index.shape[0], -1)  # [N, T*D]
