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
    * No opposing stake (M = 1, or every other agent wagers 0): the baseline is the score of the uniform
      forecast over the enabled options, for both variants (a phantom agent with stake LOO_EPS - W_-i
      reporting uniform fills the gap, so the baseline is continuous and exact once W_-i >= LOO_EPS). It
      is independent of (p_i, w_i) (DSIC, alignment), lies in [s_min, s_max] (deficit bound) and is a
      proper forecast (WALLA II stays arbitrage-free).
    * All wagers zero in ``pool``: equal weights (no stake carries no information about whom to trust).
    * Log pooling clamps probabilities at LOG_POOL_EPS = 1e-30 before the log, so a zero never gives NaN.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import torch

Tensor = torch.Tensor

VARIANTS = ("I", "II")
POOL_KINDS = ("linear", "log")
WSWM_SCORES = ("brier", "scaled_linear")

LOO_EPS = 1e-16  # opposing stake below which a uniform phantom agent tops it up (reference: 1e-16)
LOG_POOL_EPS = 1e-30  # probability floor inside log pooling; normal in float32 and float64
SIMPLEX_ATOL = (
    1e-4  # tolerated |sum - 1| and negativity of probabilities (float32 softmax: ~1e-7; fp16: K ulp)
)


# ----------------------------------------------------------------------------------------- validation


def _as_float(x: object) -> Tensor:
    """Tensor view of an array-like; integer/bool input (e.g. a one-hot target) becomes float."""
    t = x if isinstance(x, Tensor) else torch.as_tensor(x)
    return t if t.is_floating_point() else t.to(torch.get_default_dtype())


def _simplex_atol(k: int, *originals: Tensor) -> float:
    """SIMPLEX_ATOL, widened to the rounding of half-precision inputs (float16 sums are off by ~K ulp)."""
    eps = max((torch.finfo(t.dtype).eps for t in originals if t.is_floating_point()), default=0.0)
    return max(SIMPLEX_ATOL, k * eps)


def _common_dtype(*tensors: Tensor) -> torch.dtype:
    """Promoted float dtype of the inputs; half precision is computed in float32 (scores need the bits)."""
    dtype = None
    for t in tensors:
        if t.is_floating_point():
            dtype = t.dtype if dtype is None else torch.promote_types(dtype, t.dtype)
    if dtype is None or dtype not in (torch.float32, torch.float64):
        return torch.float32
    return dtype


def _where(bad: Tensor) -> str:
    """First offending index of a bool tensor, as a readable tuple."""
    idx = tuple(int(i) for i in torch.nonzero(bad)[0])
    return str(idx[0] if len(idx) == 1 else idx) if idx else "()"


def _check_values(
    simplex: Sequence[tuple[str, Tensor]] = (),
    nonneg: Sequence[tuple[str, Tensor]] = (),
    masks: Sequence[tuple[str, Tensor]] = (),
    atol: float = SIMPLEX_ATOL,
) -> None:
    """Raise ValueError naming the argument and offending value; one device sync when all is well.

    Fast path: a handful of reductions folded into one flag vector. NaN fails every comparison and
    +-inf breaks the row sums, so the sum check also catches non-finite probabilities.
    """
    flags = []
    for _, p in simplex:
        if p.numel():
            flags += [~((p.sum(-1) - 1).abs().amax() <= atol), p.amin() < -atol]
    for _, w in nonneg:
        if w.numel():
            flags += [~(w.amin() >= 0), w.amax() == float("inf")]
    for _, m in masks:
        if m.numel():
            flags.append(~m.any(-1).all())
    if not flags or not bool(torch.stack(flags).any()):
        return
    # slow path: find the first problem and describe it
    for name, p in simplex:
        bad = ~torch.isfinite(p)
        if bad.any():
            raise ValueError(f"{name}: non-finite value {p[bad][0].item()} at index {_where(bad)}")
        bad = p < -atol
        if bad.any():
            raise ValueError(f"{name}: negative probability {p[bad][0].item():.6g} at index {_where(bad)}")
        sums = p.sum(-1)
        bad = (sums - 1).abs() > atol
        if bad.any():
            raise ValueError(
                f"{name}: not a probability vector over the last axis at index {_where(bad)}: sums to "
                f"{sums[bad][0].item():.6g} (expected 1 within {atol:g})"
            )
    for name, w in nonneg:
        bad = ~torch.isfinite(w)
        if bad.any():
            raise ValueError(f"{name}: non-finite value {w[bad][0].item()} at index {_where(bad)}")
        bad = w < 0
        if bad.any():
            raise ValueError(f"{name}: must be >= 0, got {w[bad][0].item():.6g} at index {_where(bad)}")
    for name, m in masks:
        bad = ~m.any(-1)
        if bad.any():
            raise ValueError(f"{name}: no option enabled at index {_where(bad)} (need >= 1 True per row)")


