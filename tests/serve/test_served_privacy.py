"""Served rounds are the operator's alone (issue 45, item 8): with `walla serve` and `walla market serve` on
ONE ledger (SQLite, and the real PostgreSQL the market tests start), a market agent sees nothing of a
caller's forecast through the market's API, before and after the operator resolves it (listings, the
round, its reports, its pool, its own history), and the two APIs take different principals: the market
refuses a serve caller's token, serve a market agent's.

Before: a caller's token was a market agent's, and B's GET /rounds listed A's served question; after the
resolution B's GET /rounds/{id}/reports returned every agent's answer to it.
"""

from __future__ import annotations

import subprocess

import httpx
import pytest
from market_fixtures import start_postgres
from serve_fixtures import OP_TOKEN, AppServer
from walla.market.ledger import CALLER, Ledger
from walla.market.local import LocalServer
from walla.serve.app import create_serve_app
from walla.serve.forecast import Forecaster

SECRET = {"question": "SECRET-ALICE vault 7 code 4411. Is the vault open?", "options": ["Yes", "No"]}


@pytest.fixture(scope="module")
def pg():
    pytest.importorskip("psycopg", reason="PostgreSQL tests need psycopg (the market extra)")
    try:
        server = start_postgres()
    except (FileNotFoundError, RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"PostgreSQL unavailable: {e}")
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def both(request, served_pool, tmp_path):
    """walla serve and the market's API on one ledger, each with a Ledger of its own (as two processes)."""
    db = (
        str(tmp_path / "serve.db")
        if request.param == "sqlite"
        else request.getfixturevalue("pg").create_database()
    )
    ledger = Ledger.open(db)
    ledger.ensure_operator(OP_TOKEN)
    alice = ledger.add_agent("alice", role=CALLER)
    fc = Forecaster(served_pool, ledger).start()
    market_ledger = Ledger.open(db)
    try:
        with AppServer(create_serve_app(fc)) as serve, LocalServer(market_ledger) as market:
            yield serve.url, market.url, ledger, alice
    finally:
        fc.stop()
        market_ledger.close()
        ledger.close()


def _auth(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def _agent_sees_nothing_of(market: str, bob: str, rid: int, market_rid: int) -> None:
    h = _auth(bob)
    bodies = []
    for status in (None, "open", "closed", "resolved", "void"):
        r = httpx.get(f"{market}/rounds", params={"status": status} if status else {}, headers=h)
        assert r.status_code == 200, r.text
        assert rid not in [x["id"] for x in r.json()]
        bodies.append(r.text)
    assert market_rid in [x["id"] for x in httpx.get(f"{market}/rounds", headers=h).json()]
    for path in ("", "/pool", "/reports", "/report"):
        r = httpx.get(f"{market}/rounds/{rid}{path}", headers=h)
        assert r.status_code == 404 and r.json()["error"] == f"round: no round {rid}", (path, r.text)
        bodies.append(r.text)
    r = httpx.put(
        f"{market}/rounds/{rid}/report", json={"probabilities": [0.5, 0.5], "wager": 0.1}, headers=h
    )
    assert r.status_code == 404, r.text
    r = httpx.get(f"{market}/me/payouts", headers=h)
    assert r.status_code == 200 and rid not in [p["round"] for p in r.json()]
    bodies.append(r.text)
    assert not any("SECRET" in b for b in bodies)


def test_served_rounds_are_invisible_to_market_agents_before_and_after_resolution(both):
    serve, market, ledger, alice = both
    out = httpx.post(f"{serve}/v1/forecast", json=SECRET, headers=_auth(alice))
    assert out.status_code == 200, out.text
    rid = out.json()["round"]
    op = _auth(OP_TOKEN)
    bob = httpx.post(f"{market}/agents", json={"name": "bob"}, headers=op).json()["token"]
    market_rid = httpx.post(
        f"{market}/rounds", json={"question": "Public?", "options": ["a", "b"]}, headers=op
    )
    market_rid = market_rid.json()["id"]
    _agent_sees_nothing_of(market, bob, rid, market_rid)
    assert out.json()["timings"]["ledger_s"] > 0  # the ledger's share of the answer (one transaction)
    # the operator sees it on the market's API (dashboard, audit) ...
    assert rid in [x["id"] for x in httpx.get(f"{market}/rounds", headers=op).json()]
    assert len(httpx.get(f"{market}/rounds/{rid}/reports", headers=op).json()) == len(out.json()["agents"])
    # ... and resolves it through serve; the agents still see nothing of it
    r = httpx.post(f"{serve}/v1/outcomes", json={"round": rid, "label": 0}, headers=op)
    assert r.status_code == 200 and r.json()["resolved_now"], r.text
    assert ledger.get_round(rid)["status"] == "resolved"
    _agent_sees_nothing_of(market, bob, rid, market_rid)


def test_callers_and_agents_are_principals_of_one_api_each(both):
    serve, market, _, alice = both
    bob = httpx.post(f"{market}/agents", json={"name": "bob"}, headers=_auth(OP_TOKEN)).json()["token"]
    for path in ("/rounds", "/me", "/me/payouts"):
        r = httpx.get(f"{market}{path}", headers=_auth(alice))
        assert r.status_code == 403 and "walla serve caller's token" in r.json()["error"], r.text
    r = httpx.post(f"{serve}/v1/forecast", json=SECRET, headers=_auth(bob))
    assert r.status_code == 403 and "market agent's token" in r.json()["error"], r.text
    assert httpx.get(f"{serve}/v1/models", headers=_auth(bob)).status_code == 403
    assert httpx.get(f"{serve}/v1/models", headers=_auth(alice)).status_code == 200
    for url in (f"{serve}/v1/models", f"{market}/rounds"):  # the operator is both APIs'
        assert httpx.get(url, headers=_auth(OP_TOKEN)).status_code == 200
