"""Formulas, edge cases, pooling, dtypes, broadcasting and input errors of walla.train.mechanism.

Incentive properties (DSIC, deficit, arbitrage, normality, WSWM) are in test_mechanism_properties.py.
Run: .venv/bin/pytest tests/train/test_mechanism.py
"""

from __future__ import annotations

import math
import re

import pytest
import torch
from references import deficit_bound_w
from walla.train import mechanism as mech
from walla.train.mechanism import (
    advantage,
    best_response_wager,
    brier_score,
    deficit_bound,
    loo_baseline,
    net_payout,
    pool,
    wswm_payout,
)

F64 = torch.float64


def simplex(gen: torch.Generator, *shape: int, dtype=F64) -> torch.Tensor:
    """Uniform (Dirichlet(1)) samples on the simplex over the last dim."""
    e = -torch.rand(*shape, generator=gen, dtype=dtype).clamp_min(1e-300).log()
    return e / e.sum(-1, keepdim=True)


def one_hot(idx: torch.Tensor, k: int, dtype=F64) -> torch.Tensor:
    return torch.nn.functional.one_hot(idx, k).to(dtype)


def loop_baseline(p, w, q, variant, c1, c2):
    """Per-agent Python-loop reference of the paper's eqs. (variant1)/(variant2), W_-i > 0."""
    m = p.shape[0]
    out = []
    for i in range(m):
        others = [j for j in range(m) if j != i]
        wm = sum(float(w[j]) for j in others)
        if variant == "I":
            # score against one-hot/soft q: c1 - c2 E_{Y~q} ||p_j - delta_Y||^2
            s = [c1 - c2 * float((p[j] @ p[j]) - 2 * (p[j] @ q) + q.sum()) for j in others]
            out.append(sum(float(w[j]) * sj for j, sj in zip(others, s, strict=True)) / wm)
        else:
            qm = sum(w[j] * p[j] for j in others) / wm
            out.append(c1 - c2 * float(qm @ qm - 2 * (qm @ q) + q.sum()))
    return torch.tensor(out, dtype=F64)


# ----------------------------------------------------------------------------------------- scores


def test_brier_score_one_hot_is_realized_score():
    gen = torch.Generator().manual_seed(0)
    p = simplex(gen, 500, 4)
    y = torch.randint(0, 4, (500,), generator=gen)
    for c1, c2 in [(1.0, 0.5), (3.0, 2.0), (-1.0, 0.1)]:
        got = brier_score(p, one_hot(y, 4), c1, c2)
        want = c1 - c2 * ((p - one_hot(y, 4)) ** 2).sum(-1)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    # range [c1 - 2 c2, c1]: perfect and worst forecasts
    assert brier_score(one_hot(y, 4), one_hot(y, 4)).eq(1.0).all()
    assert brier_score(one_hot((y + 1) % 4, 4), one_hot(y, 4)).eq(0.0).all()
    assert mech.score_bounds(1.0, 0.5) == (0.0, 1.0)


def test_brier_score_soft_target_is_expected_brier_of_spec():
    """BayesX soft gold q: s = 1 - (1 + sum p^2 - 2 sum p q)/2 (SPEC 5.2) = E_{Y~q} s(p, Y)."""
    gen = torch.Generator().manual_seed(1)
    p, q = simplex(gen, 300, 2), simplex(gen, 300, 2)
    got = brier_score(p, q)
    spec = 1 - (1 + (p**2).sum(-1) - 2 * (p * q).sum(-1)) / 2
    torch.testing.assert_close(got, spec, rtol=0, atol=1e-12)
    eye = torch.eye(2, dtype=F64)
    expect = sum(q[:, y] * brier_score(p, eye[y].expand_as(p)) for y in range(2))
    torch.testing.assert_close(got, expect, rtol=0, atol=1e-12)
    # strictly proper: the expected score under q is maximal at p = q
    assert (brier_score(q, q) > got).all()


# ----------------------------------------------------------------------------------------- baselines


