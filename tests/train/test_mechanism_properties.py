"""The paper's incentive properties, checked numerically on walla.train.mechanism (float64).

DSIC (Thm "DSIC of Prediction"), advantage-wager alignment, bounded deficit (both inequalities of the
deficit proposition), arbitrage in WALLA I / none in WALLA II, normality of I and the appendix
counterexample for II, WSWM budget balance and the appendix warm-up (WSWM with the scaled linear score
pays -w_i dL/dw_i). Every payout is linear in the target, so passing an agent's belief as the target
gives her expected payout; test_expected_payout_is_linear_in_target checks that against enumeration.
Run: .venv/bin/pytest tests/train/test_mechanism_properties.py
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from references import deficit_bound_w
from walla.train.mechanism import (
    advantage,
    best_response_wager,
    deficit_bound,
    net_payout,
    wswm_payout,
)

F64 = torch.float64


VARIANTS = ["I", "II"]


def simplex(gen: torch.Generator, *shape: int) -> torch.Tensor:
    e = -torch.rand(*shape, generator=gen, dtype=F64).clamp_min(1e-300).log()
    return e / e.sum(-1, keepdim=True)


def spiky_simplex(gen: torch.Generator, *shape: int) -> torch.Tensor:
    """Mix of uniform, near-one-hot and exactly one-hot rows (adversarial corners of the simplex)."""
    p = simplex(gen, *shape)
    sharp = torch.softmax(torch.randn(*shape, generator=gen, dtype=F64) * 30, -1)
    hard = torch.nn.functional.one_hot(torch.randint(0, shape[-1], shape[:-1], generator=gen), shape[-1]).to(
        F64
    )
    pick = torch.randint(0, 3, (*shape[:-1], 1), generator=gen)
    return torch.where(pick == 0, p, torch.where(pick == 1, sharp, hard))


def wagers_like(gen: torch.Generator, *shape: int) -> torch.Tensor:
    """Wagers spanning 1e-12 .. 1e3 with exact zeros: the deficit bound must not depend on the scale."""
    w = torch.exp(torch.empty(*shape, dtype=F64).uniform_(-27.6, 6.9, generator=gen))
    zero = torch.rand(*shape, generator=gen) < 0.15
    return w.masked_fill(zero, 0.0)


def with_report(p: torch.Tensor, reports: torch.Tensor, i: int = 0) -> torch.Tensor:
    """Replace agent i's prediction: p[..., M, K], reports[..., R, K] -> [..., R, M, K]."""
    out = p.unsqueeze(-3).repeat_interleave(reports.shape[-2], dim=-3).clone()
    out[..., i, :] = reports
    return out


def test_expected_payout_is_linear_in_target():
    """E_{Y~q}[pi(delta_Y)] equals the payout computed with target q (both variants and WSWM)."""
    gen = torch.Generator().manual_seed(10)
    p, w, q = simplex(gen, 100, 4, 3), wagers_like(gen, 100, 4), simplex(gen, 100, 3)
    eye = torch.eye(3, dtype=F64)
    for fn in [
        lambda t: net_payout(p, w, t, "I"),
        lambda t: net_payout(p, w, t, "II"),
        lambda t: wswm_payout(p, w, t),
        lambda t: wswm_payout(p, w, t, score="scaled_linear"),
    ]:
        enum = sum(q[:, y, None] * fn(eye[y].expand(100, 3)) for y in range(3))
        torch.testing.assert_close(fn(q), enum, rtol=1e-10, atol=1e-10)


# ----------------------------------------------------------------------------------------- DSIC


