"""Slow and greedy clients (issue 37, finding 8), over raw sockets on 127.0.0.1 against a live server with a
1 s read timeout and at most 6 connections per address (market/api/_guard.py, api/deps.py).

Before the fix a body dripped a byte at a time never timed out (the timeout was per chunk), headers had no
deadline at all, idle connections were held without limit, and every unknown token was a database read.
Each test is bounded: a few seconds, a few sockets.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import socket
import subprocess
import sys
import time

import httpx
import pytest
from market_fixtures import OP_TOKEN, reset_ledger, snapshot, wait_until
from walla.market.api import ConnectionLimits, create_app
from walla.market.client import wait_ready
from walla.market.launch import TOKEN_ENV
from walla.market.ledger import Ledger
from walla.market.local import LocalServer, free_port

READ_TIMEOUT = 1.0
WRITE_TIMEOUT = 1.0
PER_CLIENT = 6
IN_ALL = 12
DRIP_EVERY = 0.25  # s between bytes: well inside the read timeout, so only a whole-request deadline trips
SERVE = "from walla.market.cli._operator import app; app(prog_name='walla market')"  # as test_fault.py


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    ledger = Ledger.open(str(tmp_path_factory.mktemp("slow") / "market.db"))
    srv = LocalServer(
        ledger,
        limits=ConnectionLimits(READ_TIMEOUT, PER_CLIENT, WRITE_TIMEOUT, IN_ALL),
    ).start()
    yield srv, ledger
    srv.stop()
    ledger.close()


@pytest.fixture
def market(server):
    """(server, ledger, alice's token, an open round's id) on an emptied ledger."""
    srv, ledger = server
    reset_ledger(ledger)
    ledger.ensure_operator(OP_TOKEN)
    token = ledger.add_agent("alice")
    rid = httpx.post(
        f"{srv.url}/rounds",
        json={"question": "q?", "options": ["a", "b"]},
        headers={"Authorization": f"Bearer {OP_TOKEN}"},
    ).json()["id"]
    wait_until(lambda: not srv.server.server_state.connections, timeout=5)  # the fixture's own are closed
    return srv, ledger, token, rid


def drip(port: int, first: bytes, then: bytes, limit: float = 4 * READ_TIMEOUT) -> bytes:
    """Send `first`, then `then` one byte every DRIP_EVERY s until the server answers; what it answered
    before closing (b"" when it never did within `limit`)."""
    with socket.create_connection(("127.0.0.1", port), timeout=limit) as s:
        s.sendall(first)
        end = time.monotonic() + limit
        for b in then:
            if select.select([s], [], [], DRIP_EVERY)[0] or time.monotonic() > end:
                break
            try:
                s.sendall(bytes([b]))
            except OSError:  # closed on us
                break
        return read_all(s, end)


def read_all(s: socket.socket, end: float) -> bytes:
    got = b""
    s.settimeout(max(0.1, end - time.monotonic()))
    try:
        while chunk := s.recv(65536):
            got += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return got


def status_and_error(answer: bytes) -> tuple[int, dict[str, str], dict]:
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, json.loads(body)


def report_request(rid: int, token: str, body: bytes) -> bytes:
    return (
        f"PUT /rounds/{rid}/report HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()


BODY = b'{"probabilities": [0.5, 0.5], "wager": 0.1}'


def test_a_body_dripped_slowly_gets_408_and_writes_nothing(market):
    """Each byte comes well within the read timeout; the whole body does not: 408, the report unwritten."""
    srv, ledger, token, rid = market
    before = snapshot(ledger)
    answer = drip(srv.port, report_request(rid, token, BODY), BODY)
    assert answer, "no answer while the body was dripped past the read timeout"
    status, _, error = status_and_error(answer)
    assert (status, error) == (408, {"error": f"body: not received within {READ_TIMEOUT:g} s"})
    assert snapshot(ledger) == before


def test_headers_sent_slowly_get_408(market):
    srv, _, token, rid = market
    head = report_request(rid, token, BODY)
    answer = drip(srv.port, head[:20], head[20:])
    assert answer, "no answer while the headers were dripped past the read timeout"
    assert status_and_error(answer)[:3:2] == (
        408,
        {"error": f"request: not received within {READ_TIMEOUT:g} s"},
    )


def test_a_silent_connection_is_closed(market):
    srv, _, _, _ = market
    with socket.create_connection(("127.0.0.1", srv.port)) as s:
        answer = read_all(s, time.monotonic() + 4 * READ_TIMEOUT)
    assert answer and status_and_error(answer)[0] == 408  # then closed: read_all saw the end


def test_a_request_sent_whole_in_time_is_served_on_a_kept_alive_connection(market):
    """The deadline runs from a request's first byte: an idle keep-alive gap longer than it is no offence."""
    srv, _, token, rid = market
    with httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {token}"}) as c:
        assert c.get(f"/rounds/{rid}").status_code == 200
        time.sleep(1.5 * READ_TIMEOUT)  # under uvicorn's keep-alive of 5 s
        r = c.put(f"/rounds/{rid}/report", content=BODY, headers={"Content-Type": "application/json"})
        assert r.status_code == 200, r.text