@pytest.mark.parametrize("variant", ["I", "II"])
def test_loo_baseline_matches_paper_formulas(variant):
    gen = torch.Generator().manual_seed(2)
    for m in [2, 3, 6]:
        p = simplex(gen, 40, m, 5)
        w = torch.rand(40, m, generator=gen, dtype=F64) * 3
        y = torch.randint(0, 5, (40,), generator=gen)
        for soft in [False, True]:
            q = simplex(gen, 40, 5) if soft else one_hot(y, 5)
            got = loo_baseline(p, w, q, variant, c1=2.0, c2=0.75)
            want = torch.stack([loop_baseline(p[b], w[b], q[b], variant, 2.0, 0.75) for b in range(40)])
            torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    # M = 2: both variants reduce to the other agent's score
    p, w, q = simplex(gen, 10, 2, 3), torch.rand(10, 2, generator=gen, dtype=F64) + 0.1, simplex(gen, 10, 3)
    torch.testing.assert_close(loo_baseline(p, w, q, variant), brier_score(p, q.unsqueeze(-2)).flip(-1))


def test_loo_baseline_matches_reference_total_minus_own_form():
    """SPEC 5.2 (defaults c1=1, c2=1/2, positive sigmoid wagers): b_-i = (sum w s - w_i s_i)/max(W - w_i, 1e-16)."""
    gen = torch.Generator().manual_seed(3)
    p, y = simplex(gen, 200, 4, 3), torch.randint(0, 3, (200,), generator=gen)
    w = torch.sigmoid(torch.randn(200, 4, generator=gen, dtype=F64) / 2.0)
    q = one_hot(y, 3)
    s = 1 - ((p - q.unsqueeze(1)) ** 2).sum(-1) / 2
    denom = (w.sum(-1, keepdim=True) - w).clamp_min(1e-16)
    b1 = ((w * s).sum(-1, keepdim=True) - w * s) / denom
    pooled = ((w.unsqueeze(-1) * p).sum(1, keepdim=True) - w.unsqueeze(-1) * p) / denom.unsqueeze(-1)
    b2 = 1 - ((pooled - q.unsqueeze(1)) ** 2).sum(-1) / 2
    torch.testing.assert_close(loo_baseline(p, w, q, "I"), b1, rtol=0, atol=1e-12)
    torch.testing.assert_close(loo_baseline(p, w, q, "II"), b2, rtol=0, atol=1e-12)
    torch.testing.assert_close(advantage(p, w, q, "I"), s - b1, rtol=0, atol=1e-12)


@pytest.mark.parametrize("variant", ["I", "II"])
def test_loo_baseline_without_opposing_stake_is_uniform_forecast_score(variant):
    """M = 1 or all other wagers exactly 0 -> b = s(u, y) = c1 - c2 (1 - 1/K) (u uniform over enabled
    options); any positive opposing stake, however small, gives the paper's formula (no underflow)."""
    gen = torch.Generator().manual_seed(4)
    c1, c2, k = 3.0, 0.25, 4
    s_u = c1 - c2 * (1 - 1 / k)
    p1, q = simplex(gen, 7, 1, k), simplex(gen, 7, k)
    torch.testing.assert_close(
        loo_baseline(p1, torch.rand(7, 1, dtype=F64), q, variant, c1, c2), torch.full((7, 1), s_u, dtype=F64)
    )
    p = simplex(gen, 7, 3, k)
    w = torch.tensor([[2.0, 0.0, 0.0]], dtype=F64).expand(7, 3)
    b = loo_baseline(p, w, q, variant, c1, c2)
    torch.testing.assert_close(b[:, 0], torch.full((7,), s_u, dtype=F64))  # nobody else wagers
    # agents 1 and 2 face only agent 0's stake: their baseline is agent 0's score (both variants)
    torch.testing.assert_close(b[:, 1], brier_score(p[:, 0], q, c1, c2))
    # an option mask shrinks the uniform forecast to the enabled options: K_eff = 3
    q3 = torch.tensor([0.2, 0.3, 0.5, 0.0], dtype=F64)
    mask = torch.tensor([True, True, True, False])
    b3 = loo_baseline(p1[:1], torch.ones(1, 1, dtype=F64), q3, variant, c1, c2, option_mask=mask)
    torch.testing.assert_close(b3, torch.full((1, 1), c1 - c2 * (1 - 1 / 3), dtype=F64))
    # a tiny but positive opposing stake is still the others' stake: the placeholder never enters
    for tiny, dtype in ((1e-300, F64), (1e-17, F64), (1e-30, torch.float32)):
        w_tiny = torch.tensor([1.0, tiny, 3 * tiny], dtype=dtype)
        want = {
            "I": 0.25 * brier_score(p[:, 1], q, c1, c2) + 0.75 * brier_score(p[:, 2], q, c1, c2),
            "II": brier_score(0.25 * p[:, 1] + 0.75 * p[:, 2], q, c1, c2),
        }[variant]
        got = loo_baseline(p.to(dtype), w_tiny, q.to(dtype), variant, c1, c2)[:, 0]
        torch.testing.assert_close(got, want.to(dtype))
    # all wagers zero: every baseline is s(u) and every payout is exactly 0
    zeros = torch.zeros(7, 3, dtype=F64)
    torch.testing.assert_close(loo_baseline(p, zeros, q, variant, c1, c2), torch.full((7, 3), s_u, dtype=F64))
    assert net_payout(p, zeros, q, variant, c1, c2).eq(0).all()


