"""Typed at the door (issue 29, findings 2-5): inputs that used to answer 500, commit an infinite bound or
payout, or register look-alike names are refused with one 4xx line, and the ledger refuses any non-finite
number inside its transaction. Each test here failed on ed1cac5."""

from __future__ import annotations

import json

import httpx
import pytest
from market_fixtures import snapshot


def _raw(market, method: str, path: str, body: str | None = None, token: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token or market.op.http.headers['authorization'].split()[1]}"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    return httpx.request(method, market.url + path, content=body, headers=headers, timeout=30)


def _one_line(r: httpx.Response, status: int, field: str) -> None:
    assert r.status_code == status, (r.status_code, r.text)
    assert list(r.json()) == ["error"] and r.json()["error"].startswith(field), r.text
    assert "\n" not in r.json()["error"]


@pytest.mark.parametrize(
    "settings, field",
    [
        ({"c3": 1e-309}, "c3"),
        ({"c2": 1e200, "c3": 1e-200}, "c2"),
        ({"c3": 1e303}, "c3"),
        ({"c1": 1e300}, "c1"),
    ],
)
def test_overflowing_settings_refused(market, settings, field):
    """Finding 2: the round used to be committed with an infinite deficit bound; GET /rounds then answered 500."""
    before = snapshot(market.ledger)
    r = _raw(market, "POST", "/rounds", json.dumps({"question": "q", "options": ["a", "b"], **settings}))
    _one_line(r, 400, field)
    assert snapshot(market.ledger) == before
    assert _raw(market, "GET", "/rounds").status_code == 200


def test_ledger_refuses_non_finite_inside_its_transaction(market):
    """Finding 3: settings that slip past the types (constructed unchecked) cannot commit a non-finite bound or
    payout: the ledger checks inside the transaction and writes nothing."""
    from walla.market.api import RoundSettings
    from walla.market.ledger import LedgerInvariantError  # here: the test file still runs on ed1cac5

    ledger = market.ledger
    before = snapshot(ledger)
    with pytest.raises(LedgerInvariantError, match="not finite"):
        ledger.open_round(
            "q",
            ["a", "b"],
            RoundSettings.model_construct(variant="I", c1=1.0, c2=0.5, c3=1e-309, pooling="linear"),
        )
    assert snapshot(ledger) == before
    huge = RoundSettings.model_construct(variant="I", c1=1.0, c2=0.5, c3=1e303, pooling="linear")
    rid = ledger.open_round("q", ["a", "b"], huge)["id"]  # the bound c2^2/c3 is finite
    alice = market.agent("alice")
    alice.submit(rid, [0.9, 0.1], 1e6)  # payout -c3 w^2 = -1e315: -inf
    before = snapshot(ledger)
    with pytest.raises(LedgerInvariantError, match="not finite"):
        ledger.resolve(rid, 1, [0.0, 1.0])
    assert snapshot(ledger) == before
    assert alice.me()["balance"] == 0.0 and market.op.agents()[0]["balance"] == 0.0


def test_largest_settings_pay_finitely(market):
    """The bounds of the types keep the worst case finite: c3 and the wager at their maxima."""
    alice, bob = market.agent("alice"), market.agent("bob")
    rid = market.op.open_round("q", ["a", "b"], c2=1e6, c3=1e6, c1=-1e6)["id"]
    alice.submit(rid, [1.0, 0.0], 1e6)
    bob.submit(rid, [0.0, 1.0], 1e6)
    res = market.op.resolve(rid, label=1)
    assert all(abs(v) < 1e300 for v in res["payouts"].values())
    assert market.op.market()["totals"]["deficit"] == res["total_payout"]


@pytest.mark.parametrize(
    "method, path, body, status, field",
    [
        ("GET", "/rounds/2147483648", None, 404, "round"),  # int4 on PostgreSQL
        ("GET", "/rounds?after=2147483648", None, 400, "after"),
        ("GET", "/me/payouts?after=99999999999", None, 400, "after"),
        ("POST", "/rounds", '{"question": "a\\u0000b", "options": ["x", "y"]}', 400, "question"),
        ("POST", "/rounds", '{"question": "a\\ud800b", "options": ["x", "y"]}', 400, "question"),
        ("POST", "/rounds", '{"question": "q", "options": ["x", "y\\u0007"]}', 400, "options[1]"),
        ("POST", "/rounds", '{"question": "q", "options": ["x", "y"], "c1": 1' + "0" * 400 + "}", 400, "c1"),
        (
            "POST",
            "/rounds",
            '{"question": "q", "options": ["x", "y"], "close_at": 1' + "0" * 400 + "}",
            400,
            "close_at",
        ),
        (
            "PUT",
            "/rounds/{rid}/report",
            '{"probabilities": [1' + "0" * 400 + ', 0], "wager": 0.1}',
            400,
            "probabilities[0]",
        ),
        (
            "PUT",
            "/rounds/{rid}/report",
            '{"probabilities": [0.5, 0.5], "wager": 1' + "0" * 400 + "}",
            400,
            "wager",
        ),
    ],
)
def test_client_input_that_was_a_500(market, method, path, body, status, field):
    """Finding 4: ids beyond int4, NUL, lone surrogates, control characters, 401-digit integers."""
    alice_token = market.op.add_agent("alice")
    rid = market.op.open_round("q", ["x", "y"])["id"]
    before = snapshot(market.ledger)
    token = alice_token if method == "PUT" else None
    _one_line(_raw(market, method, path.format(rid=rid), body, token), status, field)
    assert snapshot(market.ledger) == before


def test_look_alike_names(market):
    """Finding 5: a trailing newline, a case variant and a trailing dot are not second 'alice's."""
    market.op.add_agent("alice")
    before = snapshot(market.ledger)
    for name, status in [("alice\n", 400), ("ALICE", 409), ("Alice", 409), ("alice.", 400), (".alice", 400)]:
        _one_line(_raw(market, "POST", "/agents", json.dumps({"name": name})), status, "name")
    assert snapshot(market.ledger) == before
    assert [a["name"] for a in market.op.agents()] == ["alice"]


def test_openapi_served(market):
    """The schema carries the constraints: bounded c3, int4 ids, the name pattern."""
    spec = httpx.get(market.url + "/openapi.json").json()
    c3 = spec["components"]["schemas"]["RoundIn"]["properties"]["c3"]
    assert c3["minimum"] == 1e-6 and c3["maximum"] == 1e6
    rid = next(p for p in spec["paths"]["/rounds/{rid}"]["get"]["parameters"] if p["name"] == "rid")
    assert rid["schema"]["maximum"] == 2**31 - 1
    assert "bearer" in json.dumps(spec["components"]["securitySchemes"]).lower()
    assert httpx.get(market.url + "/docs").status_code == 200
