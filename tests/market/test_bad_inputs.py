"""The bad-input table: every client mistake over the API and the CLIs is a 4xx (or exit != 0) with ONE line
naming the field, no traceback, and the ledger unchanged (every row of every table compared)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from market_fixtures import OP_TOKEN, snapshot
from walla.market.cli import run_market
from walla.market.launch import TOKEN_ENV


def _setup(market):
    """A market with two agents, an open round with alice's report, a closed and a resolved round."""
    alice, bob = market.agent("alice"), market.agent("bob")
    open_id = market.op.open_round("open?", ["a", "b"])["id"]
    alice.submit(open_id, [0.6, 0.4], 0.3)
    closed_id = market.op.open_round("closed?", ["a", "b"])["id"]
    alice.submit(closed_id, [0.5, 0.5], 0.1)
    market.op.close_round(closed_id)
    done_id = market.op.open_round("done?", ["a", "b", "c"])["id"]
    bob.submit(done_id, [0.2, 0.3, 0.5], 0.4)
    market.op.resolve(done_id, label=2)
    tok = lambda c: c.http.headers["authorization"].split()[1]  # noqa: E731
    return {
        "alice": tok(alice),
        "bob": tok(bob),
        "op": OP_TOKEN,
        "open": open_id,
        "closed": closed_id,
        "done": done_id,
    }


