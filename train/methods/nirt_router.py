"""NIRTRouter baseline: an IRT-style text router predicting each agent's chance of being right (SPEC §6).

    h = encoder(no-context prompt)                   (bert-base-uncased pooled output, truncation left)
    stat_m = sigmoid(Linear_256->25(Embedding_m))    agent "ability" per knowledge concept   [M, 25]
    k = sigmoid(Linear(h) -> 25), e = 9 sigmoid(Linear(h) -> 1)   question difficulty, discrimination
    z = e (stat_m - k) r,  r = softmax(ones(25))     (uniform relevance: no knowledge vectors)  [B, M, 25]
    p_correct = sigmoid(PosLinear_512->1(Dropout(tanh(PosLinear_25->512(z)))))  clamped [1e-6, 1-1e-6]
    weights = softmax(logit(p_correct) / 1)
    loss = BCE(p_correct, correctness) + 0.25 mixture CE + 1e-4 sum_layers mean(W^2)  (six non-encoder layers)

correctness = target[argmax_k p_mk]: 1[agent m's argmax is the label] for one-hot targets, q of that option
for soft targets (BayesX). PosLinear uses |W| as its weight (monotone in z). Defaults = the paper's: AdamW lr
1e-4 for head and encoder (BayesX, PubMedQA x12: 5e-5), wd 0.01, clip 1.0, batch 50, 5 epochs; the
dropout rate (not stated in SPEC) is NeuralCD's 0.5.
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

P_CLAMP = 1e-6


@config
class Config(RouterConfig):
    truncation_side: str = "left"
    lr: float = 1e-4
    temperature: float = 1.0  # weights = softmax(logit(p) / temperature)
    knowledge_dim: int = 25
    agent_dim: int = 256  # agent embedding size
    hidden_dim: int = 512  # PosLinear hidden width
    discrimination_scale: float = 9.0  # e = scale * sigmoid(.)
    dropout: float = 0.5
    bce_weight: float = 1.0
    ce_weight: float = 0.25
    reg_weight: float = 1e-4

    def __post_init__(self) -> None:
        super().__post_init__()
        for key in ("knowledge_dim", "agent_dim", "hidden_dim"):
            check(getattr(self, key) >= 1, key, ">= 1", getattr(self, key))
        for key in ("bce_weight", "ce_weight", "reg_weight"):
            check(getattr(self, key) >= 0, key, ">= 0", getattr(self, key))
        check(self.discrimination_scale > 0, "discrimination_scale", "> 0", self.discrimination_scale)
        check(0.0 <= self.dropout < 1.0, "dropout", "in [0, 1)", self.dropout)


class PosLinear(nn.Linear):
    """Linear layer with non-negative effective weight |W| (monotone in its input, as in NeuralCD)."""

    def effective_weight(self) -> torch.Tensor:
        return self.weight.abs()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.effective_weight(), self.bias)


class NIRTHead(nn.Module):
    """Question embedding [B, D] -> logit of each agent's probability of being right [B, M]."""

    def __init__(self, d_in: int, n_agents: int, c: Config):
        super().__init__()
        self.scale = c.discrimination_scale
        self.agent = nn.Embedding(n_agents, c.agent_dim)
        self.stat = nn.Linear(c.agent_dim, c.knowledge_dim)
        self.difficulty = nn.Linear(d_in, c.knowledge_dim)
        self.discrimination = nn.Linear(d_in, 1)
        self.l1 = PosLinear(c.knowledge_dim, c.hidden_dim)
        self.drop = nn.Dropout(c.dropout)
        self.l2 = PosLinear(c.hidden_dim, 1)
        self.register_buffer("relevance", torch.softmax(torch.ones(c.knowledge_dim), dim=0))  # [C] uniform

    def reg_layers(self) -> list[torch.Tensor]:
        """Weights of the six non-encoder layers (the 1e-4 mean-square penalty)."""
        return [
            self.agent.weight,
            self.stat.weight,
            self.difficulty.weight,
            self.discrimination.weight,
            self.l1.weight,
            self.l2.weight,
        ]

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        stat = torch.sigmoid(self.stat(self.agent.weight))  # [M, C]
        k = torch.sigmoid(self.difficulty(h))  # [B, C]
        e = self.scale * torch.sigmoid(self.discrimination(h))  # [B, 1]
        z = e.unsqueeze(1) * (stat.unsqueeze(0) - k.unsqueeze(1)) * self.relevance  # [B, M, C]
        p = torch.sigmoid(self.l2(self.drop(torch.tanh(self.l1(z))))).squeeze(-1)  # [B, M]
        return torch.logit(p.clamp(P_CLAMP, 1.0 - P_CLAMP))  # [B, M]


def correctness(probs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """target mass on each agent's argmax option: probs [N, M, K], target [N, K] -> [N, M]."""
    top = probs.argmax(-1)  # [N, M]
    return target.gather(1, top)  # [N, M]


def make_head(c: Config, d_in: int, m: int) -> nn.Module:
    return NIRTHead(d_in, m, c)


def fit(data, cfg: Config, seeds: Sequence[int], env, logs: Sequence[LogFn | None]) -> list[dict]:
    def loss_of(module, logits: torch.Tensor, probs: torch.Tensor, target: torch.Tensor):
        p = torch.sigmoid(logits)  # [B, M] == the clamped p_correct
        bce = nn.functional.binary_cross_entropy(p, correctness(probs, target))
        ce = mixture_ce(torch.softmax(logits / cfg.temperature, dim=-1), probs, target)
        reg = sum(w.pow(2).mean() for w in module.head.reg_layers())
        loss = cfg.bce_weight * bce + cfg.ce_weight * ce + cfg.reg_weight * reg
        return loss, {"bce": bce.detach(), "mixture_ce": ce.detach()}

    return fit_router(data, cfg, seeds, env, logs, make_head, loss_of)


def predict(state: dict, data, rows: np.ndarray, env) -> MethodOutput:
    return router_predict(state, data, rows, env, Config, make_head)