def test_dsic_truthful_report_maximizes_expected_payout():
    """For any belief q, others' reports and wagers (w_i > 0): E_q[pi_i(q)] > E_q[pi_i(p)] for p != q,
    and the loss from misreporting is exactly w_i c2 ||p - q||^2 (the baseline ignores p_i)."""
    gen = torch.Generator().manual_seed(11)
    n, m, k, r = 200, 4, 4, 64
    p, belief = spiky_simplex(gen, n, m, k), simplex(gen, n, k)
    w = wagers_like(gen, n, m)
    w[:, 0] = torch.rand(n, generator=gen, dtype=F64) * 2 + 1e-3
    reports = torch.cat([belief.unsqueeze(1), spiky_simplex(gen, n, r, k)], 1)  # [n, 1 + r, K]
    for variant in VARIANTS:
        for c2, c3 in [(0.5, 0.5), (2.0, 0.1)]:
            pay = net_payout(
                with_report(p, reports), w.unsqueeze(1), belief.unsqueeze(1), variant, 1.0, c2, c3
            )
            pay = pay[..., 0]  # [n, 1 + r] agent 0's expected payout per report
            truthful, other = pay[:, :1], pay[:, 1:]
            assert (truthful > other).all()
            gap = w[:, :1] * c2 * ((reports[:, 1:] - belief.unsqueeze(1)) ** 2).sum(-1)
            torch.testing.assert_close(truthful - other, gap, rtol=1e-9, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(
    belief=st.lists(st.floats(0.0, 1.0), min_size=3, max_size=3).filter(lambda v: sum(v) > 1e-3),
    others=st.lists(st.floats(0.0, 1.0), min_size=6, max_size=6).filter(
        lambda v: min(sum(v[:3]), sum(v[3:])) > 1e-3
    ),
    wagers=st.lists(st.floats(0.0, 10.0), min_size=3, max_size=3).filter(lambda v: v[0] > 1e-6),
    variant=st.sampled_from(VARIANTS),
)
def test_dsic_grid_search_over_reports(belief, others, wagers, variant):
    """Grid over the 3-simplex (step 1/20): no report beats the belief, the best grid point is the nearest."""
    q = torch.tensor(belief, dtype=F64) / sum(belief)
    o = torch.tensor(others, dtype=F64).view(2, 3)
    o = o / o.sum(-1, keepdim=True)
    ticks = [(a, b, 20 - a - b) for a in range(21) for b in range(21 - a)]
    grid = torch.tensor(ticks, dtype=F64) / 20  # [231, 3]
    p = torch.cat([q.unsqueeze(0), o])  # [M=3, K=3]
    pay = net_payout(with_report(p, grid), torch.tensor(wagers, dtype=F64), q, variant)[:, 0]  # [231]
    truthful = net_payout(p, torch.tensor(wagers, dtype=F64), q, variant)[0]
    assert (pay <= truthful + 1e-12).all()
    nearest = ((grid - q) ** 2).sum(-1)
    assert nearest[pay.argmax()] <= nearest.min() + 1e-12


# ----------------------------------------------------------------------------------------- wagers


def test_best_wager_on_grid_equals_clipped_half_advantage_over_c3():
    """Advantage-wager alignment: argmax_w E[pi] over a fine grid = (A/2c3)^+ (and clipped to w_max)."""
    gen = torch.Generator().manual_seed(12)
    n, m, k = 100, 3, 4
    p, belief, w = spiky_simplex(gen, n, m, k), simplex(gen, n, k), wagers_like(gen, n, m)
    grid = torch.linspace(0, 2, 2001, dtype=F64)  # step 1e-3; (A/2c3)^+ <= (2 c2)/(2 c3) = 5/3 here
    for variant in VARIANTS:
        for c3 in [0.5, 0.3]:
            a = advantage(p, w, belief, variant)[:, 0]  # [n] expected advantage of agent 0 under its belief
            w_grid = w.unsqueeze(1).repeat(1, grid.numel(), 1)
            w_grid[..., 0] = grid
            pay = net_payout(p.unsqueeze(1), w_grid, belief.unsqueeze(1), variant, c3=c3)[..., 0]  # [n, G]
            best = grid[pay.argmax(-1)]
            assert (best - best_response_wager(a, c3)).abs().max() <= 1e-3 + 1e-12
            assert (a <= 0).any() and (a > 0).any()  # both regimes exercised
            # E[pi] at the best response equals (A^+)^2 / 4c3 (interim IR)
            w_star = w.clone()
            w_star[:, 0] = best_response_wager(a, c3)
            got = net_payout(p, w_star, belief, variant, c3=c3)[:, 0]
            torch.testing.assert_close(got, a.clamp_min(0) ** 2 / (4 * c3), rtol=1e-9, atol=1e-12)
            capped = grid[pay.masked_fill(grid > 0.2, -torch.inf).argmax(-1)]
            assert (capped - best_response_wager(a, c3, w_max=0.2)).abs().max() <= 1e-3 + 1e-12


# ----------------------------------------------------------------------------------------- deficit


def test_deficit_bound_random_profiles():
    """sum_i pi_i <= ((2c2)/W - c3) sum w^2 <= c2^2/c3 over 12,000 random/corner profiles, any M and scale."""
    gen = torch.Generator().manual_seed(13)
    for m in [1, 2, 3, 5, 12]:
        n, k = 1200, 4
        p = spiky_simplex(gen, n, m, k)
        y = torch.nn.functional.one_hot(torch.randint(0, k, (n,), generator=gen), k).to(F64)
        w = wagers_like(gen, n, m)
        for variant in VARIANTS:
            for c1, c2, c3 in [(1.0, 0.5, 0.5), (0.0, 2.0, 0.05), (5.0, 0.1, 3.0)]:
                total = net_payout(p, w, y, variant, c1, c2, c3).sum(-1)
                bound_w = deficit_bound_w(w, c2, c3)
                assert (total <= bound_w + 1e-9 * (1 + bound_w.abs())).all()
                assert (bound_w <= deficit_bound(c2, c3) + 1e-12).all()


def test_deficit_bound_is_attained_by_the_extremal_profile():
    """One right agent at w = c2/c3 against wrong agents with vanishing wagers: total -> c2^2/c3."""
    for c2, c3 in [(0.5, 0.5), (1.0, 0.25)]:
        p = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]], dtype=F64)
        y = torch.tensor([1.0, 0.0], dtype=F64)
        w = torch.tensor([c2 / c3, 1e-9, 1e-9], dtype=F64)
        for variant in VARIANTS:
            total = net_payout(p, w, y, variant, 1.0, c2, c3).sum()
            assert deficit_bound(c2, c3) - 1e-7 < total <= deficit_bound(c2, c3)
            torch.testing.assert_close(total, deficit_bound_w(w, c2, c3).sum(), rtol=0, atol=1e-7)


