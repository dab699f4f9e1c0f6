"""RouteLLM baseline: a text router, Linear on the pooled text embedding -> aggregation weights (SPEC §6).

    e = encoder(question)                    (with_context: concat_i encoder(prompt_i), [M*D])
    logits = Linear(Dropout(0.1)(e)) -> M;   weights = softmax(logits / 2)
    loss = mixture cross-entropy of the linear pool (soft target for BayesX)

Paper setting: bert-base-uncased pooled output fine-tuned with AdamW lr 5e-5, wd 0.01, clip 1.0, batch 50,
5 epochs (``encoder: bert-base-uncased, encoder_mode: finetune, lr: 5e-5, encoder_lr: 5e-5``). Default here:
the offline MiniLM encoder frozen (embeddings cached once, walla.train.encoders), only the head trains,
at a head learning rate suited to a fresh linear layer. The registry's ``route-llm-ctx`` sets with_context.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from walla.train.encoders import OFFLINE_DEFAULT
from walla.train.lit import seeded
from walla.train.methods import LogFn, MethodOutput
from walla.train.methods._baselines import (
    RouterNet,
    build_config,
    check_common,
    fit_router,
    mixture_ce,
    resolved_dict,
    router_input,
    router_predict,
    scenario_tensors,
)

NAME = "route-llm"


@dataclass(frozen=True)
class RouteLLMConfig:
    with_context: bool = False  # encode each agent's own prompt and concatenate (route-llm-ctx)
    encoder: str = OFFLINE_DEFAULT  # paper: bert-base-uncased
    encoder_mode: str = "frozen"  # frozen (cached embeddings) | finetune (paper)
    pooling: str | None = None  # None: the encoder's default (BERT: pooler output)
    max_len: int | None = None  # None: the encoder's default (paper: 512)
    truncation_side: str | None = None
    embedding_cache: str | None = None  # cache dir; None: <store>/embeddings of the scenario, or memory
    lr: float = 3e-2  # head learning rate (paper, finetuning everything: 5e-5)
    encoder_lr: float = 5e-5  # finetune mode only (paper)
    weight_decay: float = 0.01
    dropout: float = 0.1
    temperature: float = 2.0  # weights = softmax(logits / temperature)
    clip: float = 1.0
    batch_size: int = 50  # paper: 50 (PubMedQA hetero 100, PubMedQA x12 30)
    epochs: int = 5
    patience: int = 5
    reference_early_stopping: bool = False  # SPEC §10.2: all epochs, keep the last (soft targets: best KL)
    engine: str = "lightning"

    def check(self, method: str) -> None:
        check_common(self, method)


def resolve(data, cfg: dict | None) -> dict:
    """The fully resolved config (defaults filled in) that run.json records."""
    return resolved_dict(RouteLLMConfig, cfg, NAME)


def fit(data, cfg: dict, seed: int, log: LogFn | None = None) -> dict:
    c = build_config(RouteLLMConfig, cfg, NAME)
    probs, target, _ = scenario_tensors(data)
    x, encoder, d_in = router_input(data, c, NAME)
    with seeded(seed):
        head = nn.Sequential(nn.Dropout(c.dropout), nn.Linear(d_in, data.n_agents))  # [B, D_in] -> [B, M]
    net = RouterNet(head, encoder)

    def weights_fn(module: nn.Module, rows: np.ndarray) -> torch.Tensor:
        return torch.softmax(module(x[torch.from_numpy(rows)]) / c.temperature, dim=-1)  # [B, M]

    def loss_fn(module: nn.Module, rows: np.ndarray):
        return mixture_ce(weights_fn(module, rows), probs[rows], target[rows])

    return fit_router(net, data, loss_fn, weights_fn, c, seed, log, encoder, d_in)


def predict(state: dict, data, rows: np.ndarray) -> MethodOutput:
    return router_predict(state, data, rows, NAME)