def api_cases(ids: dict) -> list[tuple[str, str, str, str, object, int, str]]:
    """(name, token, method, path, body (dict -> JSON, str/bytes -> raw), expected status, field in the error)."""
    o, c, d = ids["open"], ids["closed"], ids["done"]
    rep = f"/rounds/{o}/report"
    good = {"probabilities": [0.5, 0.5], "wager": 0.2}
    return [
        (
            "probs off the simplex",
            "alice",
            "PUT",
            rep,
            {"probabilities": [0.6, 0.6], "wager": 0.2},
            400,
            "probabilities",
        ),
        (
            "negative probability",
            "alice",
            "PUT",
            rep,
            {"probabilities": [1.00001, -0.5], "wager": 0.2},
            400,
            "probabilities[1]",
        ),
        (
            "wrong option count",
            "alice",
            "PUT",
            rep,
            {"probabilities": [1.0], "wager": 0.2},
            400,
            "probabilities",
        ),
        (
            "NaN probability",
            "alice",
            "PUT",
            rep,
            '{"probabilities": [NaN, 0.5], "wager": 0.1}',
            400,
            "probabilities[0]",
        ),
        (
            "infinite wager",
            "alice",
            "PUT",
            rep,
            '{"probabilities": [0.5, 0.5], "wager": Infinity}',
            400,
            "wager",
        ),
        ("negative wager", "alice", "PUT", rep, {"probabilities": [0.5, 0.5], "wager": -0.1}, 400, "wager"),
        ("wager as text", "alice", "PUT", rep, {"probabilities": [0.5, 0.5], "wager": "0.5"}, 400, "wager"),
        ("huge wager", "alice", "PUT", rep, {"probabilities": [0.5, 0.5], "wager": 1e300}, 400, "wager"),
        (
            "probabilities not a list",
            "alice",
            "PUT",
            rep,
            {"probabilities": "0.5,0.5", "wager": 0.1},
            400,
            "probabilities",
        ),
        ("missing wager", "alice", "PUT", rep, {"probabilities": [0.5, 0.5]}, 400, "wager"),
        ("unknown field", "alice", "PUT", rep, {**good, "note": "hi"}, 400, "note"),
        ("not JSON", "alice", "PUT", rep, "{probabilities: ", 400, "body"),
        ("JSON array body", "alice", "PUT", rep, "[0.5, 0.5]", 400, "body"),
        ("unknown round", "alice", "PUT", "/rounds/999/report", good, 404, "round"),
        ("non-numeric round id", "alice", "PUT", "/rounds/abc/report", good, 404, "round"),
        ("closed round", "alice", "PUT", f"/rounds/{c}/report", good, 409, "round"),
        (
            "resolved round",
            "bob",
            "PUT",
            f"/rounds/{d}/report",
            {"probabilities": [1, 0, 0], "wager": 1},
            409,
            "round",
        ),
        ("resolve again, other answer", "op", "POST", f"/rounds/{d}/resolve", {"label": 0}, 409, "label"),
        ("missing token", None, "PUT", rep, good, 401, "authorization"),
        ("wrong token", "wm_not-a-token-000000000000000", "PUT", rep, good, 401, "authorization"),
        ("not a bearer header", "Basic", "PUT", rep, good, 401, "authorization"),
        (
            "agent opens a round",
            "alice",
            "POST",
            "/rounds",
            {"question": "q", "options": ["a", "b"]},
            403,
            "authorization",
        ),
        ("agent resolves", "bob", "POST", f"/rounds/{o}/resolve", {"label": 0}, 403, "authorization"),
        ("operator submits", "op", "PUT", rep, good, 403, "authorization"),
        ("reads another's open report", "bob", "GET", f"/rounds/{o}/reports", None, 403, "round"),
        ("oversized body", "alice", "PUT", rep, b'{"pad": "' + b"x" * 70_000 + b'"}', 413, "body"),
        ("label out of range", "op", "POST", f"/rounds/{o}/resolve", {"label": 2}, 400, "label"),
        (
            "label and target",
            "op",
            "POST",
            f"/rounds/{o}/resolve",
            {"label": 0, "target": [1, 0]},
            400,
            "label",
        ),
        (
            "target off the simplex",
            "op",
            "POST",
            f"/rounds/{o}/resolve",
            {"target": [0.7, 0.7]},
            400,
            "target",
        ),
        ("boolean label", "op", "POST", f"/rounds/{o}/resolve", {"label": True}, 400, "label"),
        ("one option", "op", "POST", "/rounds", {"question": "q", "options": ["a"]}, 400, "options"),
        (
            "duplicate options",
            "op",
            "POST",
            "/rounds",
            {"question": "q", "options": ["a", "a"]},
            400,
            "options",
        ),
        ("c3 zero", "op", "POST", "/rounds", {"question": "q", "options": ["a", "b"], "c3": 0}, 400, "c3"),
        (
            "unknown variant",
            "op",
            "POST",
            "/rounds",
            {"question": "q", "options": ["a", "b"], "variant": "III"},
            400,
            "variant",
        ),
        (
            "close time in the past",
            "op",
            "POST",
            "/rounds",
            {"question": "q", "options": ["a", "b"], "close_at": 1},
            400,
            "close_at",
        ),
        (
            "empty question",
            "op",
            "POST",
            "/rounds",
            {"question": " ", "options": ["a", "b"]},
            400,
            "question",
        ),
        ("taken agent name", "op", "POST", "/agents", {"name": "alice"}, 409, "name"),
        ("bad agent name", "op", "POST", "/agents", {"name": "a b"}, 400, "name"),
        ("bad status filter", "alice", "GET", "/rounds?status=pending", None, 400, "status"),
        ("limit out of range", "alice", "GET", "/rounds?limit=0", None, 400, "limit"),
        ("unknown path", "alice", "GET", "/nowhere", None, 404, "path"),
        ("huge round id", "alice", "GET", "/rounds/" + "9" * 22, None, 404, "round"),
        ("JSON nested too deeply", "alice", "PUT", rep, "[" * 30000 + "]" * 30000, 400, "body"),
        ("body not UTF-8", "alice", "PUT", rep, b"\xff\xfe{}", 400, "body"),
        ("wrong method", "alice", "DELETE", "/rounds", None, 405, "method"),
        ("no JSON content type", "alice", "PUT", rep + "?no-content-type", good, 400, "body"),
    ]


def _call(url: str, ids: dict, token, method: str, path: str, body) -> httpx.Response:
    headers = {}
    if token == "Basic":
        headers["Authorization"] = "Basic dXNlcjpwYXNz"
    elif token is not None:
        headers["Authorization"] = f"Bearer {ids.get(token, token)}"
    if isinstance(body, dict):
        content = json.dumps(body).encode()
    else:
        content = body.encode() if isinstance(body, str) else body
    if content is not None and not path.endswith("?no-content-type"):
        headers["Content-Type"] = "application/json"
    return httpx.request(method, url + path, content=content, headers=headers, timeout=30)


def test_bad_api_inputs(market):
    ids = _setup(market)
    before = snapshot(market.ledger)
    cases = api_cases(ids)
    problems = []
    for name, token, method, path, body, status, field in cases:
        r = _call(market.url, ids, token, method, path, body)
        text = r.text
        try:
            error = r.json()["error"]
        except (ValueError, KeyError, TypeError):
            error = None
        if r.status_code != status or error is None or list(r.json()) != ["error"]:
            problems.append(f"{name}: HTTP {r.status_code} {text[:120]!r} (expected {status})")
        elif "\n" in error or "Traceback" in text or not error.startswith(field):
            problems.append(f"{name}: error {error!r} is not one line starting with {field!r}")
    assert not problems, "\n".join(problems)
    assert len(cases) >= 40
    assert snapshot(market.ledger) == before


