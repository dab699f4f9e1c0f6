"""Tokens decide who may do what: agents act only as themselves, see only their own open reports, and
only the operator opens, closes and resolves rounds."""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy import select
from walla.market import db
from walla.market.client import MarketError


def _status(fn) -> int:
    with pytest.raises(MarketError) as e:
        fn()
    return e.value.status


def test_agent_cannot_submit_for_another(market):
    alice, bob = market.agent("alice"), market.agent("bob")
    rid = market.op.open_round("q", ["x", "y"])["id"]
    bob.submit(rid, [0.3, 0.7], 0.2)
    # the body has no agent field: the token alone says whose report it is
    r = httpx.put(f"{market.url}/rounds/{rid}/report", json={"probabilities": [1.0, 0.0], "wager": 1.0, "agent": "bob"},
                  headers={"Authorization": f"Bearer {alice.http.headers['authorization'].split()[1]}"})  # fmt: skip
    assert r.status_code == 400 and r.json()["error"].startswith("agent: unknown field")
    alice.submit(rid, [0.9, 0.1], 0.5)
    assert bob.my_report(rid)["probabilities"] == [0.3, 0.7] and bob.my_report(rid)["wager"] == 0.2
    assert alice.my_report(rid)["agent"] == "alice"
    assert {r["agent"] for r in market.op.reports(rid)} == {"alice", "bob"}


def test_agent_cannot_read_another_open_report(market):
    alice, bob = market.agent("alice"), market.agent("bob")
    rid = market.op.open_round("q", ["x", "y"])["id"]
    alice.submit(rid, [0.9, 0.1], 0.5)
    assert _status(lambda: bob.reports(rid)) == 403
    assert _status(lambda: bob.my_report(rid)) == 404  # bob's own: none; alice's is not reachable
    market.op.close_round(rid)
    assert _status(lambda: bob.reports(rid)) == 403  # closed is not resolved
    market.op.resolve(rid, label=0)
    assert [r["agent"] for r in bob.reports(rid)] == ["alice"]


def test_operator_token_needed(market):
    alice = market.agent("alice")
    rid = market.op.open_round("q", ["x", "y"])["id"]
    assert _status(lambda: alice.open_round("q", ["x", "y"])) == 403
    assert _status(lambda: alice.close_round(rid)) == 403
    assert _status(lambda: alice.resolve(rid, label=0)) == 403
    assert _status(lambda: alice.add_agent("mallory")) == 403
    assert _status(lambda: alice.agents()) == 403
    assert _status(lambda: alice.market()) == 403
    assert _status(lambda: market.op.submit(rid, [0.5, 0.5], 0.1)) == 403  # the operator does not trade
    anon = httpx.post(f"{market.url}/rounds/{rid}/resolve", json={"label": 0})
    assert anon.status_code == 401 and "missing bearer token" in anon.json()["error"]
    forged = market.client("wm_forged-token-000000000000")
    assert _status(lambda: forged.resolve(rid, label=0)) == 401
    assert market.op.round(rid)["status"] == "open"
    assert market.ledger.counts()["resolutions"] == 0


def test_tokens_are_stored_hashed(market):
    """Only sha256 hashes are in the database: no stored value equals a token."""
    token = market.op.add_agent("carol")
    with market.ledger.engine.connect() as conn:
        hashes = [r.token_hash for r in conn.execute(select(db.agents))]
    assert token not in hashes and all(len(h) == 64 for h in hashes)
    assert market.client(token).me()["name"] == "carol"
