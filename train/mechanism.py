"""The paper's mechanism math: Brier score, leave-one-out baselines, net payouts, pooling, deficit bounds.

This module is the single source of every formula of Sections 2-3 of the paper (walla-paper.tex):
training computes the advantage s_i - b_-i it regresses wagers onto here, evaluation scores and pools
predictions here. Everything is vectorized over arbitrary leading batch dims (no loop over agents) and
works on torch tensors of float32 or float64; outputs keep the (promoted) input dtype.

Shapes: ``probs[..., M, K]`` (M agents, K options), ``wagers[..., M]``, ``target[..., K]``. Leading dims
broadcast against each other. ``target`` is either a one-hot outcome (realized score) or a distribution
(a BayesX posterior, or an agent's belief): every quantity below is *linear* in ``target``, so passing a
belief q yields exactly the expectation E_{Y~q}[.] of the realized quantity.

Edge cases (documented choices, see loo_baseline):
    * No opposing stake (M = 1, or every other agent wagers exactly 0): the baseline is the score of the
      uniform forecast over the enabled options, for both variants. It is independent of (p_i, w_i) (DSIC,
      alignment), lies in [s_min, s_max] (deficit bound) and is a proper forecast (WALLA II stays
      arbitrage-free). Any positive opposing stake, however small, gives the paper's formula exactly (the
      others' wagers are divided by their largest one first, so tiny stakes never underflow into it).
    * All wagers zero in ``pool``: equal weights (no stake carries no information about whom to trust).
    * Log pooling clamps probabilities at LOG_POOL_EPS = 1e-30 before the log, so a zero never gives NaN.
"""

from __future__ import annotations

import torch
from walla.train.mechanism_checks import (
    as_float,
    as_mask,
    check_choice,
    check_consts,
    check_shapes,
    check_values,
    common_dtype,
    prepare,
    simplex_atol,
)

Tensor = torch.Tensor

VARIANTS = ("I", "II")
POOL_KINDS = ("linear", "log")
WSWM_SCORES = ("brier", "scaled_linear")

LOG_POOL_EPS = 1e-30  # probability floor inside log pooling; normal in float32 and float64
KL_EPS = 1e-10  # KL(gold || aggregate): +eps inside the gold log, aggregate clipped at eps (SPEC §8)


def _uniform(p: Tensor, mask: Tensor | None) -> Tensor:
    """The uninformative forecast: uniform over the enabled options, [..., K] (or [K])."""
    if mask is None:
        return torch.full(p.shape[-1:], 1.0 / p.shape[-1], dtype=p.dtype, device=p.device)
    m = mask.to(p.dtype)
    return m / m.sum(-1, keepdim=True)


# ----------------------------------------------------------------------------------------- scoring


def score_bounds(c1: float = 1.0, c2: float = 0.5) -> tuple[float, float]:
    """(s_min, s_max) of the Brier score: ||p - delta_y||^2 ranges over [0, 2]."""
    return c1 - 2.0 * c2, c1


def brier_loss(probs: Tensor, target: Tensor) -> Tensor:
    """E_{Y~target} ||p - delta_Y||^2 = sum p^2 - 2 <p, q> + sum q  (the unhalved Brier of SPEC §8).

    Written with ``sum q`` (= 1 on the simplex) instead of 1 so it is exactly linear in ``target``.
    """
    return (probs * probs).sum(-1) - 2.0 * (probs * target).sum(-1) + target.sum(-1)  # [...]


def brier_score(
    probs: Tensor, target: Tensor, c1: float = 1.0, c2: float = 0.5, validate: bool = True
) -> Tensor:
    """Brier score s = c1 - c2 E_{Y~target} ||p - delta_Y||^2 of ``probs[..., K]`` against ``target[..., K]``.

    One-hot target: the realized score. Distribution target (BayesX posterior, a belief): the expected
    score c1 - c2 (1 + sum p^2 - 2 sum p q) of SPEC §5.2. Returns ``[...]`` (broadcast leading dims).
    """
    p0, q0 = as_float(probs), as_float(target)
    dtype = common_dtype(p0, q0)
    p, q = p0.to(dtype), q0.to(dtype)
    if p.shape[-1:] != q.shape[-1:]:
        raise ValueError(f"target: last dim must match probs ({tuple(p.shape)}), got {tuple(q.shape)}")
    try:
        torch.broadcast_shapes(p.shape, q.shape)
    except RuntimeError:
        raise ValueError(
            f"batch dims do not broadcast (probs {tuple(p.shape)}, target {tuple(q.shape)})"
        ) from None
    if validate:
        check_consts(c2=c2)
        check_values(simplex=[("probs", p), ("target", q)], atol=simplex_atol(p.shape[-1], p0, q0))
    return c1 - c2 * brier_loss(p, q)


