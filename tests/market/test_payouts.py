"""Live payouts and pooled forecasts over HTTP equal walla.train.mechanism's on random rounds."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from walla.train import mechanism


def _instance(rng: np.random.Generator, m: int, k: int):
    probs = rng.dirichlet(np.ones(k) * 0.7, size=m)  # [M, K]
    wagers = rng.uniform(0, 1, size=m)
    wagers[rng.random(m) < 0.15] = 0.0  # some agents stake nothing
    return probs, wagers


SETTINGS = [
    {"variant": "I", "pooling": "linear"},
    {"variant": "II", "pooling": "log", "c1": 0.3, "c2": 0.8, "c3": 0.25},
    {"variant": "I", "pooling": "log", "c2": 0.2, "c3": 1.5},
    {"variant": "II", "pooling": "linear"},
]


def test_payouts_equal_mechanism(market):
    """Random rounds (2-6 agents, 2-5 options, hard and gold answers, some zero wagers): every payout equals
    mechanism.net_payout and the pool equals mechanism.pool on the same float64 reports, to 1e-12."""
    rng = np.random.default_rng(7)
    agents = [market.agent(f"a{i}") for i in range(6)]
    worst_pay = worst_pool = 0.0
    for t in range(12):
        s = SETTINGS[t % len(SETTINGS)]
        full = {"c1": 1.0, "c2": 0.5, "c3": 0.5, **s}
        m, k = int(rng.integers(2, 7)), int(rng.integers(2, 6))
        probs, wagers = _instance(rng, m, k)
        rid = market.op.open_round(f"q{t}", [f"o{j}" for j in range(k)], **s)["id"]
        for a, p, w in zip(agents[:m], probs, wagers, strict=False):
            a.submit(rid, p.tolist(), float(w))
        pool = market.op.pool(rid)
        p_t, w_t = torch.tensor(probs), torch.tensor(wagers)
        want_pool = mechanism.pool(p_t, w_t, full["pooling"]).numpy()
        worst_pool = max(worst_pool, float(np.abs(np.array(pool["probabilities"]) - want_pool).max()))
        assert pool["choice"] == int(np.argmax(want_pool))
        if t % 2:
            target = rng.dirichlet(np.ones(k))
            res = market.op.resolve(rid, target=target.tolist())
        else:
            label = int(rng.integers(k))
            target = np.eye(k)[label]
            res = market.op.resolve(rid, label=label)
        want = mechanism.net_payout(
            p_t, w_t, torch.tensor(target), full["variant"], full["c1"], full["c2"], full["c3"]
        )
        got = np.array([res["payouts"][f"a{i}"] for i in range(m)])
        worst_pay = max(worst_pay, float(np.abs(got - want.numpy()).max()))
        assert res["total_payout"] == pytest.approx(float(want.sum()), abs=1e-12)
        assert res["total_payout"] <= mechanism.deficit_bound(full["c2"], full["c3"]) + 1e-12
        assert res["deficit_bound"] == pytest.approx(full["c2"] ** 2 / full["c3"])
    assert worst_pay < 1e-12 and worst_pool < 1e-12, (worst_pay, worst_pool)


def test_balances_and_own_payouts(market):
    """Balances are the sums of each agent's own payouts; an agent lists only its own."""
    alice, bob = market.agent("alice"), market.agent("bob")
    paid = {"alice": 0.0, "bob": 0.0}
    for label in (0, 1, 1):
        rid = market.op.open_round("q", ["x", "y"])["id"]
        alice.submit(rid, [0.9, 0.1], 0.4)
        bob.submit(rid, [0.2, 0.8], 0.6)
        for name, value in market.op.resolve(rid, label=label)["payouts"].items():
            paid[name] += value
    assert alice.me()["balance"] == pytest.approx(paid["alice"], abs=1e-12)
    assert bob.me()["balance"] == pytest.approx(paid["bob"], abs=1e-12)
    mine = alice.my_payouts()
    assert len(mine) == 3 and sum(p["payout"] for p in mine) == pytest.approx(paid["alice"], abs=1e-12)
    # advantage and payout are consistent: pi = w (A - c3 w)
    for p in mine:
        assert p["payout"] == pytest.approx(p["wager"] * (p["advantage"] - 0.5 * p["wager"]), abs=1e-12)
    overview = {a["name"]: a["balance"] for a in market.op.agents()}
    assert overview == pytest.approx(paid, abs=1e-12)
    assert paid["alice"] != paid["bob"]


