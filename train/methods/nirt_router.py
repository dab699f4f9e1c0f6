"""NIRTRouter baseline: an IRT-style text router predicting each agent's chance of being right (SPEC §6).

    h = encoder(question)                            (paper: bert-base-uncased pooled output)
    stat_m = sigmoid(Linear_256->25(Embedding_m))    agent "ability" per knowledge concept   [M, 25]
    k = sigmoid(Linear(h) -> 25), e = 9 sigmoid(Linear(h) -> 1)   question difficulty, discrimination
    z = e (stat_m - k) r,  r = softmax(ones(25))     (uniform relevance: no knowledge vectors)  [B, M, 25]
    p_correct = sigmoid(PosLinear_512->1(Dropout(tanh(PosLinear_25->512(z)))))  clamped [1e-6, 1-1e-6]
    weights = softmax(logit(p_correct) / 1)
    loss = BCE(p_correct, correctness) + 0.25 mixture CE + 1e-4 sum_layers mean(W^2)  (six non-encoder layers)

correctness = target[argmax_k p_mk]: 1[agent m's argmax is the label] for one-hot targets, q of that option
for soft targets (BayesX). PosLinear uses |W| as its weight (monotone in z). Paper: AdamW lr 1e-4 (BayesX,
PubMedQA x12: 5e-5), wd 0.01, clip 1.0, batch 50/100, 5 epochs, fine-tuning BERT. Default here: frozen
offline encoder; the dropout rate (not stated in SPEC) is NeuralCD's 0.5.
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

NAME = "nirt-router"
P_CLAMP = 1e-6


@dataclass(frozen=True)
class NIRTConfig:
    with_context: bool = False
    encoder: str = OFFLINE_DEFAULT  # paper: bert-base-uncased (truncation from the left)
    encoder_mode: str = "frozen"  # frozen (cached embeddings) | finetune (paper)
    pooling: str | None = None
    max_len: int | None = None
    truncation_side: str | None = None  # paper: left (SPEC §6); None shares the frozen cache
    embedding_cache: str | None = None
    lr: float = 1e-2  # head learning rate (paper, with the encoder: 1e-4)
    encoder_lr: float = 1e-4  # finetune mode only (paper)
    weight_decay: float = 0.01
    knowledge_dim: int = 25
    agent_dim: int = 256  # agent embedding size
    hidden_dim: int = 512  # PosLinear hidden width
    discrimination_scale: float = 9.0  # e = scale * sigmoid(.)
    dropout: float = 0.5
    temperature: float = 1.0  # weights = softmax(logit(p) / temperature)
    bce_weight: float = 1.0
    ce_weight: float = 0.25
    reg_weight: float = 1e-4
    clip: float = 1.0
    batch_size: int = 50
    epochs: int = 5
    patience: int = 5
    reference_early_stopping: bool = False
    engine: str = "lightning"

    def check(self, method: str) -> None:
        check_common(self, method)
        for key in ("knowledge_dim", "agent_dim", "hidden_dim"):
            if getattr(self, key) < 1:
                raise ValueError(f"{method}: config key {key!r} must be >= 1")
        for key in ("bce_weight", "ce_weight", "reg_weight"):
            if getattr(self, key) < 0:
                raise ValueError(f"{method}: config key {key!r} must be >= 0")


class PosLinear(nn.Linear):
    """Linear layer with non-negative effective weight |W| (monotone in its input, as in NeuralCD)."""

    def effective_weight(self) -> torch.Tensor:
        return self.weight.abs()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.effective_weight(), self.bias)


class NIRTHead(nn.Module):
    """Question embedding [B, D] -> logit of each agent's probability of being right [B, M]."""

    def __init__(self, d_in: int, n_agents: int, c: NIRTConfig):
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


def resolve(data, cfg: dict | None) -> dict:
    """The fully resolved config (defaults filled in) that run.json records."""
    return resolved_dict(NIRTConfig, cfg, NAME)


def fit(data, cfg: dict, seed: int, log: LogFn | None = None) -> dict:
    c = build_config(NIRTConfig, cfg, NAME)
    probs, target, _ = scenario_tensors(data)
    correct = correctness(probs, target)  # [N, M]
    x, encoder, d_in = router_input(data, c, NAME)
    with seeded(seed):
        head = NIRTHead(d_in, data.n_agents, c)
    net = RouterNet(head, encoder)

    def weights_fn(module: nn.Module, rows: np.ndarray) -> torch.Tensor:
        return torch.softmax(module(x[torch.from_numpy(rows)]) / c.temperature, dim=-1)  # [B, M]

    def loss_fn(module: nn.Module, rows: np.ndarray):
        logits = module(x[torch.from_numpy(rows)])  # [B, M]
        p = torch.sigmoid(logits)  # [B, M] == the clamped p_correct
        bce = nn.functional.binary_cross_entropy(p, correct[rows])
        ce = mixture_ce(torch.softmax(logits / c.temperature, dim=-1), probs[rows], target[rows])
        reg = sum(w.pow(2).mean() for w in module.head.reg_layers())
        loss = c.bce_weight * bce + c.ce_weight * ce + c.reg_weight * reg
        return loss, {"bce": float(bce.detach()), "mixture_ce": float(ce.detach())}

    return fit_router(net, data, loss_fn, weights_fn, c, seed, log, encoder, d_in)


def predict(state: dict, data, rows: np.ndarray) -> MethodOutput:
    return router_predict(state, data, rows, NAME)