def test_connections_per_address_are_capped(market):
    """PER_CLIENT open (idle) connections from 127.0.0.1 hold the cap: one more gets 429 with Retry-After
    and is closed at once; once they go, requests are served again."""
    srv, _, token, rid = market
    held = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(PER_CLIENT)]
    try:
        assert wait_until(lambda: len(srv.server.server_state.connections) >= PER_CLIENT, timeout=5)
        with socket.create_connection(("127.0.0.1", srv.port)) as extra:
            answer = read_all(extra, time.monotonic() + READ_TIMEOUT / 2)
        status, headers, error = status_and_error(answer)
        assert status == 429 and headers["retry-after"] == "1", answer
        assert error["error"].startswith("connection: 127.0.0.1 already holds 6 open connections")
    finally:
        for s in held:
            s.close()
    auth = {"Authorization": f"Bearer {token}"}
    assert wait_until(
        lambda: httpx.get(f"{srv.url}/rounds/{rid}", headers=auth).status_code == 200, timeout=5
    )


def test_walla_market_serve_is_guarded(tmp_path):
    """The command a user starts serves through the same guard, with its options."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE, "serve", "--db", str(tmp_path / "m.db"), "--port", str(port)]
        + ["--read-timeout", "1", "--max-client-connections", "2", "--unsigned"],
        env={**os.environ, TOKEN_ENV: OP_TOKEN},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_ready(f"http://127.0.0.1:{port}", timeout=60)
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
        with socket.create_connection(("127.0.0.1", port)) as extra:
            assert status_and_error(read_all(extra, time.monotonic() + 2))[0] == 429
        answers = [read_all(s, time.monotonic() + 4) for s in held]  # silent: 408 after 1 s, then closed
        assert [status_and_error(a)[0] for a in answers] == [408, 408]
        for s in held:
            s.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_the_body_deadline_holds_under_any_asgi_server(tmp_path):
    """BodyLimit alone (no guard: another ASGI server, or the TestClient) times the whole body, not each
    chunk: chunks 0.1 s apart under a 0.3 s timeout still end in a 408."""
    ledger = Ledger.open(str(tmp_path / "m.db"))
    try:
        ledger.ensure_operator(OP_TOKEN)
        token = ledger.add_agent("alice")
        app = create_app(ledger, limits=ConnectionLimits(read_timeout=0.3))
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "PUT",
            "scheme": "http",
            "path": "/rounds/1/report",
            "raw_path": b"/rounds/1/report",
            "query_string": b"",
            "root_path": "",
            "server": ("127.0.0.1", 80),
            "client": ("127.0.0.1", 1),
            "headers": [
                (b"authorization", f"Bearer {token}".encode()),
                (b"content-type", b"application/json"),
                (b"content-length", str(len(BODY)).encode()),
            ],
        }
        chunks = iter(BODY)
        sent = []

        async def trickle() -> dict:
            await asyncio.sleep(0.1)
            b = next(chunks, None)
            return {
                "type": "http.request",
                "body": bytes([b]) if b is not None else b"",
                "more_body": b is not None,
            }

        async def send(message: dict) -> None:
            sent.append(message)

        asyncio.run(asyncio.wait_for(app(scope, trickle, send), 10))
        assert sent[0]["status"] == 408 and b"body: not received within 0.3 s" in sent[1]["body"]
    finally:
        ledger.close()


def _big_rounds(srv, n: int = 30, size: int = 9_900) -> None:
    """n open rounds of a `size`-character question each: GET /rounds?limit=1000 would be n x size bytes."""
    with httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {OP_TOKEN}"}) as c:
        for i in range(n):
            r = c.post("/rounds", json={"question": f"q{i} " + "x" * size, "options": ["a", "b"]})
            assert r.status_code == 201, r.text


def _slow_reader(port: int, source: str, token: str) -> socket.socket:
    """A client that asks for a large listing and takes one byte of it (a small receive buffer: the kernel
    holds little of the answer for it)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.bind((source, 0))
    s.connect(("127.0.0.1", port))
    s.sendall(f"GET /rounds?limit=1000 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n".encode())
    assert s.recv(1)
    return s