def test_loo_baseline_does_not_cancel_in_float32():
    """Others' stake is summed directly: a dominant 0.9 wager next to 1e-8 ones keeps W_-i = 2e-8 > 0."""
    p = torch.tensor([[0.2, 0.8], [1.0, 0.0], [0.0, 1.0]], dtype=torch.float32)
    w = torch.tensor([0.9, 1e-8, 1e-8], dtype=torch.float32)
    q = torch.tensor([1.0, 0.0])
    b = loo_baseline(p, w, q, "I")
    torch.testing.assert_close(b[0], torch.tensor(0.5))  # mean of scores 1.0 and 0.0


def test_net_payout_advantage_and_best_response():
    gen = torch.Generator().manual_seed(5)
    p, q = simplex(gen, 50, 4, 3), one_hot(torch.randint(0, 3, (50,), generator=gen), 3)
    w = torch.rand(50, 4, generator=gen, dtype=F64)
    for variant in ["I", "II"]:
        a = advantage(p, w, q, variant, 1.0, 0.5)
        torch.testing.assert_close(a, brier_score(p, q.unsqueeze(1)) - loo_baseline(p, w, q, variant))
        torch.testing.assert_close(net_payout(p, w, q, variant, c3=0.7), w * (a - 0.7 * w))
    a = torch.tensor([-1.0, 0.0, 0.3, 5.0], dtype=F64)
    torch.testing.assert_close(best_response_wager(a, c3=0.5), torch.tensor([0.0, 0.0, 0.3, 5.0], dtype=F64))
    torch.testing.assert_close(
        best_response_wager(a, c3=2.0), torch.tensor([0.0, 0.0, 0.075, 1.25], dtype=F64)
    )
    torch.testing.assert_close(
        best_response_wager(a, 0.5, w_max=1.0), torch.tensor([0.0, 0.0, 0.3, 1.0], dtype=F64)
    )
    # the reference's hindsight target clamp(d, 1e-16, 1 - 1e-16)
    ref = best_response_wager(a, 0.5, w_max=1 - 1e-16, w_min=1e-16)
    torch.testing.assert_close(ref, a.clamp(1e-16, 1 - 1e-16))


def test_deficit_bound_values():
    assert deficit_bound(0.5, 0.5) == 0.5
    assert math.isclose(deficit_bound(2.0, 0.25), 16.0)
    w = torch.tensor([[1.0, 1.0], [0.0, 0.0], [0.5, 0.0]], dtype=F64)
    # ((2 c2)/W - c3) sum w^2 with c2 = c3 = 1/2: (1/2 - 1/2) 2 = 0;  W = 0 -> 0;  (2 - 1/2) 0.25
    torch.testing.assert_close(deficit_bound_w(w, 0.5, 0.5), torch.tensor([0.0, 0.0, 0.375], dtype=F64))


# ----------------------------------------------------------------------------------------- pooling


