"""The maths of one WALLA training batch, shared by walla train (wagers/training.py) and a live agent
(market/head.py): raw scores -> wagers, realized advantages, hindsight best responses and each agent's own
loss; the backward, per-head clipping and optimizer step; the early-stopping metric.

    fw = wager_losses(r, p, y, cfg)                # r [S, D, M, b] float64 raw scores -> WagerForward
    optimizer_step(fabric, opt, fw.loss, cfg.clip)  # backward, per-head clip, one Adam step

The formulas are wagers/training.py's module docstring; the mechanism's pieces (advantage, best response,
D-regret) are mechanism.py's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from walla.train import mechanism
from walla.train.engine import clip_gradients

if TYPE_CHECKING:  # the method module imports wager_training, which imports this one
    from walla.train.methods.walla import Config


def stop_metric(kind: str, agg: torch.Tensor, probs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-question early-stopping metric (lower is better): the mechanism's one D-regret / KL."""
    return mechanism.kl_gold(target, agg) if kind == "kl" else mechanism.brier_regret(agg, probs, target)


@dataclass
class WagerForward:
    """One batch's forward pass: the loss to minimize and what early stopping and the logs read."""

    loss: torch.Tensor  # scalar: the sum of every head's own mean loss
    mse: torch.Tensor  # [S, M] each wager head's own loss
    wagers: torch.Tensor  # [S, b, M] float64, detached
    adv: torch.Tensor  # [S, b, M] realized advantages
    p: torch.Tensor  # [S, b, M, K] agents' probs
    y: torch.Tensor  # [S, b, K] targets


def wager_loss(w: torch.Tensor, adv: torch.Tensor, c3: float) -> torch.Tensor:
    """Each agent's own loss: mean over the batch of (w - w*)^2, w* = clip(A / 2 c3, 0, 1) a constant.

    w, adv [..., b, M] -> [..., M]. The live agent (market/head.py) calls it with its own advantages.
    """
    w_star = mechanism.best_response_wager(adv, c3, w_max=1.0)  # [..., b, M]
    return ((w - w_star) ** 2).mean(-2)  # [..., M]


def optimizer_step(fabric, opt, loss: torch.Tensor, clip: float | None) -> None:
    """Backward, per-head gradient-norm clipping (clipping.clip_gradients, scope "slice"), one optimizer step.

    The step of every WALLA head, in walla train and in a live agent (market/head.py).
    """
    opt.zero_grad(set_to_none=True)
    fabric.backward(loss)
    clip_gradients(fabric, opt, clip, scope="slice")
    opt.step()


def wager_losses(r: torch.Tensor, p: torch.Tensor, y: torch.Tensor, cfg: Config) -> WagerForward:
    """Raw scores r [S, D, M, b] float64 -> wagers, advantages, best-response targets and losses."""
    w = torch.sigmoid(r[:, 0] / cfg.temperature).transpose(1, 2)  # [S, b, M] wagers
    wd = w.detach()
    adv = mechanism.advantage(p, wd, y, cfg.variant, cfg.c1, cfg.c2, validate=False)  # [S, b, M]
    mse = wager_loss(w, adv, cfg.c3)  # [S, M]: agent i's own loss
    loss = mse.sum()
    if r.shape[1] > 1:  # diagnostic heads: own score and baseline, never used for wagers
        score = mechanism.brier_score(p, y.unsqueeze(-2), cfg.c1, cfg.c2, validate=False)  # [S, b, M]
        for k, goal in ((1, score), (2, score - adv)):
            pred = torch.sigmoid(r[:, k]).transpose(1, 2)  # [S, b, M]
            loss = loss + ((pred - goal.clamp(0, 1)) ** 2).mean(1).sum()
    return WagerForward(loss=loss, mse=mse, wagers=wd, adv=adv, p=p, y=y)