def test_slow_readers_are_cut_off_at_the_write_deadline(market):
    """Issue 46 finding 3, at a small size: 10 clients from two addresses ask for a large listing and read
    one byte. Before: every connection was still held (its answer in the server's memory) long after; now
    each is aborted WRITE_TIMEOUT after the server stopped being able to write to it."""
    srv, _, token, _ = market
    _big_rounds(srv)
    readers = [_slow_reader(srv.port, f"127.0.0.{2 + i % 2}", token) for i in range(10)]
    try:
        t0 = time.monotonic()
        assert wait_until(lambda: not srv.server.server_state.connections, timeout=WRITE_TIMEOUT + 4)
        assert time.monotonic() - t0 < WRITE_TIMEOUT + 4
    finally:
        for s in readers:
            s.close()
    auth = {"Authorization": f"Bearer {token}"}
    assert httpx.get(f"{srv.url}/rounds?limit=1", headers=auth).status_code == 200  # others are served


def test_connections_in_all_are_capped(market):
    """IN_ALL idle connections from three addresses (each under PER_CLIENT): one more, from a fourth, gets
    503 with Retry-After and is closed at once."""
    srv, _, token, _ = market
    held = []
    try:
        for i in range(IN_ALL):
            s = socket.socket()
            s.bind((f"127.0.0.{2 + i % 3}", 0))
            s.connect(("127.0.0.1", srv.port))
            held.append(s)
        assert wait_until(lambda: len(srv.server.server_state.connections) >= IN_ALL, timeout=5)
        with socket.create_connection(("127.0.0.1", srv.port), source_address=("127.0.0.9", 0)) as extra:
            answer = read_all(extra, time.monotonic() + READ_TIMEOUT / 2)
        status, headers, error = status_and_error(answer)
        assert status == 503 and headers["retry-after"] == "1", answer
        assert error["error"] == f"connection: the server holds {IN_ALL} open connections (at most {IN_ALL})"
    finally:
        for s in held:
            s.close()


def test_a_listing_answers_within_its_byte_budget(market):
    """GET /rounds?limit=1000 over 30 rounds of 10 kB: pages of at most LIST_BUDGET bytes, which page on
    (after = the last id) to every round; /me/payouts likewise, cut between rounds."""
    from walla.market.api.routes import LIST_BUDGET

    srv, _, token, _ = market
    _big_rounds(srv)
    seen, after = [], 0
    with httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {token}"}) as c:
        while page := c.get("/rounds", params={"limit": 1000, "after": after}).raise_for_status():
            assert len(page.content) <= LIST_BUDGET, len(page.content)
            if not page.json():
                break
            seen += [r["id"] for r in page.json()]
            after = seen[-1]
    assert len(seen) == 31 and seen == sorted(seen)  # the fixture's round and the 30
