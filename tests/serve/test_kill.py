"""kill -9 of `walla serve` during a burst of forecasts and outcomes never leaves a half-written round: the
ledger audits OK, and after a restart every served round holds all its agents' reports or is void."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import httpx
import pytest
from serve_fixtures import OP_TOKEN, wait_answering
from walla.cli.lazy import run
from walla.cli.main import app as root
from walla.market.ledger import Ledger
from walla.market.local import free_port

KILL_AFTER = 6  # acknowledged forecasts before the kill: the rest of the burst is in flight
THREADS = 6


def _start(tiny_pool: dict, db: str, port: int) -> subprocess.Popen:
    args = ["serve", "--runs", str(tiny_pool["runs"]), "--scenario", tiny_pool["scenario"]]
    args += ["--store", str(tiny_pool["store"]), "--db", db, "--port", str(port), "--open"]
    env = {
        **os.environ,
        "WALLA_MARKET_OPERATOR_TOKEN": OP_TOKEN,
        "WALLA_MARKET_KEY": "a key for the kill test",
    }
    code = "import sys; from walla.cli.main import main; sys.argv[0] = 'walla'; main()"
    return subprocess.Popen([sys.executable, "-c", code, *args], env=env, stderr=subprocess.DEVNULL)


def _audit(db: str) -> int:
    return run(root, ["market", "audit", "--db", db], "walla")


@pytest.mark.heavy
def test_kill_9_mid_burst_leaves_no_half_round(tiny_pool, tmp_path):
    db, port = str(tmp_path / "serve.db"), free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _start(tiny_pool, db, port)
    acked, stop = [], threading.Event()
    try:
        wait_answering(url, 300, proc)

        def burst(t: int) -> None:
            with httpx.Client(base_url=url, timeout=30) as c:
                i = 0
                while not stop.is_set():
                    i += 1
                    q = {
                        "question": f"Box {t} holds pens {i}. Does box {t} hold cups?",
                        "options": ["Yes", "No"],
                    }
                    try:
                        rid = c.post("/v1/forecast", json=q).json()["round"]
                        acked.append(rid)
                        c.post(
                            "/v1/outcomes",
                            json={"round": rid, "label": i % 2},
                            headers={"Authorization": f"Bearer {OP_TOKEN}"},
                        )
                    except (httpx.HTTPError, KeyError, ValueError):
                        return

        threads = [threading.Thread(target=burst, args=(t,)) for t in range(THREADS)]
        for t in threads:
            t.start()
        while len(acked) < KILL_AFTER and proc.poll() is None:
            threading.Event().wait(0.02)
        os.kill(proc.pid, signal.SIGKILL)  # mid-burst: requests in flight, rounds half-reported
        proc.wait(30)
        stop.set()
        for t in threads:
            t.join(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert len(acked) >= KILL_AFTER
    assert _audit(db) == 0
    proc = _start(tiny_pool, db, port)
    try:
        wait_answering(url, 300, proc)
        r = httpx.post(
            url + "/v1/forecast",
            json={"question": "Box 1 holds keys. Does box 1 hold keys?", "options": ["Yes", "No"]},
        )
        assert r.status_code == 200, r.text
        paid = httpx.post(
            url + "/v1/outcomes",
            json={"round": r.json()["round"], "label": 0},
            headers={"Authorization": f"Bearer {OP_TOKEN}"},
        )
        assert paid.status_code == 200, paid.text
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    ledger = Ledger.open(db)
    try:
        rounds = ledger.list_rounds(limit=1000)
        assert len(rounds) > KILL_AFTER
        for rnd in rounds:  # whole (every agent's report) or void, never half
            assert rnd["status"] == "void" or (
                rnd["status"] in ("closed", "resolved") and rnd["n_reports"] == 3
            ), rnd
    finally:
        ledger.close()
    assert _audit(db) == 0