def test_oversized_streamed_body(market):
    """A chunked body without Content-Length is cut off at the limit too."""
    ids = _setup(market)
    before = snapshot(market.ledger)

    def chunks():
        for _ in range(40):
            yield b"x" * 4096

    r = httpx.put(
        f"{market.url}/rounds/{ids['open']}/report",
        content=chunks(),
        headers={"Authorization": f"Bearer {ids['alice']}"},
    )
    assert r.status_code == 413 and r.json() == {"error": "body: larger than 65536 bytes"}
    assert snapshot(market.ledger) == before


def cli_cases(db_arg: str, tmp: Path, agent_token: str) -> list[tuple[str, list[str], dict, int, str]]:
    """(name, argv after `walla market`, environment, expected exit code, text the error line contains)."""
    (tmp / "short-token").write_text("abc")
    busy = tmp / "a-directory"
    busy.mkdir(exist_ok=True)
    return [
        ("bad agent name", ["add-agent", "no spaces", "--db", db_arg], {}, 2, "name:"),
        ("taken agent name", ["add-agent", "alice", "--db", db_arg], {}, 1, "already exists"),
        (
            "db in a missing directory",
            ["add-agent", "x", "--db", str(tmp / "nope" / "m.db")],
            {},
            1,
            "does not exist",
        ),
        ("db is a directory", ["init", "--db", str(busy)], {}, 1, "is a directory"),
        ("db URL of no driver", ["init", "--db", "nosuchdb://x/y"], {}, 1, "not a supported database"),
        # issue 29 finding 6: these three were tracebacks
        (
            "mysql URL",
            ["init", "--db", "mysql://u@127.0.0.1/m"],
            {},
            1,
            "mysql:// is not a supported database",
        ),
        ("operator token = an agent's", ["init", "--db", db_arg], {TOKEN_ENV: agent_token}, 1, TOKEN_ENV),
        ("agent named operator", ["add-agent", "OPERATOR", "--db", db_arg], {}, 1, "reserved"),
        ("port out of range", ["serve", "--db", db_arg, "--port", "70000"], {}, 2, "--port"),
        ("port not a number", ["serve", "--db", db_arg, "--port", "abc"], {}, 2, "--port"),
        (
            "max body too small",
            ["serve", "--db", db_arg, "--port", "1", "--max-body", "10"],
            {},
            2,
            "--max-body",
        ),
        ("negative rate", ["serve", "--db", db_arg, "--port", "1", "--rate", "-1"], {}, 2, "--rate"),
        (
            "zero read timeout",
            ["serve", "--db", db_arg, "--port", "1", "--read-timeout", "0"],
            {},
            2,
            "--read-timeout",
        ),
        (
            "no connections per client",
            ["serve", "--db", db_arg, "--port", "1", "--max-client-connections", "0"],
            {},
            2,
            "--max-client-connections",
        ),
        ("short operator token", ["init", "--db", db_arg], {TOKEN_ENV: "short"}, 2, TOKEN_ENV),
        (
            "missing token file",
            ["init", "--db", db_arg, "--operator-token-file", str(tmp / "none")],
            {},
            1,
            "--operator-token-file",
        ),
        (
            "short token file",
            ["init", "--db", db_arg, "--operator-token-file", str(tmp / "short-token")],
            {},
            2,
            ">= 16",
        ),
        ("unknown command", ["trade"], {}, 2, "No such command"),
    ]


def test_bad_cli_inputs(market, tmp_path, capfd, monkeypatch):
    ids = _setup(market)
    db_arg = str(market.ledger.engine.url.render_as_string(hide_password=False))
    db_arg = db_arg.replace("sqlite:///", "").replace("postgresql+psycopg://", "postgresql://")
    before = snapshot(market.ledger)
    problems = []
    for name, argv, env, code, needle in cli_cases(db_arg, tmp_path, ids["alice"]):
        with monkeypatch.context() as mp:
            for k, v in env.items():
                mp.setenv(k, v)
            rc = run_market(argv, "walla market")
        out, err = capfd.readouterr()
        lines = [x for x in err.splitlines() if x.strip()]
        if rc != code or len(lines) != 1 or needle not in lines[0] or "Traceback" in err:
            problems.append(f"{name}: exit {rc} (expected {code}), stderr {err!r}")
    assert not problems, "\n".join(problems)
    assert snapshot(market.ledger) == before