def test_replace_report_until_close(market):
    """A replaced report is the one paid; after close a replacement is refused (409) and nothing changes."""
    alice, bob = market.agent("alice"), market.agent("bob")
    rid = market.op.open_round("q", ["x", "y", "z"])["id"]
    alice.submit(rid, [0.2, 0.3, 0.5], 0.1)
    assert alice.submit(rid, [0.7, 0.2, 0.1], 0.9)["version"] == 2
    bob.submit(rid, [1 / 3, 1 / 3, 1 / 3], 0.5)
    market.op.close_round(rid)
    with pytest.raises(Exception) as e:
        alice.submit(rid, [0.1, 0.1, 0.8], 0.2)
    assert getattr(e.value, "status", None) == 409
    assert alice.my_report(rid)["probabilities"] == [0.7, 0.2, 0.1]
    res = market.op.resolve(rid, label=0)
    want = mechanism.net_payout(
        torch.tensor([[0.7, 0.2, 0.1], [1 / 3, 1 / 3, 1 / 3]], dtype=torch.float64),
        torch.tensor([0.9, 0.5], dtype=torch.float64),
        torch.tensor([1.0, 0.0, 0.0]),
    )
    assert [res["payouts"]["alice"], res["payouts"]["bob"]] == pytest.approx(want.tolist(), abs=1e-12)
    assert market.ledger.counts()["reports"] == 2


def test_resolution_idempotent(market):
    """Resolving again with the same answer pays nothing twice; another answer is a 409."""
    alice, bob = market.agent("alice"), market.agent("bob")
    rid = market.op.open_round("q", ["x", "y"])["id"]
    alice.submit(rid, [0.6, 0.4], 0.3)
    bob.submit(rid, [0.1, 0.9], 0.7)
    first = market.op.resolve(rid, label=1)
    again = market.op.resolve(rid, target=[0.0, 1.0])  # the same answer, written as a distribution
    assert first["resolved_now"] and not again["resolved_now"]
    assert again["payouts"] == first["payouts"]
    with pytest.raises(Exception) as e:
        market.op.resolve(rid, label=0)
    assert e.value.status == 409 and "another answer" in e.value.message
    assert market.ledger.counts()["payouts"] == 2
    assert alice.me()["balance"] == pytest.approx(first["payouts"]["alice"], abs=1e-15)


def test_zero_wagers_and_empty_round(market):
    """All-zero wagers pool with equal weights (mechanism.pool_weights); a round without reports resolves
    with zero outlay and its pool is uniform."""
    alice, bob = market.agent("alice"), market.agent("bob")
    rid = market.op.open_round("q", ["x", "y"])["id"]
    alice.submit(rid, [1.0, 0.0], 0.0)
    bob.submit(rid, [0.0, 1.0], 0.0)
    pool = market.op.pool(rid)
    assert pool["probabilities"] == [0.5, 0.5] and pool["weights"] == [0.5, 0.5]
    assert pool["choice"] == 0  # tie -> lowest option index
    res = market.op.resolve(rid, label=0)
    assert res["payouts"] == {"alice": 0.0, "bob": 0.0}
    empty = market.op.open_round("q2", ["x", "y", "z"])["id"]
    assert market.op.pool(empty)["probabilities"] == pytest.approx([1 / 3] * 3)
    assert market.op.resolve(empty, label=2)["total_payout"] == 0.0
