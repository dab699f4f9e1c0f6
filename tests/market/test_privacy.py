"""Reports stay private until a round closes (issue 29, finding 1): an agent learns nothing about another's open
report from any endpoint, the pooled forecast of an open round is the operator's, and agents never see the
per-report weights. Before, GET /rounds/{id}/pool gave any token the pool and one weight per report, from
which an agent solved for another's open report exactly."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from walla.market.client import MarketClient, MarketError


def reconstruct(me: MarketClient, rid: int, mine: list[float], my_wager: float) -> tuple | None:
    """The attack: with the linear pool, the per-report weights and its own report, an agent solves for the
    other agent's (distribution, wager). None when the market refuses to give what it needs."""
    try:
        pool = me.pool(rid)
    except MarketError as e:
        assert e.status == 403 and e.message.startswith("round: the pooled forecast"), e
        return None
    weights = pool.get("weights")
    if not weights or len(weights) != 2:
        return None
    mine_at = 1  # reports are pooled in agent-id order: the other agent registered first
    total = my_wager / weights[mine_at]
    other_w = total - my_wager
    other_p = (np.array(pool["probabilities"]) * total - my_wager * np.array(mine)) / other_w
    return other_p.tolist(), other_w


def test_pool_cannot_reconstruct_an_open_report(market):
    alice, bob = market.agent("alice"), market.agent("bob")
    rid = market.op.open_round("q", ["x", "y", "z"], pooling="linear")["id"]
    secret, secret_w = [0.62, 0.28, 0.10], 0.37
    alice.submit(rid, secret, secret_w)
    bob.submit(rid, [0.2, 0.3, 0.5], 0.6)
    got = reconstruct(bob, rid, [0.2, 0.3, 0.5], 0.6)
    # before the fix: got == ([0.62, 0.28, 0.10], 0.37) to 1e-12
    assert got is None, f"bob reconstructed alice's open report: {got}"
    market.op.close_round(rid)
    assert reconstruct(bob, rid, [0.2, 0.3, 0.5], 0.6) is None  # closed, not resolved: still private
    # the operator sees the pool and the weights at any time
    assert market.op.pool(rid)["weights"] == pytest.approx([0.37 / 0.97, 0.6 / 0.97])
    market.op.resolve(rid, label=0)
    pool = bob.pool(rid)  # published after resolution (the default), still without weights
    assert "weights" not in pool and pool["n_reports"] == 2


def _bob_view(url: str, token: str, rid: int) -> list:
    """Everything bob's token can read (status code and body of every agent-readable endpoint)."""
    paths = [
        "/rounds",
        "/rounds?status=open",
        f"/rounds/{rid}",
        f"/rounds/{rid}/pool",
        f"/rounds/{rid}/report",
        f"/rounds/{rid}/reports",
        f"/rounds/{rid}/history",
        "/me",
        "/me/payouts",
        "/agents",
        "/market",
    ]
    out = []
    for p in paths:
        r = httpx.get(url + p, headers={"Authorization": f"Bearer {token}"})
        out.append((p, r.status_code, r.json()))
    return out


def test_open_report_invisible_to_other_agents(market):
    """Bob's view of the market is identical before alice reports, after, and after she replaces her report."""
    alice, bob_token = market.agent("alice"), market.op.add_agent("bob")
    rid = market.op.open_round("q", ["x", "y"])["id"]
    views = [_bob_view(market.url, bob_token, rid)]
    alice.submit(rid, [0.9, 0.1], 0.8)
    views.append(_bob_view(market.url, bob_token, rid))
    alice.submit(rid, [0.1, 0.9], 0.05)
    views.append(_bob_view(market.url, bob_token, rid))
    market.op.close_round(rid)
    views.append(_bob_view(market.url, bob_token, rid))
    first = [(p, s, b) for p, s, b in views[0]]
    for v in views[1:3]:
        assert v == first
    closed = {p: (s, b) for p, s, b in views[3]}
    assert closed[f"/rounds/{rid}"][1]["n_reports"] is None
    assert closed[f"/rounds/{rid}/pool"][0] == 403


@pytest.mark.parametrize("publish", ["close", "never"])
def test_publish_pool_setting(market, publish):
    alice, bob = market.agent("alice"), market.agent("bob")
    rid = market.op.open_round("q", ["x", "y"], publish_pool=publish)["id"]
    assert market.op.round(rid)["publish_pool"] == publish
    alice.submit(rid, [0.7, 0.3], 0.5)
    with pytest.raises(MarketError) as e:
        bob.pool(rid)
    assert e.value.status == 403
    market.op.close_round(rid)
    if publish == "close":
        assert bob.pool(rid)["probabilities"] == pytest.approx([0.7, 0.3])
    else:
        market.op.resolve(rid, label=0)
        with pytest.raises(MarketError) as e:
            bob.pool(rid)
        assert e.value.status == 403 and "not published" in e.value.message
