"""RouterDC baseline: dual-contrastive text router with trainable expert embeddings (SPEC §6).

    q = encoder(question)   (paper: mdeberta-v3-base [CLS] state; with_context: concat of agents' prompts)
    logits_m = cos(q, E_m) / T,  T = 1;   weights = softmax(logits);   E_m ~ N(0, 0.78^2) per coordinate
    loss (sample-LLM contrastive): p_gold[b, m] = sum_k q_bk p_bmk; positives = top_k agents by p_gold,
        negatives = last_k agents by p_gold, a negative dropped if p_gold > 0.5 or it is the positive;
        per positive rank r: -log softmax([pos, negs])[pos] * 1[p_gold(pos) > 0.01], averaged over the
        batch; loss = mean over the top_k ranks.

AdamW (head at ``lr``, encoder at ``encoder_lr`` in finetune mode), clip per group, and a step is skipped
when the pre-clip gradient norm is non-finite or above ``skip_grad_norm_above`` (reference: 1000).
Paper settings: lr 1e-6 with encoder multiplier 0.01, clip 0.5, top_k = last_k = 2 (4-model MMLU/MedMCQA)
or 3; homogeneous/BayesX: lr 5e-5 or 1e-6, multiplier 1, clip 1.0, top/last 3; batch 20-50; 5 epochs.
Default here: frozen offline encoder (cached embeddings), a head learning rate suited to the expert
embeddings alone.
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
    resolved_dict,
    router_input,
    router_predict,
    scenario_tensors,
)

NAME = "router-dc"
NEG_MAX_P = 0.5  # a negative whose p_gold exceeds this is not a negative
POS_MIN_P = 0.01  # a positive whose p_gold is below this contributes nothing


@dataclass(frozen=True)
class RouterDCConfig:
    with_context: bool = False
    encoder: str = OFFLINE_DEFAULT  # paper: microsoft/mdeberta-v3-base
    encoder_mode: str = "frozen"  # frozen (cached embeddings) | finetune (paper)
    pooling: str | None = None  # None: the encoder's default (mdeberta: [CLS])
    max_len: int | None = None
    truncation_side: str | None = None  # None: the encoder's default (mdeberta: left)
    embedding_cache: str | None = None
    lr: float = 5e-2  # expert embeddings (paper: 1e-6 .. 5e-5, with the encoder)
    encoder_lr: float = 1e-8  # finetune mode only (paper hetero: 1e-6 * 0.01)
    weight_decay: float = 0.01
    temperature: float = 1.0  # logits = cos / temperature
    expert_init_std: float = 0.78
    top_k: int = 3  # clamped to M
    last_k: int = 3  # clamped to M
    clip: float = 1.0
    skip_grad_norm_above: float | None = 1000.0
    batch_size: int = 32
    epochs: int = 5
    patience: int = 5
    reference_early_stopping: bool = False
    engine: str = "lightning"

    def check(self, method: str) -> None:
        check_common(self, method)
        for key in ("top_k", "last_k"):
            if getattr(self, key) < 1:
                raise ValueError(f"{method}: config key {key!r} must be >= 1, got {getattr(self, key)}")
        if not self.expert_init_std > 0:
            raise ValueError(f"{method}: config key 'expert_init_std' must be > 0")


class ExpertHead(nn.Module):
    """Query embedding [B, D] -> cosine similarity to each agent's expert embedding [B, M]."""

    def __init__(self, d_in: int, n_agents: int, init_std: float):
        super().__init__()
        self.experts = nn.Parameter(torch.randn(n_agents, d_in) * init_std)  # [M, D]

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        q = nn.functional.normalize(q, dim=-1, eps=1e-8)  # [B, D]
        e = nn.functional.normalize(self.experts, dim=-1, eps=1e-8)  # [M, D]
        return q @ e.T  # [B, M]


def contrastive_loss(logits: torch.Tensor, p_gold: torch.Tensor, top_k: int, last_k: int) -> torch.Tensor:
    """Sample-LLM contrastive loss of RouterDC: logits [B, M] (cos / T), p_gold [B, M] -> scalar."""
    m = logits.shape[-1]
    top_k, last_k = min(top_k, m), min(last_k, m)
    order = torch.sort(p_gold, dim=-1, descending=True, stable=True).indices  # [B, M]
    pos = order[:, :top_k]  # [B, R] best agents first
    neg = order[:, m - last_k :]  # [B, L] worst agents
    pos_logit, pos_p = logits.gather(1, pos), p_gold.gather(1, pos)  # [B, R]
    neg_logit, neg_p = logits.gather(1, neg), p_gold.gather(1, neg)  # [B, L]
    keep = (neg_p <= NEG_MAX_P).unsqueeze(1) & (neg.unsqueeze(1) != pos.unsqueeze(2))  # [B, R, L]
    neg_logits = neg_logit.unsqueeze(1).expand(-1, top_k, -1).masked_fill(~keep, float("-inf"))  # [B, R, L]
    cat = torch.cat([pos_logit.unsqueeze(-1), neg_logits], dim=-1)  # [B, R, 1+L]
    term = -torch.log_softmax(cat, dim=-1)[..., 0] * (pos_p > POS_MIN_P).to(logits.dtype)  # [B, R]
    return term.mean(0).mean()  # batch mean per rank, then mean over ranks


def resolve(data, cfg: dict | None) -> dict:
    """The fully resolved config (defaults filled in) that run.json records."""
    return resolved_dict(RouterDCConfig, cfg, NAME)


def fit(data, cfg: dict, seed: int, log: LogFn | None = None) -> dict:
    c = build_config(RouterDCConfig, cfg, NAME)
    probs, target, _ = scenario_tensors(data)
    p_gold = (probs * target.unsqueeze(1)).sum(-1)  # [N, M] prob each agent gives the (soft) truth
    x, encoder, d_in = router_input(data, c, NAME)
    with seeded(seed):
        head = ExpertHead(d_in, data.n_agents, c.expert_init_std)
    net = RouterNet(head, encoder)

    def weights_fn(module: nn.Module, rows: np.ndarray) -> torch.Tensor:
        return torch.softmax(module(x[torch.from_numpy(rows)]) / c.temperature, dim=-1)  # [B, M]

    def loss_fn(module: nn.Module, rows: np.ndarray):
        logits = module(x[torch.from_numpy(rows)]) / c.temperature  # [B, M]
        return contrastive_loss(logits, p_gold[rows], c.top_k, c.last_k)

    return fit_router(
        net,
        data,
        loss_fn,
        weights_fn,
        c,
        seed,
        log,
        encoder,
        d_in,
        skip_grad_norm_above=c.skip_grad_norm_above,
    )


def predict(state: dict, data, rows: np.ndarray) -> MethodOutput:
    return router_predict(state, data, rows, NAME)
