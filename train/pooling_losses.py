"""Losses and validation criteria of weight-producing baselines: the linear pool of the agents' probs.

    mixture_nll(weights, probs, target)   per-row -sum_k q_k log(p_agg,k + 1e-10)   (SPEC §6)
    mixture_ce(...)                       its batch mean: StackedGen's, RouteLLM's and NIRT's loss
    val_metric(weights, probs, target, soft)   per-epoch validation criterion (SPEC §4.3), lower is better

Every function broadcasts over leading dimensions of `weights` (e.g. [S, B, M] for S seeds trained as
one module), so one batched loss is the sum of the per-seed losses.
"""

from __future__ import annotations

import torch
from walla.train.mechanism import brier_loss

LOG_EPS = 1e-10  # inside the mixture cross-entropy and KL (SPEC §6, §8)


def linear_pool(weights: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """weights [..., B, M] (rows sum to 1), probs [B, M, K] (0 on absent options) -> p_agg [..., B, K]."""
    agg = (weights.unsqueeze(-1) * probs).sum(-2)  # [..., B, K]
    return agg / agg.sum(-1, keepdim=True).clamp_min(LOG_EPS)


def mixture_nll(weights: torch.Tensor, probs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """-sum_k q_k log(p_agg,k + 1e-10) per row: [..., B] (q one-hot, or soft for BayesX)."""
    return -(target * torch.log(linear_pool(weights, probs) + LOG_EPS)).sum(-1)


def mixture_ce(weights: torch.Tensor, probs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Batch mean of `mixture_nll`: scalar, or [...] per leading index."""
    return mixture_nll(weights, probs, target).mean(-1)


def val_metric(weights: torch.Tensor, probs: torch.Tensor, target: torch.Tensor, soft: bool) -> torch.Tensor:
    """Mean KL(q || p_agg) for soft targets, else mean Brier D-regret: [...] (lower is better).

    D-regret = mean_b [Brier(p_agg) - min_i Brier(p_i)] (unhalved Brier, SPEC §8).
    """
    agg = linear_pool(weights, probs)  # [..., n, K]
    if soft:
        kl = (target * (torch.log(target + LOG_EPS) - torch.log(agg.clamp_min(LOG_EPS)))).sum(-1)
        return kl.mean(-1)
    best = brier_loss(probs, target.unsqueeze(-2)).min(-1).values  # [n]
    return (brier_loss(agg, target) - best).mean(-1)