def _check_shapes(probs: Tensor, wagers: Tensor | None, target: Tensor | None, wname: str = "wagers") -> None:
    if probs.dim() < 2:
        raise ValueError(f"probs: expected shape [..., M, K], got {tuple(probs.shape)}")
    m, k = probs.shape[-2:]
    lead = [tuple(probs.shape[:-2])]
    if wagers is not None:
        if wagers.dim() < 1 or wagers.shape[-1] != m:
            raise ValueError(
                f"{wname}: expected shape [..., M={m}] to match probs, got {tuple(wagers.shape)}"
            )
        lead.append(tuple(wagers.shape[:-1]))
    if target is not None:
        if target.dim() < 1 or target.shape[-1] != k:
            raise ValueError(f"target: expected shape [..., K={k}] to match probs, got {tuple(target.shape)}")
        lead.append(tuple(target.shape[:-1]))
    try:
        torch.broadcast_shapes(*lead)
    except RuntimeError:
        names = ["probs[..., M, K]", f"{wname}[..., M]", "target[..., K]"]
        got = ", ".join(f"{n}: {s}" for n, s in zip(names, lead, strict=False))
        raise ValueError(f"batch dims do not broadcast ({got})") from None


def _check_consts(**consts: float) -> None:
    for name, value in consts.items():
        if not (isinstance(value, numbers.Real) and value > 0 and value < float("inf")):
            raise ValueError(f"{name}: must be a positive finite number, got {value!r}")


def _check_choice(name: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}: expected one of {list(allowed)}, got {value!r}")


def _as_mask(option_mask: object, p: Tensor, *others: Tensor) -> Tensor | None:
    """Check an option mask [..., K] (bool) against probs [..., M, K] and the other batched args."""
    if option_mask is None:
        return None
    mask = option_mask if isinstance(option_mask, Tensor) else torch.as_tensor(option_mask)
    if mask.dtype != torch.bool:
        raise ValueError(f"option_mask: expected a bool tensor, got dtype {mask.dtype}")
    if mask.dim() < 1 or mask.shape[-1] != p.shape[-1]:
        raise ValueError(
            f"option_mask: expected shape [..., K={p.shape[-1]}] to match probs, got {tuple(mask.shape)}"
        )
    try:
        torch.broadcast_shapes(
            tuple(mask.shape[:-1]), tuple(p.shape[:-2]), *(tuple(t.shape[:-1]) for t in others)
        )
    except RuntimeError:
        raise ValueError(
            f"batch dims do not broadcast (probs {tuple(p.shape)}, option_mask {tuple(mask.shape)})"
        ) from None
    return mask.to(p.device)


