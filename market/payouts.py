"""A round's payouts and pooled forecast: thin float64 wrappers around walla.train.mechanism.

Nothing here is a formula of its own: scores, leave-one-out baselines, net payouts and pooling are the
functions walla train trains with and walla eval scores with, so a live round pays exactly what the offline
pipeline computes for the same reports (tests/market/test_payouts.py checks it against net_payout).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from walla.market.api import RoundSettings
from walla.train import mechanism


@dataclass
class RoundPayouts:
    """Per report, in the order given: Brier score, leave-one-out baseline, advantage and net payout."""

    score: list[float]
    baseline: list[float]
    advantage: list[float]
    payout: list[float]

    @property
    def total(self) -> float:
        """The market's net outlay for the round (its deficit when positive)."""
        return float(sum(self.payout))


def _tensors(probs, wagers, target=None):
    p = torch.tensor(probs, dtype=torch.float64)  # [M, K]
    w = torch.tensor(wagers, dtype=torch.float64)  # [M]
    q = None if target is None else torch.tensor(target, dtype=torch.float64)  # [K]
    return p, w, q


def round_payouts(
    probs: list[list[float]], wagers: list[float], target: list[float], s: RoundSettings
) -> RoundPayouts:
    """Payouts of M reports (probs [M][K], wagers [M]) against the outcome `target` [K] (one-hot or gold)."""
    if not probs:
        return RoundPayouts([], [], [], [])
    p, w, q = _tensors(probs, wagers, target)
    score = mechanism.brier_score(p, q, s.c1, s.c2)  # [M]
    adv = mechanism.advantage(p, w, q, s.variant, s.c1, s.c2)  # [M]
    pay = mechanism.payout(w, adv, s.c3)  # [M] = net_payout(p, w, q, ...)
    return RoundPayouts(score.tolist(), (score - adv).tolist(), adv.tolist(), pay.tolist())


def worst_payout(wager: float, c2: float, c3: float) -> float:
    """The lowest net payout a report with this wager can get: the advantage is at least s_min - s_max = -2 c2
    (mechanism.score_bounds), so pi = w (A - c3 w) >= -w (2 c2 + c3 w). The floor check uses it."""
    s_min, s_max = mechanism.score_bounds(0.0, c2)
    return wager * ((s_min - s_max) - c3 * wager)


def pooled_forecast(probs: list[list[float]], wagers: list[float], kind: str, k: int) -> dict:
    """The wager-weighted pool of the current reports (mechanism.pool: all-zero wagers pool with equal weights).

    No report yet: the uniform forecast over the K options (what the mechanism uses without stake).
    `choice` is the argmax, ties to the lowest option index (numpy/torch argmax, as walla eval's accuracy).
    """
    if not probs:
        agg, weights = [1.0 / k] * k, []
    else:
        p, w, _ = _tensors(probs, wagers)
        agg = mechanism.pool(p, w, kind).tolist()
        weights = mechanism.pool_weights(w).tolist()
    choice = max(range(k), key=lambda j: (agg[j], -j))
    return {
        "probabilities": agg,
        "weights": weights,
        "choice": choice,
        "n_reports": len(probs),
        "pooling": kind,
    }
