"""kill -9 the server during a burst of resolutions, restart it on the same database: every round is resolved
with all its payouts or not at all, and resolving everything again pays nothing twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import httpx
from market_fixtures import OP_TOKEN
from sqlalchemy import func, select
from walla.market import db
from walla.market.client import MarketClient, MarketError, wait_ready
from walla.market.keys import KEY_ENV
from walla.market.launch import TOKEN_ENV
from walla.market.ledger import Ledger
from walla.market.local import LocalServer, free_port

N_ROUNDS, N_AGENTS = 24, 3
SERVE = "from walla.market.cli._operator import app; app(prog_name='walla market')"
KILL_AFTER = 4  # acknowledged resolutions before the kill: the rest of the burst is in flight or queued


def _serve(database: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    # `walla market serve` from its own command group: the server a user starts, without the seconds the
    # root CLI spends importing the agent's extraction stack (tests/market/test_market_cli.py runs the root)
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE, "serve", "--db", database, "--port", str(port)],
        env={**os.environ, TOKEN_ENV: OP_TOKEN, KEY_ENV: "a market key for the fault test"},  # signed
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, timeout=60)
    return proc, url


def _audit(database: str) -> dict[int, str]:
    """Per round: 'paid' (resolution + one payout per report, totals agree) or 'none'; anything else fails."""
    ledger = Ledger.open(database)
    out = {}
    try:
        with ledger.engine.connect() as conn:
            for r in conn.execute(select(db.rounds)):
                n_rep = conn.execute(select(func.count()).where(db.reports.c.round_id == r.id)).scalar_one()
                pays = [
                    p.payout for p in conn.execute(select(db.payouts).where(db.payouts.c.round_id == r.id))
                ]
                res = conn.execute(select(db.resolutions).where(db.resolutions.c.round_id == r.id)).first()
                if res is None:
                    assert r.status != "resolved" and not pays, f"round {r.id}: payouts without a resolution"
                    out[r.id] = "none"
                    continue
                assert r.status == "resolved" and len(pays) == n_rep == res.n_reports, (
                    f"round {r.id}: partial"
                )
                assert abs(sum(pays) - res.total_payout) < 1e-12, f"round {r.id}: totals disagree"
                out[r.id] = "paid"
    finally:
        ledger.close()
    return out


def test_kill_during_resolutions(database):
    proc, url = _serve(database)
    op = MarketClient(url, OP_TOKEN)
    try:
        agents = [MarketClient(url, op.add_agent(f"a{i}")) for i in range(N_AGENTS)]
        rids = [op.open_round(f"q{t}", ["x", "y", "z"])["id"] for t in range(N_ROUNDS)]

        def submit_all(i: int, a: MarketClient) -> None:
            for t, rid in enumerate(rids):
                p = [(1 + (t + i) % 3) / 6, (1 + (t * i) % 2) / 6]
                a.submit(rid, [p[0], p[1], 1 - p[0] - p[1]], 0.1 + 0.2 * i)

        subs = [threading.Thread(target=submit_all, args=(i, a)) for i, a in enumerate(agents)]
        for th in subs:
            th.start()
        for th in subs:
            th.join()
        done: list[int] = []
        lock, enough = threading.Lock(), threading.Event()

        def worker(mine: list[int]) -> None:
            with MarketClient(url, OP_TOKEN, timeout=10) as c:
                for rid in mine:
                    try:
                        c.resolve(rid, label=rid % 3)
                    except (httpx.HTTPError, MarketError):
                        return  # the server died under us
                    with lock:
                        done.append(rid)
                        if len(done) >= KILL_AFTER:
                            enough.set()

        threads = [threading.Thread(target=worker, args=(rids[k::6],)) for k in range(6)]
        for th in threads:
            th.start()
        assert enough.wait(timeout=60)
        os.kill(proc.pid, signal.SIGKILL)  # mid-burst: requests in flight, transactions open
        proc.wait(timeout=10)
        for th in threads:
            th.join(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    state = _audit(database)
    paid = {rid for rid, s in state.items() if s == "paid"}
    assert set(done) <= paid, "a resolution acknowledged to the client was lost"
    assert 0 < len(paid) < N_ROUNDS, (
        f"the kill did not land during the burst ({len(paid)} of {N_ROUNDS} paid)"
    )
    ledger = Ledger.open(database)
    before = {a["name"]: a["balance"] for a in ledger.agents_overview()}
    ledger.close()

    # restart on the same database (in this process: the subprocess start is what we already tested) and
    # resolve every round again
    ledger = Ledger.open(database)
    try:
        with LocalServer(ledger) as srv, MarketClient(srv.url, OP_TOKEN) as op:
            again = {rid: op.resolve(rid, label=rid % 3) for rid in rids}
            after = {a["name"]: a["balance"] for a in op.agents()}
    finally:
        ledger.close()
    assert {rid for rid, r in again.items() if not r["resolved_now"]} == paid
    assert set(_audit(database).values()) == {"paid"}
    ledger = Ledger.open(database)
    counts = ledger.counts()
    ledger.close()
    assert counts["payouts"] == counts["reports"] == N_ROUNDS * N_AGENTS and counts["resolutions"] == N_ROUNDS
    # what was paid before the kill is still there, once: the balances grew only by the newly resolved rounds
    new = {
        f"a{i}": sum(again[rid]["payouts"][f"a{i}"] for rid in rids if rid not in paid)
        for i in range(N_AGENTS)
    }
    for name in after:
        assert abs(after[name] - before[name] - new[name]) < 1e-9, name