def _prepare(probs, wagers, target, validate: bool, option_mask=None, wname: str = "wagers"):
    p0, w0, q0 = _as_float(probs), _as_float(wagers), _as_float(target)
    dtype = _common_dtype(p0, w0, q0)
    p, w, q = p0.to(dtype), w0.to(dtype), q0.to(dtype)
    _check_shapes(p, w, q, wname)
    mask = _as_mask(option_mask, p, w, q)
    if validate:
        masks = [("option_mask", mask)] if mask is not None else []
        atol = _simplex_atol(p.shape[-1], p0, q0)
        _check_values(simplex=[("probs", p), ("target", q)], nonneg=[(wname, w)], masks=masks, atol=atol)
    return p, w, q, mask


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
    p0, q0 = _as_float(probs), _as_float(target)
    dtype = _common_dtype(p0, q0)
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
        _check_consts(c2=c2)
        _check_values(simplex=[("probs", p), ("target", q)], atol=_simplex_atol(p.shape[-1], p0, q0))
    return c1 - c2 * brier_loss(p, q)


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
    dominates, e.g. float32 0.9 + 1e-8 - 0.9 == 0. A phantom agent with stake (LOO_EPS - W_-i)^+ that
    reports the uniform forecast u fills in when the real opposing stake is (nearly) zero.
    """
    m = wagers.shape[-1]
    off = 1.0 - torch.eye(m, dtype=wagers.dtype, device=wagers.device)  # [M, M], zero diagonal
    w_others = wagers.unsqueeze(-2) * off  # [..., M(i), M(j)]: w_j for j != i
    w_minus = w_others.sum(-1)  # [..., M]  W_-i
    phantom = (LOO_EPS - w_minus).clamp_min(0.0)  # [..., M]  0 whenever W_-i >= LOO_EPS
    denom = w_minus + phantom  # [..., M]  = max(W_-i, LOO_EPS) > 0
    u = _uniform(probs, mask)  # [..., K]
    if variant == "I":
        # wager-weighted mean of the others' scores (eq. variant1)
        s_u = c1 - c2 * brier_loss(u, target)  # [...]
        return ((w_others * scores.unsqueeze(-2)).sum(-1) + phantom * s_u.unsqueeze(-1)) / denom  # [..., M]
    # score of the wager-weighted linear pool of the others' predictions (eq. variant2)
    q_minus = (torch.matmul(w_others, probs) + phantom.unsqueeze(-1) * u.unsqueeze(-2)) / denom.unsqueeze(-1)
    return c1 - c2 * brier_loss(q_minus, target.unsqueeze(-2))  # q_minus [..., M, K] -> [..., M]


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
    with W_-i = sum_{j!=i} w_j. No opposing stake (M = 1, or nobody else wagers): b_-i = s(u, y), the score
    of the uniform forecast u over the enabled options (``option_mask``), i.e. c1 - c2 (1 - 1/K). Formally a
    phantom agent with stake (LOO_EPS - W_-i)^+ reporting u joins the others, so b is continuous in the
    wagers and equals the paper's formula exactly once W_-i >= LOO_EPS (always true for M >= 2 with the
    reference's sigmoid wagers, which are clamped at 1e-16). Why u: b stays independent of (p_i, w_i)
    (DSIC, advantage-wager alignment), inside [s_min, s_max] (deficit bound), and since u is a proper
    forecast WALLA II keeps no-arbitrage (E_{Y~u}[s(p_i) - s(u)] <= 0). The reference's 0/1e-16 division
    gives 0 (= s_min) for variant I and s(0-vector) = c1 - c2 for variant II at M = 1 instead.
    """
    _check_choice("variant", variant, VARIANTS)
    p, w, q, mask = _prepare(probs, wagers, target, validate, option_mask)
    if validate:
        _check_consts(c2=c2)
    scores = c1 - c2 * brier_loss(p, q.unsqueeze(-2))  # [..., M]
    return _baseline(p, w, q, scores, mask, variant, c1, c2)


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
    _check_choice("variant", variant, VARIANTS)
    p, w, q, mask = _prepare(probs, wagers, target, validate, option_mask)
    if validate:
        _check_consts(c2=c2)
    scores = c1 - c2 * brier_loss(p, q.unsqueeze(-2))  # [..., M]
    return scores - _baseline(p, w, q, scores, mask, variant, c1, c2)


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
        _check_consts(c3=c3)
    w = _as_float(wagers)
    adv = advantage(probs, w, target, variant, c1, c2, option_mask, validate)
    w = w.to(adv.dtype)
    return w * (adv - c3 * w)