def test_deficit_bound_survives_adversarial_gradient_search():
    """Gradient ascent on total payout over reports and wagers stays under c2^2/c3 (and gets close to it)."""
    torch.manual_seed(14)
    c2, c3 = 0.5, 0.5
    n, m, k = 128, 3, 3
    y = torch.nn.functional.one_hot(torch.zeros(n, dtype=torch.long), k).to(F64)
    for variant in VARIANTS:
        logits = (torch.randn(n, m, k, dtype=F64) * 2).requires_grad_()
        raw_w = torch.randn(n, m, dtype=F64).requires_grad_()
        opt = torch.optim.Adam([logits, raw_w], lr=0.1)
        for _ in range(100):
            w = torch.nn.functional.softplus(raw_w) * 2
            total = net_payout(torch.softmax(logits, -1), w, y, variant, 1.0, c2, c3, validate=False).sum(-1)
            opt.zero_grad()
            (-total.sum()).backward()
            opt.step()
        with torch.no_grad():
            w = torch.nn.functional.softplus(raw_w) * 2
            total = net_payout(torch.softmax(logits, -1), w, y, variant, 1.0, c2, c3).sum(-1)
            assert (total <= deficit_bound_w(w, c2, c3) + 1e-12).all()
            assert total.max() <= deficit_bound(c2, c3)
            assert total.max() > 0.9 * deficit_bound(c2, c3)  # the search is strong enough to matter


# ----------------------------------------------------------------------------------------- arbitrage


def test_variant_I_admits_arbitrage_when_others_disagree():
    """Proof of the arbitrage proposition: report the others' wager-weighted pool q_-i; then
    s(q_-i, y) - b_-i^I = c2 sum_j (w_j/W_-i) ||p_j - q_-i||^2 =: delta > 0 for every y, and any
    0 < w_i < delta / c3 earns pi_i > 0 whatever the outcome."""
    gen = torch.Generator().manual_seed(15)
    n, m, k = 500, 4, 3
    p, w = spiky_simplex(gen, n, m, k), torch.rand(n, m, generator=gen, dtype=F64) + 0.05
    w_o = w[:, 1:]
    q_minus = (w_o.unsqueeze(-1) * p[:, 1:]).sum(1) / w_o.sum(-1, keepdim=True)  # [n, K]
    delta = 0.5 * ((w_o / w_o.sum(-1, keepdim=True)) * ((p[:, 1:] - q_minus.unsqueeze(1)) ** 2).sum(-1)).sum(
        -1
    )
    disagree = delta > 1e-6
    assert disagree.sum() > 400
    p[:, 0] = q_minus
    w[:, 0] = 0.5 * delta / 0.5  # half of the admissible range (0, delta / c3)
    eye = torch.eye(k, dtype=F64)
    worst = (
        torch.stack([net_payout(p, w, eye[y].expand(n, k), "I")[:, 0] for y in range(k)], -1).min(-1).values
    )
    assert (worst[disagree] > 0).all()
    for y in range(k):  # the advantage is the same delta for every outcome
        torch.testing.assert_close(advantage(p, w, eye[y].expand(n, k), "I")[:, 0], delta)
    # in WALLA II the same report just ties the baseline and pays -c3 w_i^2 < 0 whatever the outcome
    for y in range(k):
        torch.testing.assert_close(net_payout(p, w, eye[y].expand(n, k), "II")[:, 0], -0.5 * w[:, 0] ** 2)


