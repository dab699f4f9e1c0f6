"""An operator's controls (issue 29, finding 8): void a round, correct a resolution by appended reversing rows
(no row edited or deleted), report history, wager caps and a bankroll floor, revoking and rotating tokens,
round metadata, and a read timeout on request bodies."""

from __future__ import annotations

import asyncio

import pytest
import torch
from market_fixtures import snapshot
from walla.market.api import ConnectionLimits, create_app
from walla.market.client import MarketError
from walla.train import mechanism


def _status(fn) -> tuple[int, str]:
    with pytest.raises(MarketError) as e:
        fn()
    return e.value.status, e.value.message


def _rows_kept(before: dict, after: dict) -> None:
    """Append-only: every row of every table before is still there, unchanged."""
    for table, rows in before.items():
        if table in ("rounds", "agents"):  # a round's status and an agent's revoked_at change by design
            continue
        assert set(rows) <= set(after[table]), f"{table}: a row was edited or deleted"


def _net(probs, wagers, label, k):
    y = torch.eye(k, dtype=torch.float64)[label]
    return mechanism.net_payout(
        torch.tensor(probs, dtype=torch.float64), torch.tensor(wagers, dtype=torch.float64), y
    )


def test_correct_a_resolution(market):
    alice, bob = market.agent("alice"), market.agent("bob")
    rid = market.op.open_round("q", ["x", "y"], criteria="the official result", source="example.org")["id"]
    alice.submit(rid, [0.8, 0.2], 0.5)
    bob.submit(rid, [0.3, 0.7], 0.4)
    first = market.op.resolve(rid, label=0)
    before = snapshot(market.ledger)
    fixed = market.op.request("POST", f"/rounds/{rid}/correct", json={"label": 1, "note": "source corrected"})
    _rows_kept(before, snapshot(market.ledger))
    want = _net([[0.8, 0.2], [0.3, 0.7]], [0.5, 0.4], 1, 2).tolist()
    assert [fixed["payouts"]["alice"], fixed["payouts"]["bob"]] == pytest.approx(want, abs=1e-12)
    assert alice.me()["balance"] == pytest.approx(want[0], abs=1e-12)  # the first payout reversed
    assert first["payouts"]["alice"] != pytest.approx(want[0])
    kinds = [(p["seq"], p["kind"]) for p in alice.my_payouts()]
    assert kinds == [(1, "pay"), (2, "reverse"), (2, "pay")]
    rnd = market.op.round(rid)
    assert rnd["resolution"]["kind"] == "correct" and rnd["resolution"]["note"] == "source corrected"
    assert rnd["criteria"] == "the official result" and rnd["source"] == "example.org"
    assert market.op.resolve(rid, label=1)["resolved_now"] is False  # idempotent on the current answer
    assert _status(lambda: market.op.resolve(rid, label=0))[0] == 409
    assert _status(lambda: market.op.request("POST", f"/rounds/{rid}/correct", json={"label": 1}))[0] == 409
    assert market.op.market()["totals"]["deficit"] == pytest.approx(sum(want), abs=1e-12)


def test_void_rounds(market):
    alice = market.agent("alice")
    open_id = market.op.open_round("q", ["x", "y"])["id"]
    alice.submit(open_id, [0.6, 0.4], 0.3)
    done_id = market.op.open_round("q2", ["x", "y"])["id"]
    alice.submit(done_id, [0.9, 0.1], 0.7)
    market.agent("bob").submit(done_id, [0.2, 0.8], 0.2)
    market.op.resolve(done_id, label=1)
    before = snapshot(market.ledger)
    for rid in (open_id, done_id):
        rnd = market.op.request("POST", f"/rounds/{rid}/void", json={"reason": "question was ambiguous"})
        assert rnd["status"] == "void" and rnd["resolution"]["note"] == "question was ambiguous"
    _rows_kept(before, snapshot(market.ledger))
    assert alice.me()["balance"] == pytest.approx(0.0, abs=1e-15)  # the paid round reversed, the open unpaid
    assert _status(lambda: alice.submit(open_id, [0.5, 0.5], 0.1))[0] == 409
    assert _status(lambda: market.op.resolve(open_id, label=0))[0] == 409
    assert (
        _status(lambda: market.op.request("POST", f"/rounds/{open_id}/void", json={"reason": "again"}))[0]
        == 409
    )
    assert [r["id"] for r in market.op.rounds("void")] == [open_id, done_id]
    assert market.op.market()["totals"]["rounds_resolved"] == 0