def regret(agg_loss: Tensor, agent_losses: Tensor) -> Tensor:
    """Dynamic regret per question: loss of the aggregate minus the best agent's loss.

    agg_loss [...], agent_losses [..., M] -> [...].
    """
    return agg_loss - agent_losses.amin(-1)


def brier_regret(agg: Tensor, probs: Tensor, target: Tensor) -> Tensor:
    """Brier D-regret (SPEC §8): Brier(agg) - min_i Brier(p_i), unhalved, per question -> [...].

    agg [..., K], probs [..., M, K], target [..., K]. The one implementation used by WALLA's online early
    stopping, the baselines' validation and evaluate/metrics.py.
    """
    return regret(brier_loss(agg, target), brier_loss(probs, target.unsqueeze(-2)))


def kl_gold(target: Tensor, agg: Tensor, eps: float = KL_EPS) -> Tensor:
    """KL(gold || aggregate) over the options, per question -> [...].

    SPEC §8's validation form: +eps inside the gold log, the aggregate clipped at eps. Used by early
    stopping on soft-target (BayesX) data.
    """
    return (target * ((target + eps).log() - agg.clamp_min(eps).log())).sum(-1)


# ----------------------------------------------------------------------------------------- baselines


def _baseline(
    probs: Tensor,
    wagers: Tensor,
    target: Tensor,
    scores: Tensor,
    mask: Tensor | None,
    variant: str,
    c1: float,
    c2: float,
) -> Tensor:
    """b_-i for all agents at once: an [M, M] off-diagonal contraction instead of a loop over agents.

    The others' stake is summed directly (not total minus own): that would cancel when one wager
    dominates, e.g. float32 0.9 + 1e-8 - 0.9 == 0. The others' wagers are divided by their largest one
    before weighting (the weighted mean is scale-free), so a positive opposing stake never underflows:
    the uniform placeholder u enters ONLY when every other wager is exactly 0.
    """
    m = wagers.shape[-1]
    off = 1.0 - torch.eye(m, dtype=wagers.dtype, device=wagers.device)  # [M, M], zero diagonal
    w_others = wagers.unsqueeze(-2) * off  # [..., M(i), M(j)]: w_j for j != i
    top = w_others.amax(-1, keepdim=True)  # [..., M, 1] largest opposing wager
    staked = top > 0  # [..., M, 1] False: no opposing stake at all
    w_rel = w_others / torch.where(staked, top, torch.ones_like(top))  # [..., M, M], max 1 per row
    w_minus = torch.where(staked[..., 0], w_rel.sum(-1), torch.ones_like(top[..., 0]))  # [..., M] >= 1
    u = _uniform(probs, mask)  # [..., K]
    if variant == "I":
        # wager-weighted mean of the others' scores (eq. variant1)
        s_u = (c1 - c2 * brier_loss(u, target)).unsqueeze(-1)  # [..., 1]
        b = (w_rel * scores.unsqueeze(-2)).sum(-1) / w_minus  # [..., M]
        return torch.where(staked[..., 0], b, s_u)
    # score of the wager-weighted linear pool of the others' predictions (eq. variant2)
    q_minus = torch.matmul(w_rel, probs) / w_minus.unsqueeze(-1)  # [..., M, K]
    q_minus = torch.where(staked, q_minus, u.unsqueeze(-2))
    return c1 - c2 * brier_loss(q_minus, target.unsqueeze(-2))  # q_minus [..., M, K] -> [..., M]


def _scores_and_baseline(
    probs, wagers, target, variant, c1, c2, option_mask, validate
) -> tuple[Tensor, Tensor]:
    """(s_i [..., M], b_-i [..., M]): each agent's score and its leave-one-out baseline."""
    check_choice("variant", variant, VARIANTS)
    p, w, q, mask = prepare(probs, wagers, target, validate, option_mask)
    if validate:
        check_consts(c2=c2)
    scores = c1 - c2 * brier_loss(p, q.unsqueeze(-2))  # [..., M]
    return scores, _baseline(p, w, q, scores, mask, variant, c1, c2)