def test_pool_linear_hand_formula_with_zeros_masks_and_zero_weights():
    p = torch.tensor([[[0.5, 0.5, 0.0], [0.0, 0.2, 0.8]]], dtype=F64)  # [1, 2, 3]
    w = torch.tensor([[3.0, 1.0]], dtype=F64)
    torch.testing.assert_close(pool(p, w), torch.tensor([[0.375, 0.425, 0.2]], dtype=F64))
    # weights are renormalized: scaling them changes nothing; all-zero weights pool equally
    torch.testing.assert_close(pool(p, 10 * w), pool(p, w))
    torch.testing.assert_close(
        pool(p, torch.zeros(1, 2, dtype=F64)), torch.tensor([[0.25, 0.35, 0.4]], dtype=F64)
    )
    # mask: option 2 disabled -> zero probability, rest renormalized: (0.375, 0.425) / 0.8
    mask = torch.tensor([[True, True, False]])
    torch.testing.assert_close(
        pool(p, w, option_mask=mask), torch.tensor([[0.46875, 0.53125, 0.0]], dtype=F64)
    )
    # all pooled mass on masked options -> uniform over the enabled ones
    p2 = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 1.0]], dtype=F64)
    torch.testing.assert_close(
        pool(p2, torch.ones(2, dtype=F64), option_mask=mask[0]), torch.tensor([0.5, 0.5, 0.0], dtype=F64)
    )
    # gradients stay finite for a zero-weight row (training-time baselines differentiate the pool)
    wz = torch.zeros(2, dtype=F64, requires_grad=True)
    pool(p[0], wz)[1].backward()
    assert torch.isfinite(wz.grad).all()


def test_pool_log_hand_formula_with_zeros_and_masks():
    gen = torch.Generator().manual_seed(6)
    p, w = simplex(gen, 30, 3, 4), torch.rand(30, 3, generator=gen, dtype=F64)
    wn = w / w.sum(-1, keepdim=True)
    geo = torch.prod(p ** wn.unsqueeze(-1), dim=1)  # prod_i p_i^{w_i / W}
    torch.testing.assert_close(pool(p, w, "log"), geo / geo.sum(-1, keepdim=True))
    # SPEC 7: same as the reference's log-space pooling of log-softmax inputs
    ref = torch.softmax((wn.unsqueeze(-1) * torch.log_softmax(p.log(), -1)).sum(1), -1)
    torch.testing.assert_close(pool(p, w, "log"), ref)
    # exact zeros: no NaN; an option every agent rules out gets ~eps mass, one agent's zero is a near-veto
    pz = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.5, 0.5]], dtype=F64)
    out = pool(pz, torch.ones(2, dtype=F64), "log")
    assert torch.isfinite(out).all()
    geo = torch.tensor([math.sqrt(0.5e-30), 0.5, math.sqrt(0.5e-30)], dtype=F64)  # sqrt(p_1 p_2), eps = 1e-30
    torch.testing.assert_close(out, geo / geo.sum(), rtol=1e-12, atol=0)
    padded = torch.tensor([[0.3, 0.7, 0.0], [0.6, 0.4, 0.0]], dtype=F64)
    out = pool(padded, torch.tensor([1.0, 1.0], dtype=F64), "log")
    assert out[2] < 1e-29  # padded option: eps^(sum of weights) = 1e-30 relative mass
    masked = pool(
        padded, torch.tensor([1.0, 1.0], dtype=F64), "log", option_mask=torch.tensor([True, True, False])
    )
    assert masked[2] == 0.0
    g = torch.tensor([math.sqrt(0.18), math.sqrt(0.28)], dtype=F64)
    torch.testing.assert_close(masked[:2], g / g.sum())


# ----------------------------------------------------------------------------------------- dtypes, batching


