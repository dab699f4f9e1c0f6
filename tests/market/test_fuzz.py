"""No client input causes a 5xx (issue 29): hypothesis generates bodies, ids, query strings and tokens for every
endpoint, on SQLite and on the suite's PostgreSQL, and every answer is a 2xx or a 4xx with one JSON line
{"error": ...}; after every 4xx the ledger is unchanged (every row of every table).

In-process (the ASGI app through starlette's TestClient, no sockets), bounded: MAX_EXAMPLES requests per
database, derandomized, seconds each. The counts of answers per status are printed (pytest -s). Issue 37
added ids at and past the columns' limits (2**31, 2**63) and not written as plain digits ('+1', '1.0'),
text with bidi controls, invisible characters and NFKC look-alikes, and HEAD requests (no body, ever).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from urllib.parse import quote, urlencode

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from market_fixtures import OP_TOKEN, snapshot
from starlette.testclient import TestClient
from walla.market.api import RoundSettings, create_app
from walla.market.ledger import Ledger

MAX_EXAMPLES = 600

ENDPOINTS = [  # (method, path with {id}, takes a body)
    ("GET", "/rounds", False),
    ("POST", "/rounds", "round"),
    ("GET", "/rounds/{id}", False),
    ("POST", "/rounds/{id}/close", False),
    ("POST", "/rounds/{id}/resolve", "resolve"),
    ("POST", "/rounds/{id}/correct", "resolve"),
    ("POST", "/rounds/{id}/void", "void"),
    ("PUT", "/rounds/{id}/report", "report"),
    ("GET", "/rounds/{id}/report", False),
    ("GET", "/rounds/{id}/reports", False),
    ("GET", "/rounds/{id}/history", False),
    ("GET", "/rounds/{id}/pool", False),
    ("GET", "/me", False),
    ("GET", "/me/payouts", False),
    ("POST", "/agents", "agent"),
    ("GET", "/agents", False),
    ("POST", "/agents/{id}/revoke", False),
    ("POST", "/agents/{id}/rotate", False),
    ("GET", "/market", False),
    ("GET", "/", False),
    ("DELETE", "/rounds/{id}", False),
    ("HEAD", "/rounds/{id}", False),  # HEAD is answered where GET is (issue 37): the same status, no body
    ("HEAD", "/me/payouts", False),
]
FIELDS = [
    "question",
    "options",
    "variant",
    "c1",
    "c2",
    "c3",
    "pooling",
    "close_at",
    "publish_pool",
    "max_wager",
    "criteria",
    "source",
    "probabilities",
    "wager",
    "label",
    "target",
    "note",
    "name",
    "floor",
]

# ids at the columns' limits (PostgreSQL's integer 2**31 - 1, SQLite's 2**63 - 1) and past them (issue 37)
LIMITS = [2**31 - 2, 2**31 - 1, 2**31, 2**32, 2**63 - 1, 2**63, 2**64, -(2**31), -(2**63)]
big_ints = st.one_of(st.integers(-(2**80), 2**80), st.sampled_from([0, 1, 2, 3, -1, 10**400, *LIMITS]))
# text a reader cannot see or that reorders what they see: bidi controls, format (Cf) and other invisibles,
# NFKC look-alikes (issue 37); refused or told apart, never a 5xx
TRICKY = [
    "a\u202eb",
    "\u2066x\u2069",
    "\u200fq",
    "\u061c",
    "a\u200b",
    "\u200b",
    "\u00ad",
    "\uff41",
    "a\u00adb",
    "\u3164",
    "x\ufe0f",
    "\ufeff",
    "\U000e0001a",
    "\ufb01",
    "a\u00a0 b",
]
floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, 0.5, 1.0, 1e-309, 1e-200, 1e200, 1e303, 1e6, 1e6 + 1, -1e-4, 1.0001]),
)
texts = st.one_of(
    st.text(max_size=20),
    st.sampled_from(
        [
            "alice",
            "ALICE",
            "alice\n",
            "a\x00b",
            "\ud800",
            "I",
            "II",
            "log",
            "linear",
            "open",
            "closed",
            "resolved",
            "close",
            "never",
            "",
            " ",
            "x" * 70,
            *TRICKY,
        ]
    ),
)
scalars = st.one_of(st.none(), st.booleans(), big_ints, floats, texts)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(texts, inner, max_size=4)),
    max_leaves=12,
)
distributions = st.lists(st.one_of(floats, st.sampled_from([0.25, 0.5, 0.75])), min_size=0, max_size=5)
field_values = st.one_of(values, distributions, st.lists(texts, max_size=4))
small = st.one_of(st.sampled_from([0.0, 0.1, 0.5, 1.0, 2.0, 1e-6, 1e6]), floats)
pair = st.floats(0, 1).map(lambda p: [p, 1 - p])
valid_ish = {  # per endpoint, well-formed bodies with some fields off: they reach the ledger's writes
    "round": st.fixed_dictionaries(
        {
            "question": st.one_of(st.just("q?"), texts),
            "options": st.one_of(
                st.just(["a", "b"]),
                st.lists(texts, max_size=3),
                st.lists(st.sampled_from(["a", "b", *TRICKY]), min_size=2, max_size=3),  # look-alike pairs
            ),
        },
        optional={
            "c1": small,
            "c2": small,
            "c3": small,
            "variant": texts,
            "pooling": texts,
            "close_at": st.one_of(big_ints, floats),
            "publish_pool": texts,
            "max_wager": small,
        },
    ),
    "report": st.fixed_dictionaries({"probabilities": st.one_of(pair, distributions), "wager": small}),
    "resolve": st.fixed_dictionaries(
        {},
        optional={
            "label": st.one_of(st.integers(0, 3), big_ints),
            "target": st.one_of(pair, distributions),
            "note": texts,
        },
    ),
    "void": st.fixed_dictionaries({"reason": texts}),
    "agent": st.fixed_dictionaries({"name": texts}, optional={"max_wager": small, "floor": small}),
}
bodies = st.one_of(
    st.dictionaries(st.sampled_from(FIELDS), field_values, max_size=6),  # near-valid shapes
    values,
    st.binary(max_size=40),
    st.just("[" * 5000),
)
ids = st.one_of(
    st.sampled_from(["1", "1", "2", "3", "4", "5", "alice", "BOB", "operator"]),
    st.sampled_from(
        ["+1", " 1", "1 ", "1.0", "1_0", "01", "\u0661", "1e0", "0x1", "-0", "\uff11"]
    ),  # not ids
    big_ints.map(str),
    st.sampled_from(LIMITS).map(str),
    st.text(max_size=12),
)
queries = st.dictionaries(
    st.sampled_from(["status", "after", "limit", "x"]),
    st.one_of(
        big_ints.map(str), st.sampled_from(LIMITS).map(str), st.sampled_from(["+1", " 2", "3.0"]), texts
    ),
    max_size=3,
)
tokens = st.sampled_from(["op", "op", "alice", "bob", "none", "garbage", "basic"])


def _encode(body) -> bytes:
    if isinstance(body, bytes):
        return body
    try:
        return json.dumps(body, allow_nan=True).encode("utf-8", "surrogatepass")
    except (ValueError, OverflowError):
        return b"{}"


def _seed(ledger: Ledger) -> dict[str, str]:
    """An operator, two agents; round 1 open with alice's report, 2 closed, 3 resolved."""
    ledger.ensure_operator(OP_TOKEN)
    toks = {"op": OP_TOKEN, "alice": ledger.add_agent("alice"), "bob": ledger.add_agent("bob")}
    alice, bob = ledger.authenticate(toks["alice"]), ledger.authenticate(toks["bob"])
    s = RoundSettings()
    r1 = ledger.open_round("open?", ["a", "b"], s)["id"]
    ledger.submit_report(r1, alice, [0.6, 0.4], 0.3)
    r2 = ledger.open_round("closed?", ["a", "b"], s)["id"]
    ledger.submit_report(r2, bob, [0.5, 0.5], 0.1)
    ledger.close_round(r2)
    r3 = ledger.open_round("done?", ["a", "b", "c"], s)["id"]
    ledger.submit_report(r3, bob, [0.2, 0.3, 0.5], 0.4)
    ledger.resolve(r3, 2, [0.0, 0.0, 1.0])
    return toks