def test_report_history_keeps_replacements(market):
    alice = market.agent("alice")
    rid = market.op.open_round("q", ["x", "y"])["id"]
    for p in (0.1, 0.5, 0.9):
        alice.submit(rid, [p, 1 - p], p)
    hist = market.op.request("GET", f"/rounds/{rid}/history")
    assert [(h["version"], h["wager"]) for h in hist] == [(1, 0.1), (2, 0.5), (3, 0.9)]
    assert all(h["submitted_at"] > 0 for h in hist) and hist[0]["submitted_at"] <= hist[-1]["submitted_at"]
    assert _status(lambda: alice.request("GET", f"/rounds/{rid}/history"))[0] == 403


def test_wager_caps_and_floor(market):
    capped = market.client(
        market.op.request("POST", "/agents", json={"name": "capped", "max_wager": 0.2})["token"]
    )
    floored = market.client(
        market.op.request("POST", "/agents", json={"name": "floored", "floor": -1.0})["token"]
    )
    rid = market.op.open_round("q", ["x", "y"], max_wager=0.5)["id"]
    before = snapshot(market.ledger)
    status, msg = _status(lambda: capped.submit(rid, [0.5, 0.5], 0.3))
    assert status == 409 and "agent's maximum wager 0.2" in msg
    status, msg = _status(lambda: floored.submit(rid, [0.5, 0.5], 0.6))
    assert status == 409 and "round's maximum wager 0.5" in msg
    assert snapshot(market.ledger) == before
    capped.submit(rid, [0.5, 0.5], 0.2)
    # worst case of a wager w with c2 = c3 = 0.5: -w (1 + w/2); -1.0 is reached at w = 0.732
    floored.submit(rid, [0.5, 0.5], 0.5)  # worst -0.625
    other = market.op.open_round("q2", ["x", "y"])["id"]
    status, msg = _status(lambda: floored.submit(other, [0.5, 0.5], 0.4))  # -0.625 - 0.48 < -1
    assert status == 409 and "below its floor -1" in msg
    floored.submit(other, [0.5, 0.5], 0.3)  # -0.625 - 0.345 >= -1


def test_revoke_and_rotate(market):
    token = market.op.add_agent("alice")
    alice = market.client(token)
    assert alice.me()["name"] == "alice"
    market.op.request("POST", "/agents/alice/revoke")
    assert _status(alice.me)[0] == 401
    assert _status(lambda: market.op.request("POST", "/agents/alice/revoke"))[0] == 409
    new = market.op.request("POST", "/agents/ALICE/rotate")["token"]
    assert new != token and market.client(new).me()["name"] == "alice"
    assert _status(alice.me)[0] == 401
    assert _status(lambda: market.op.request("POST", "/agents/nobody/rotate"))[0] == 404
    assert _status(lambda: market.op.request("POST", "/agents/operator/rotate"))[0] == 404


def test_body_read_timeout(market):
    """A client that sends headers and then stalls gets 408 after the read timeout, and nothing is written."""
    app = create_app(market.ledger, limits=ConnectionLimits(read_timeout=0.2))
    token = market.op.add_agent("alice")
    rid = market.op.open_round("q", ["x", "y"])["id"]
    before = snapshot(market.ledger)
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "PUT",
        "scheme": "http",
        "path": f"/rounds/{rid}/report",
        "raw_path": f"/rounds/{rid}/report".encode(),
        "query_string": b"",
        "root_path": "",
        "server": ("127.0.0.1", 80),
        "client": ("127.0.0.1", 1),
        "headers": [
            (b"authorization", f"Bearer {token}".encode()),
            (b"content-type", b"application/json"),
            (b"content-length", b"40"),
        ],
    }
    sent = []

    async def stall() -> dict:
        await asyncio.sleep(5)
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(asyncio.wait_for(app(scope, stall, send), 4))
    assert sent[0]["status"] == 408 and b"body: not received within 0.2 s" in sent[1]["body"]
    assert snapshot(market.ledger) == before