def test_float32_and_float64_agree():
    gen = torch.Generator().manual_seed(7)
    p, w = simplex(gen, 64, 5, 4), torch.rand(64, 5, generator=gen, dtype=F64)
    q = one_hot(torch.randint(0, 4, (64,), generator=gen), 4)
    fns = {
        "score": lambda p, w, q: brier_score(p, q.unsqueeze(-2)),
        "base_I": lambda p, w, q: loo_baseline(p, w, q, "I"),
        "base_II": lambda p, w, q: loo_baseline(p, w, q, "II"),
        "pay_I": lambda p, w, q: net_payout(p, w, q, "I"),
        "pay_II": lambda p, w, q: net_payout(p, w, q, "II"),
        "wswm": lambda p, w, q: wswm_payout(p, w, q),
        "lin": lambda p, w, q: pool(p, w),
        "log": lambda p, w, q: pool(p, w, "log"),
        "br": lambda p, w, q: best_response_wager(advantage(p, w, q)),
    }
    for name, fn in fns.items():
        hi = fn(p, w, q)
        lo = fn(p.float(), w.float(), q.float())
        assert hi.dtype == F64 and lo.dtype == torch.float32, name
        torch.testing.assert_close(lo.double(), hi, rtol=1e-5, atol=1e-6, msg=name)
    # half precision is computed in float32; mixed precision promotes; an integer one-hot target is accepted
    assert pool(p.half(), w.half()).dtype == torch.float32
    assert net_payout(p.float(), w, q).dtype == F64
    torch.testing.assert_close(net_payout(p, w, q.long()), net_payout(p, w, q))


def test_batch_dims_broadcast():
    gen = torch.Generator().manual_seed(8)
    p = simplex(gen, 3, 6, 4, 5)  # [A=3, B=6, M=4, K=5]
    w = torch.rand(6, 4, generator=gen, dtype=F64)  # [B, M]
    q = simplex(gen, 5)  # [K]
    for variant in ["I", "II"]:
        out = net_payout(p, w, q, variant)
        assert out.shape == (3, 6, 4)
        for a in range(3):
            for b in range(6):
                torch.testing.assert_close(out[a, b], net_payout(p[a, b], w[b], q, variant))
    assert pool(p, w, "log").shape == (3, 6, 5)
    assert pool(p, w, option_mask=torch.ones(3, 1, 5, dtype=torch.bool)).shape == (3, 6, 5)
    assert wswm_payout(p, w, q).shape == (3, 6, 4)
    assert brier_score(p, q).shape == (3, 6, 4)


# ----------------------------------------------------------------------------------------- bad input

P = torch.tensor([[0.5, 0.5], [0.9, 0.1]], dtype=F64)  # [M=2, K=2]
W = torch.tensor([1.0, 0.5], dtype=F64)
Q = torch.tensor([1.0, 0.0], dtype=F64)