def test_no_client_input_is_a_5xx(database, capsys):
    ledger = Ledger.open(database)
    try:
        toks = _seed(ledger)
        # no limit on unknown tokens here: an address over it gets 429 before the token is read, which would
        # hide the endpoints from the fuzzer (test_slow_clients.py tests that limit)
        client = TestClient(create_app(ledger, unknown_token_rate=0), raise_server_exceptions=False)
        seen: Counter = Counter()
        problems: list[str] = []

        @settings(
            max_examples=MAX_EXAMPLES,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(endpoint=st.sampled_from(ENDPOINTS), rid=ids, query=queries, token=tokens, data=st.data())
        def one_request(endpoint, rid, query, token, data):
            method, path, has_body = endpoint
            body = data.draw(st.one_of(valid_ish[has_body], bodies) if has_body else st.none())
            url = path.replace("{id}", quote(rid, safe="", errors="surrogatepass")) + (
                "?" + urlencode(query, errors="surrogatepass") if query else ""
            )
            headers = {}
            if token in toks:
                headers["Authorization"] = f"Bearer {toks[token]}"
            elif token == "garbage":
                headers["Authorization"] = "Bearer wm_garbage"
            elif token == "basic":
                headers["Authorization"] = "Basic dXNlcjpwYXNz"
            content = None
            if has_body:
                content = _encode(body)
                headers["Content-Type"] = "application/json"
            before = snapshot(ledger)
            r = client.request(method, url, content=content, headers=headers)
            seen[r.status_code] += 1
            what = f"{method} {url[:80]!r} body {content[:80] if content else None!r}: HTTP {r.status_code}"
            if r.status_code >= 500:
                problems.append(f"{what} {r.text[:200]}")
            elif method == "HEAD":
                if r.content or snapshot(ledger) != before:
                    problems.append(f"{what}: a HEAD answered a body or changed the ledger")
            elif r.status_code >= 400:
                try:
                    payload = r.json()
                except ValueError:
                    payload = None
                if not isinstance(payload, dict) or list(payload) != ["error"] or "\n" in payload["error"]:
                    problems.append(f"{what}: not one JSON error line: {r.text[:200]!r}")
                if snapshot(ledger) != before:
                    problems.append(f"{what}: a refused request changed the ledger")
            assert not problems, problems[-1]

        one_request()
        with capsys.disabled():
            kind = "PostgreSQL" if database.startswith("postgres") else "SQLite"
            print(f"\nfuzz {kind}: {sum(seen.values())} requests, by status {dict(sorted(seen.items()))}")
        assert seen and max(seen) < 500 and not problems
        assert sum(n for s, n in seen.items() if s < 300) > 0  # some requests were valid: the state evolved
    finally:
        ledger.close()


def test_encode_helper_keeps_non_finite_literals():
    """The fuzzer sends NaN/Infinity literals (Python's json reads them) and 401-digit integers."""
    assert _encode({"x": math.nan, "y": 10**400}).startswith(b'{"x": NaN, "y": 1000')


@pytest.mark.parametrize("token", ["alice"])
def test_rate_limit_is_a_429_and_writes_nothing(tmp_path, token):
    ledger = Ledger.open(str(tmp_path / "m.db"))
    try:
        toks = _seed(ledger)
        client = TestClient(create_app(ledger, rate=1.0, burst=3), raise_server_exceptions=False)
        headers = {"Authorization": f"Bearer {toks[token]}"}
        codes = [client.get("/me", headers=headers).status_code for _ in range(5)]
        assert codes[:3] == [200, 200, 200] and codes[3:] == [429, 429]
        before = snapshot(ledger)
        r = client.put("/rounds/1/report", json={"probabilities": [0.5, 0.5], "wager": 0.1}, headers=headers)
        assert r.status_code == 429 and r.json()["error"].startswith("authorization: over this token's rate")
        assert r.headers["retry-after"] == "1"  # one request's worth at 1 request/s
        assert snapshot(ledger) == before
        assert client.get("/me", headers={"Authorization": f"Bearer {toks['bob']}"}).status_code == 200
    finally:
        ledger.close()