def loo_baseline(
    probs: Tensor,
    wagers: Tensor,
    target: Tensor,
    variant: str = "I",
    c1: float = 1.0,
    c2: float = 0.5,
    option_mask: Tensor | None = None,
    validate: bool = True,
) -> Tensor:
    """Leave-one-out baseline b_-i for every agent: ``[..., M]``.

    Variant I:  b_-i = sum_{j!=i} w_j s(p_j) / W_-i      (wager-weighted mean of the others' scores)
    Variant II: b_-i = s(sum_{j!=i} w_j p_j / W_-i)       (score of the others' linear pool; always a
                linear pool whatever pooling aggregates, as in the reference)
    with W_-i = sum_{j!=i} w_j. No opposing stake (M = 1, or nobody else wagers): b_-i = s(u, y), the
    score of the uniform forecast u over the enabled options (``option_mask``), i.e. c1 - c2 (1 - 1/K);
    any positive W_-i, however small (1e-300 in float64), gives the formula above exactly. Why u: b stays
    independent of (p_i, w_i) (DSIC, advantage-wager alignment), inside [s_min, s_max] (deficit bound),
    and since u is a proper
    forecast WALLA II keeps no-arbitrage (E_{Y~u}[s(p_i) - s(u)] <= 0). The reference's 0/1e-16 division
    gives 0 (= s_min) for variant I and s(0-vector) = c1 - c2 for variant II at M = 1 instead.
    """
    return _scores_and_baseline(probs, wagers, target, variant, c1, c2, option_mask, validate)[1]


def advantage(
    probs: Tensor,
    wagers: Tensor,
    target: Tensor,
    variant: str = "I",
    c1: float = 1.0,
    c2: float = 0.5,
    option_mask: Tensor | None = None,
    validate: bool = True,
) -> Tensor:
    """Comparative advantage A_i = s(p_i, y) - b_-i: ``[..., M]`` (training regresses wagers onto it).

    b_-i depends on the *other* agents' wagers, so autograd links agents through it: detach A before
    using it as agent i's regression target if agents must learn independently (SPEC §5.3).
    """
    scores, baseline = _scores_and_baseline(probs, wagers, target, variant, c1, c2, option_mask, validate)
    return scores - baseline


def net_payout(
    probs: Tensor,
    wagers: Tensor,
    target: Tensor,
    variant: str = "I",
    c1: float = 1.0,
    c2: float = 0.5,
    c3: float = 0.5,
    option_mask: Tensor | None = None,
    validate: bool = True,
) -> Tensor:
    """WALLA net payout pi_i = w_i (s_i - b_-i - c3 w_i): ``[..., M]`` (Def. "Net Payout Function")."""
    if validate:
        check_consts(c3=c3)
    w = as_float(wagers)
    return payout(w, advantage(probs, w, target, variant, c1, c2, option_mask, validate), c3)


def payout(wagers: Tensor, advantage: Tensor, c3: float = 0.5) -> Tensor:
    """pi_i = w_i (A_i - c3 w_i) from an advantage already computed (net_payout = this after advantage)."""
    w = wagers.to(advantage.dtype)
    return w * (advantage - c3 * w)


def best_response_wager(
    advantage: Tensor, c3: float = 0.5, w_max: float | None = None, w_min: float = 0.0
) -> Tensor:
    """Best-response wager (A / 2 c3)^+ (Theorem "Advantage-Wager Alignment").

    E[pi] = w A - c3 w^2 is concave in w, so the optimum over [w_min, w_max] is the clipped unconstrained
    optimum. The reference clips the hindsight advantage to [1e-16, 1 - 1e-16] (c3 = 1/2): pass
    ``w_min=1e-16, w_max=1 - 1e-16`` to reproduce it.
    """
    check_consts(c3=c3)
    if w_max is not None and w_max < w_min:
        raise ValueError(f"w_max: must be >= w_min={w_min}, got {w_max!r}")
    if w_min < 0:
        raise ValueError(f"w_min: must be >= 0, got {w_min!r}")
    a = as_float(advantage)
    return (a / (2.0 * c3)).clamp(min=w_min, max=w_max)


# ----------------------------------------------------------------------------------------- WSWM