def best_response_wager(
    advantage: Tensor, c3: float = 0.5, w_max: float | None = None, w_min: float = 0.0
) -> Tensor:
    """Best-response wager (A / 2 c3)^+ (Theorem "Advantage-Wager Alignment").

    E[pi] = w A - c3 w^2 is concave in w, so the optimum over [w_min, w_max] is the clipped unconstrained
    optimum. The reference clips the hindsight advantage to [1e-16, 1 - 1e-16] (c3 = 1/2): pass
    ``w_min=1e-16, w_max=1 - 1e-16`` to reproduce it.
    """
    _check_consts(c3=c3)
    if w_max is not None and w_max < w_min:
        raise ValueError(f"w_max: must be >= w_min={w_min}, got {w_max!r}")
    if w_min < 0:
        raise ValueError(f"w_min: must be >= 0, got {w_min!r}")
    a = _as_float(advantage)
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
    _check_choice("score", score, WSWM_SCORES)
    p, w, q, _ = _prepare(probs, wagers, target, validate)
    if score == "brier":
        if validate:
            _check_consts(c2=c2)
        s = c1 - c2 * brier_loss(p, q.unsqueeze(-2))  # [..., M]
    else:
        pooled = (w.unsqueeze(-1) * p).sum(-2)  # [..., K]  sum_j w_j p_j[y] (unnormalized)
        per_y = p / pooled.unsqueeze(-2).clamp_min(torch.finfo(p.dtype).tiny)  # [..., M, K]
        s = (per_y * q.unsqueeze(-2)).sum(-1)  # [..., M]
    total = w.sum(-1, keepdim=True)  # [..., 1]
    mean = (w * s).sum(-1, keepdim=True) / total.clamp_min(torch.finfo(p.dtype).tiny)  # [..., 1]
    return w * (s - mean)


# ----------------------------------------------------------------------------------------- pooling


def pool(
    probs: Tensor,
    weights: Tensor,
    kind: str = "linear",
    option_mask: Tensor | None = None,
    eps: float = LOG_POOL_EPS,
    validate: bool = True,
) -> Tensor:
    """Aggregate ``probs[..., M, K]`` with non-negative ``weights[..., M]`` into ``[..., K]`` (paper Sec. "Aggregation").

    Weights are renormalized to sum 1; a row of all-zero weights pools with equal weights.
    linear: sum_i w_i p_i (eq. linear-pool).  log: normalize(exp(sum_i w_i log max(p_i, eps))) (eq. log-pool),
    stable when some p_i are exactly zero. ``option_mask[..., K]`` (bool): False options get probability 0
    and the rest is renormalized (datasets with 3-5 options padded to K).
    """
    _check_choice("kind", kind, POOL_KINDS)
    p0, w = _as_float(probs), _as_float(weights)
    dtype = _common_dtype(p0, w)
    p, w = p0.to(dtype), w.to(dtype)
    _check_shapes(p, w, None, "weights")
    mask = _as_mask(option_mask, p, w)
    if validate:
        masks = [("option_mask", mask)] if mask is not None else []
        atol = _simplex_atol(p.shape[-1], p0)
        _check_values(simplex=[("probs", p)], nonneg=[("weights", w)], masks=masks, atol=atol)
    total = w.sum(-1, keepdim=True)  # [..., 1]
    has_stake = total > 0
    w_norm = torch.where(
        has_stake,
        w / torch.where(has_stake, total, torch.ones_like(total)),
        torch.full_like(w, 1.0 / w.shape[-1]),
    )  # [..., M], rows sum to 1
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
    _check_consts(c2=c2, c3=c3)
    return c2 * c2 / c3


def deficit_bound_w(wagers: Tensor, c2: float = 0.5, c3: float = 0.5, validate: bool = True) -> Tensor:
    """First, wager-dependent inequality of the deficit proposition: sum_i pi_i <= ((s_max-s_min)/W - c3) sum_i w_i^2.

    With the Brier score s_max - s_min = 2 c2 and W = sum_i w_i. ``wagers[..., M]`` -> ``[...]``; 0 when W = 0
    (then every payout is 0).
    """
    w = _as_float(wagers)
    if w.dim() < 1:
        raise ValueError(f"wagers: expected shape [..., M], got {tuple(w.shape)}")
    if validate:
        _check_consts(c2=c2, c3=c3)
        _check_values(nonneg=[("wagers", w)])
    total = w.sum(-1)  # [...]
    sq = (w * w).sum(-1)  # [...]
    safe = torch.where(total > 0, total, torch.ones_like(total))
    return torch.where(total > 0, (2.0 * c2 / safe - c3) * sq, torch.zeros_like(total))