def test_variant_II_admits_no_arbitrage_random_and_gradient_search():
    """For every profile some outcome gives pi_i <= 0 in WALLA II: random reports/wagers, then gradient
    ascent on min_y pi_i (which does find arbitrage in WALLA I, so the search has teeth)."""
    gen = torch.Generator().manual_seed(16)
    n, m, k = 4000, 3, 4
    p, w = spiky_simplex(gen, n, m, k), wagers_like(gen, n, m)
    eye = torch.eye(k, dtype=F64)
    pay = net_payout(p.unsqueeze(1), w.unsqueeze(1), eye, "II")[..., 0]  # every outcome at once: [n, K]
    assert (pay.min(-1).values <= 1e-15).all()
    assert (w[:, 1:].sum(-1) == 0).sum() > 50  # includes the no-opposing-stake edge case

    torch.manual_seed(17)
    n = 128
    others = simplex(gen, n, 1, m - 1, k)
    w_others = torch.rand(n, 1, m - 1, generator=gen, dtype=F64) + 0.1
    found = {}
    for variant in VARIANTS:
        logits = torch.randn(n, 1, 1, k, dtype=F64).requires_grad_()
        raw_w = torch.full((n, 1, 1), -3.0, dtype=F64).requires_grad_()
        opt = torch.optim.Adam([logits, raw_w], lr=0.1)
        for step in range(101):
            p = torch.cat([torch.softmax(logits, -1), others], -2)  # [n, 1, M, K]
            w = torch.cat([torch.nn.functional.softplus(raw_w), w_others], -1)  # [n, 1, M]
            worst = (
                net_payout(p, w, eye, variant, validate=False)[..., 0].min(-1).values
            )  # outcomes [n, K] -> [n]
            if step == 100:
                break
            opt.zero_grad()
            (-worst.sum()).backward()
            opt.step()
        found[variant] = worst.detach()
    assert (found["II"] <= 1e-15).all()
    assert (found["I"] > 0).float().mean() > 0.8


# ----------------------------------------------------------------------------------------- normality


def test_variant_I_satisfies_normality():
    """Moving agent j's report to agent i's belief never raises i's expected payout; with w_i, w_j > 0 and
    p_j != belief it lowers it by exactly w_i w_j c2 ||p_j - belief||^2 / W_-i."""
    gen = torch.Generator().manual_seed(18)
    n, m, k = 2000, 4, 3
    p, belief, w = spiky_simplex(gen, n, m, k), simplex(gen, n, k), wagers_like(gen, n, m)
    before = net_payout(p, w, belief, "I")[:, 0]
    moved = p.clone()
    moved[:, 1] = belief
    after = net_payout(moved, w, belief, "I")[:, 0]
    drop = before - after
    scale = 1e-12 * (1 + before.abs() + after.abs())  # payouts reach c3 w^2 ~ 1e5: absolute round-off
    assert (drop >= -scale).all()
    w_minus = w[:, 1:].sum(-1)
    has = w_minus > 0
    want = (
        w[:, 0]
        * w[:, 1]
        * 0.5
        * ((p[:, 1] - belief) ** 2).sum(-1)
        / w_minus.where(has, torch.ones_like(w_minus))
    )
    assert ((drop - want.where(has, torch.zeros_like(want))).abs() <= scale + 1e-9 * want.abs()).all()
    strict = (w[:, 0] > 0) & (w[:, 1] > 0) & (want > 10 * scale)
    assert strict.sum() > 800 and (drop[strict] > 0).all()