BAD_INPUTS = [
    (lambda: net_payout(P, torch.tensor([1.0, -0.5], dtype=F64), Q), r"wagers: must be >= 0, got -0.5"),
    (lambda: net_payout(P, torch.tensor([1.0, math.nan], dtype=F64), Q), r"wagers: non-finite value nan"),
    (lambda: net_payout(P, torch.tensor([1.0, math.inf], dtype=F64), Q), r"wagers: non-finite value inf"),
    (
        lambda: net_payout(torch.tensor([[0.5, 0.5], [0.9, 0.3]], dtype=F64), W, Q),
        r"probs: not a probability vector .* index 1: sums to 1.2",
    ),
    (
        lambda: net_payout(torch.tensor([[0.5, 0.5], [1.2, -0.2]], dtype=F64), W, Q),
        r"probs: negative probability -0.2 at index \(1, 1\)",
    ),
    (
        lambda: net_payout(torch.tensor([[0.5, 0.5], [math.nan, 0.5]]), W, Q),
        r"probs: non-finite value nan",
    ),
    (lambda: loo_baseline(P, W, torch.tensor([0.7, 0.7], dtype=F64)), r"target: .* sums to 1.4"),
    (lambda: advantage(P, W, torch.tensor([math.nan, 1.0], dtype=F64)), r"target: non-finite value nan"),
    (lambda: net_payout(P, torch.ones(3, dtype=F64), Q), r"wagers: expected shape \[\.\.\., M=2\]"),
    (lambda: net_payout(P, W, torch.tensor([1.0, 0.0, 0.0])), r"target: expected shape \[\.\.\., K=2\]"),
    (lambda: net_payout(P.expand(3, 2, 2), W.expand(4, 2), Q), r"batch dims do not broadcast"),
    (lambda: net_payout(P[0], W, Q), r"probs: expected shape \[\.\.\., M, K\]"),
    (lambda: net_payout(P, W, Q, variant="III"), r"variant: expected one of \['I', 'II'\], got 'III'"),
    (lambda: net_payout(P, W, Q, c3=0.0), r"c3: must be a positive finite number, got 0.0"),
    (lambda: loo_baseline(P, W, Q, c2=-1.0), r"c2: must be a positive finite number, got -1.0"),
    (lambda: brier_score(P, torch.tensor([1.0, 0.0, 0.0])), r"target: last dim must match probs"),
    (lambda: brier_score(torch.tensor([0.6, 0.6]), Q), r"probs: .* sums to 1.2"),
    (lambda: pool(P, W, kind="geometric"), r"kind: expected one of \['linear', 'log'\], got 'geometric'"),
    (lambda: pool(P, torch.tensor([-1.0, 1.0], dtype=F64)), r"weights: must be >= 0, got -1"),
    (lambda: pool(P, W, option_mask=torch.tensor([1, 1])), r"option_mask: expected a bool tensor"),
    (lambda: pool(P, W, option_mask=torch.tensor([True, True, True])), r"option_mask: expected shape"),
    (lambda: pool(P, W, option_mask=torch.tensor([False, False])), r"option_mask: no option enabled"),
    (lambda: wswm_payout(P, W, Q, score="log"), r"score: expected one of"),
    (lambda: best_response_wager(torch.tensor([0.1]), c3=-2.0), r"c3: must be a positive finite number"),
    (lambda: best_response_wager(torch.tensor([0.1]), w_max=-1.0), r"w_max: must be >= w_min"),
    (lambda: deficit_bound(0.5, 0.0), r"c3: must be a positive finite number"),
]


@pytest.mark.parametrize(
    "call, pattern", BAD_INPUTS, ids=[re.sub(r"\W+", "-", pat)[:48].strip("-") for _, pat in BAD_INPUTS]
)
def test_bad_input_raises_value_error_naming_argument(call, pattern):
    with pytest.raises(ValueError, match=pattern):
        call()


def test_validate_false_skips_value_checks_but_not_shape_checks():
    bad_w = torch.tensor([1.0, -0.5], dtype=F64)
    out = net_payout(P, bad_w, Q, validate=False)  # hot loop: no value check, no device sync
    torch.testing.assert_close(out, bad_w * (advantage(P, bad_w, Q, validate=False) - 0.5 * bad_w))
    with pytest.raises(ValueError, match="wagers: expected shape"):
        net_payout(P, torch.ones(3), Q, validate=False)
    # float32 softmax round-off is within tolerance
    p32 = torch.softmax(torch.randn(100, 3, 7), -1)
    assert torch.isfinite(net_payout(p32, torch.rand(100, 3), torch.full((7,), 1 / 7))).all()


def test_brier_regret_and_kl_gold_hand_values():
    p = torch.tensor([[[0.9, 0.1], [0.4, 0.6]]], dtype=F64)  # [1, M=2, K=2]
    y = torch.tensor([[1.0, 0.0]], dtype=F64)
    agg = torch.tensor([[0.5, 0.5]], dtype=F64)
    # Brier(agg) = 0.5; agents: 0.02 and 0.72 -> regret 0.48
    torch.testing.assert_close(mech.brier_regret(agg, p, y), torch.tensor([0.48], dtype=F64))
    q = torch.tensor([[0.25, 0.75]], dtype=F64)
    kl = 0.25 * (math.log(0.25 + 1e-10) - math.log(0.5)) + 0.75 * (math.log(0.75 + 1e-10) - math.log(0.5))
    torch.testing.assert_close(mech.kl_gold(q, agg), torch.tensor([kl], dtype=F64))
    assert float(mech.kl_gold(y, torch.tensor([[0.0, 1.0]], dtype=F64))) == pytest.approx(
        math.log(1e10), rel=1e-6
    )
