"""RouteLLM baseline: a text router, Linear on the pooled prompt embedding -> aggregation weights (SPEC §6).

    e = encoder(no-context prompt)          (with_context: concat_i encoder(prompt_i), [M*D])
    logits = Linear(Dropout(0.1)(e)) -> M;   weights = softmax(logits / 2)
    loss = mixture cross-entropy of the linear pool (soft target for BayesX)

Defaults = the paper's: bert-base-uncased pooled output fine-tuned end to end with AdamW lr 5e-5 (head and
encoder, encoder_lr_mult 1), wd 0.01, clip 1.0, batch 50, 5 epochs (shared machinery: walla.train.methods.routing).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn
from walla.manifests.validate import check, config
from walla.train.methods import LogFn, MethodOutput
from walla.train.methods.routing import RouterConfig, fit_router, router_predict
from walla.train.pooling_losses import mixture_ce


@config
class Config(RouterConfig):
    dropout: float = 0.1  # before the linear head

    def __post_init__(self) -> None:
        super().__post_init__()
        check(0.0 <= self.dropout < 1.0, "dropout", "in [0, 1)", self.dropout)


def make_head(c: Config, d_in: int, m: int) -> nn.Module:
    return nn.Sequential(nn.Dropout(c.dropout), nn.Linear(d_in, m))  # [B, D_in] -> [B, M]


def fit(data, cfg: Config, seeds: Sequence[int], env, logs: Sequence[LogFn | None]) -> list[dict]:
    def loss_of(module, logits: torch.Tensor, probs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return mixture_ce(torch.softmax(logits / cfg.temperature, dim=-1), probs, target)

    return fit_router(data, cfg, seeds, env, logs, make_head, loss_of)


def predict(state: dict, data, rows: np.ndarray, env) -> MethodOutput:
    return router_predict(state, data, rows, env, Config, make_head)
