"""Helpers of the baseline tests: run a registered method, score it, build tiny offline text encoders.

state, out = run("stacked-gen", data, {"lr": 3e-3})       # fit on seed 18, predict the test split
tiny_encoder_dir(tmp_path, "bert")                         # random BertModel + WordPiece tokenizer
"""

from __future__ import annotations

import string
from pathlib import Path

import numpy as np
import torch
from walla.manifests.validate import build
from walla.train.engine import TrainEnv
from walla.train.mechanism import brier_loss
from walla.train.methods import get_method

HASHING = {"encoder": "hashing", "pooling": "none", "encoder_lr_mult": 0.0}  # frozen, model-free


def config_of(name: str, cfg: dict | None = None):
    info, mod = get_method(name)
    return build(mod.Config, {**info.defaults, **(cfg or {})}, name)


def run_seeds(name, data, cfg=None, seeds=(18,), rows=None, env=None, logs=None):
    """Fit `name` on `seeds` as one call; return (states, outputs of each state on `rows`)."""
    _, mod = get_method(name)
    env = env or TrainEnv()
    states = mod.fit(data, config_of(name, cfg), list(seeds), env, logs or [None] * len(seeds))
    rows = data.split_index("test") if rows is None else rows
    return states, [mod.predict(s, data, rows, env) for s in states]


def run(name, data, cfg=None, seed=18, rows=None):
    states, outs = run_seeds(name, data, cfg, (seed,), rows)
    return states[0], outs[0]


def brier(out, data, rows=None) -> float:
    rows = data.split_index("test") if rows is None else rows
    return float(brier_loss(torch.tensor(out.agg_probs), torch.tensor(data.target[rows])).mean())


def informed_mrr(out, data, rows=None) -> float:
    """MRR of the informed (context-holding) agent in a stable descending sort of the weights."""
    rows = data.split_index("test") if rows is None else rows
    order = np.argsort(-out.weights, axis=1, kind="stable")
    rank = np.argmax(order == data.meta["informed"][rows][:, None], axis=1) + 1
    return float((1.0 / rank).mean())


def tiny_encoder_dir(root: Path, kind: str) -> Path:
    """A random 1-layer BERT or DeBERTa-v2 (hidden 16) and a locally written WordPiece tokenizer."""
    from transformers import BertConfig, BertModel, BertTokenizer, DebertaV2Config, DebertaV2Model

    root = Path(root) / kind
    root.mkdir(parents=True, exist_ok=True)
    chars = string.ascii_lowercase + string.digits + string.punctuation
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *(f"##{c}" for c in chars)]
    (root / "vocab.txt").write_text("\n".join(vocab) + "\n")
    BertTokenizer(str(root / "vocab.txt")).save_pretrained(root)
    sizes = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    torch.manual_seed(0)
    if kind == "bert":
        BertModel(BertConfig(vocab_size=len(vocab), max_position_embeddings=64, **sizes)).save_pretrained(
            root
        )
    else:
        cfg = DebertaV2Config(vocab_size=len(vocab), max_position_embeddings=64, **sizes)
        DebertaV2Model(cfg).save_pretrained(root)
    return root