def test_variant_II_normality_counterexample_of_the_appendix():
    """Y = {1,2,3}, p1 = (1/2,1/2,0) (agent 1's belief), p2 = (1,0,0), p3 = (0,1,0), w2 = 1, w3 = 2:
    ||q_-1 - p1||^2 goes 1/18 -> 2/9 when p2 moves to p1, and agent 1's expected payout rises by
    w1 c2 (2/9 - 1/18)."""
    belief = torch.tensor([0.5, 0.5, 0.0], dtype=F64)
    p = torch.stack([belief, torch.tensor([1.0, 0, 0], dtype=F64), torch.tensor([0.0, 1, 0], dtype=F64)])
    w1, c2 = 0.7, 0.5
    w = torch.tensor([w1, 1.0, 2.0], dtype=F64)
    moved = p.clone()
    moved[1] = belief
    q_before = (w[1:, None] * p[1:]).sum(0) / 3
    q_after = (w[1:, None] * moved[1:]).sum(0) / 3
    torch.testing.assert_close(((q_before - belief) ** 2).sum(), torch.tensor(1 / 18, dtype=F64))
    torch.testing.assert_close(((q_after - belief) ** 2).sum(), torch.tensor(2 / 9, dtype=F64))
    gain = net_payout(moved, w, belief, "II", c2=c2)[0] - net_payout(p, w, belief, "II", c2=c2)[0]
    torch.testing.assert_close(gain, torch.tensor(w1 * c2 * (2 / 9 - 1 / 18), dtype=F64))
    assert gain > 0
    # WALLA I on the same profile behaves normally
    assert net_payout(moved, w, belief, "I")[0] < net_payout(p, w, belief, "I")[0]


# ----------------------------------------------------------------------------------------- WSWM


def test_wswm_is_budget_balanced_and_matches_definition():
    gen = torch.Generator().manual_seed(19)
    n, m, k = 1000, 5, 4
    p, w = spiky_simplex(gen, n, m, k), wagers_like(gen, n, m)
    y = torch.nn.functional.one_hot(torch.randint(0, k, (n,), generator=gen), k).to(F64)
    pay = wswm_payout(p, w, y, c1=2.0, c2=0.7)
    s = 2.0 - 0.7 * ((p - y.unsqueeze(1)) ** 2).sum(-1)
    total = w.sum(-1, keepdim=True)
    want = w * (s - (w * s).sum(-1, keepdim=True) / total.where(total > 0, torch.ones_like(total)))
    scale = (w * s.abs()).sum(-1)
    assert ((pay - want).abs() <= 1e-12 * (1 + scale.unsqueeze(-1))).all()
    assert (pay.sum(-1).abs() <= 1e-12 * (1 + scale)).all()  # exact budget balance
    assert wswm_payout(p[:1], torch.zeros(1, m, dtype=F64), y[:1]).eq(0).all()


def test_wswm_scaled_linear_score_pays_negative_scaled_gradient_of_cross_entropy():
    """Appendix warm-up theorem: with s_i = p_i[y] / sum_j w_j p_j[y], pi_i^WSWM = -w_i dL/dw_i where
    L = -log p_agg[y] and p_agg = sum_i w_i p_i / sum_i w_i (checked with autograd)."""
    gen = torch.Generator().manual_seed(20)
    n, m, k = 64, 4, 5
    p = simplex(gen, n, m, k)
    w = (torch.rand(n, m, generator=gen, dtype=F64) * 3 + 0.01).requires_grad_()
    yi = torch.randint(0, k, (n,), generator=gen)
    y = torch.nn.functional.one_hot(yi, k).to(F64)
    p_agg = (w.unsqueeze(-1) * p).sum(1) / w.sum(-1, keepdim=True)  # [n, K]
    loss = -p_agg.gather(1, yi[:, None]).log().sum()
    (grad,) = torch.autograd.grad(loss, w)
    pay = wswm_payout(p, w.detach(), y, score="scaled_linear")
    torch.testing.assert_close(pay, -w.detach() * grad, rtol=1e-10, atol=1e-12)
    # sum_k w_k s_k = 1, so pi_i = w_i (s_i - 1/W); still budget balanced
    torch.testing.assert_close(pay.sum(-1), torch.zeros(n, dtype=F64), rtol=0, atol=1e-12)