def wswm_payout(
    probs: Tensor,
    wagers: Tensor,
    target: Tensor,
    c1: float = 1.0,
    c2: float = 0.5,
    score: str = "brier",
    validate: bool = True,
) -> Tensor:
    """Weighted-score wagering mechanism (Lambert et al.; eq. wswm_payout), net form: ``[..., M]``.

    pi_i = w_i (s_i - sum_j w_j s_j / sum_j w_j). Exactly budget balanced (sum_i pi_i = 0); all zero wagers
    give all-zero payouts. ``score="brier"`` uses the Brier score (c1, c2); ``score="scaled_linear"`` is the
    appendix warm-up score s_i(y) = p_i[y] / sum_j w_j p_j[y] (c1, c2 unused), under which
    pi_i = -w_i dL/dw_i for L = -log p_agg[y], p_agg the wager-weighted linear pool.
    """
    check_choice("score", score, WSWM_SCORES)
    p, w, q, _ = prepare(probs, wagers, target, validate)
    if score == "brier":
        if validate:
            check_consts(c2=c2)
        s = c1 - c2 * brier_loss(p, q.unsqueeze(-2))  # [..., M]
    else:
        pooled = (w.unsqueeze(-1) * p).sum(-2)  # [..., K]  sum_j w_j p_j[y] (unnormalized)
        per_y = p / pooled.unsqueeze(-2).clamp_min(torch.finfo(p.dtype).tiny)  # [..., M, K]
        s = (per_y * q.unsqueeze(-2)).sum(-1)  # [..., M]
    total = w.sum(-1, keepdim=True)  # [..., 1]
    mean = (w * s).sum(-1, keepdim=True) / total.clamp_min(torch.finfo(p.dtype).tiny)  # [..., 1]
    return w * (s - mean)


# ----------------------------------------------------------------------------------------- pooling


def pool_weights(weights: Tensor) -> Tensor:
    """Non-negative ``weights[..., M]`` renormalized to sum 1; a row without stake gets equal weights."""
    total = weights.sum(-1, keepdim=True)  # [..., 1]
    has_stake = total > 0
    safe = torch.where(has_stake, total, torch.ones_like(total))
    return torch.where(has_stake, weights / safe, torch.full_like(weights, 1.0 / weights.shape[-1]))


def pool(
    probs: Tensor,
    weights: Tensor,
    kind: str = "linear",
    option_mask: Tensor | None = None,
    eps: float = LOG_POOL_EPS,
    validate: bool = True,
) -> Tensor:
    """Aggregate ``probs[..., M, K]`` with non-negative ``weights[..., M]`` into ``[..., K]``.

    Paper Sec. "Aggregation". Weights are renormalized to sum 1; a row of all-zero weights pools with
    equal weights. linear: sum_i w_i p_i (eq. linear-pool). log: normalize(exp(sum_i w_i log max(p_i,
    eps))) (eq. log-pool), stable when some p_i are exactly zero. ``option_mask[..., K]`` (bool): False
    options get probability 0 and the rest is renormalized (datasets with 3-5 options padded to K).
    """
    check_choice("kind", kind, POOL_KINDS)
    p0, w = as_float(probs), as_float(weights)
    dtype = common_dtype(p0, w)
    p, w = p0.to(dtype), w.to(dtype)
    check_shapes(p, w, None, "weights")
    mask = as_mask(option_mask, p, w)
    if validate:
        masks = [("option_mask", mask)] if mask is not None else []
        atol = simplex_atol(p.shape[-1], p0)
        check_values(simplex=[("probs", p)], nonneg=[("weights", w)], masks=masks, atol=atol)
    w_norm = pool_weights(w)  # [..., M], rows sum to 1
    if kind == "linear":
        pooled = (w_norm.unsqueeze(-1) * p).sum(-2)  # [..., K]
        if mask is not None:
            pooled = pooled * mask
        z = pooled.sum(-1, keepdim=True)  # [..., 1]
        if mask is None:
            return pooled / z
        # all mass on masked options -> uniform over the enabled ones
        return torch.where(z > 0, pooled / torch.where(z > 0, z, torch.ones_like(z)), _uniform(pooled, mask))
    logits = (w_norm.unsqueeze(-1) * p.clamp_min(eps).log()).sum(-2)  # [..., K]
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    return torch.softmax(logits, dim=-1)


# ----------------------------------------------------------------------------------------- deficit


def deficit_bound(c2: float = 0.5, c3: float = 0.5) -> float:
    """Worst-case total net payout of WALLA I/II with the Brier score: (s_max - s_min)^2 / 4c3 = c2^2 / c3.

    Second inequality of the paper's "Bounded Worst-Case Deficit" proposition; independent of M and wagers.
    """
    check_consts(c2=c2, c3=c3)
    return c2 * c2 / c3
