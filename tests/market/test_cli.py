"""`walla` is one root for `walla check` (unchanged) and `walla market`; `walla market init/add-agent` work."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from market_fixtures import snapshot
from walla.market.cli import run_market
from walla.market.cli_operator import TOKEN_ENV
from walla.market.ledger import Ledger

WALLA = str(Path(sys.executable).with_name("walla"))


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([WALLA, *args], capture_output=True, text=True, timeout=120)


def test_walla_root_keeps_check():
    top = _run("--help")
    assert top.returncode == 0 and "check" in top.stdout and "market" in top.stdout
    check = _run("check", "--help")
    assert check.returncode == 0 and "--model" in check.stdout and "--backends" in check.stdout
    missing = _run("check")  # click's usage error for the missing required --model, as before
    assert missing.returncode == 2 and "--model" in missing.stderr
    market = _run("market", "--help")
    assert market.returncode == 0 and "serve" in market.stdout and "replay" in market.stdout


def test_init_and_add_agent(tmp_path, capfd, monkeypatch):
    db = str(tmp_path / "m.db")
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert run_market(["init", "--db", db], "walla market") == 0
    out = capfd.readouterr().out
    token = out.split("operator token (shown once, store it): ")[1].split()[0]
    assert run_market(["init", "--db", db], "walla market") == 0  # again: the operator exists, no new token
    assert "operator token" not in capfd.readouterr().out
    assert run_market(["add-agent", "alice", "--db", db], "walla market") == 0
    agent_token = capfd.readouterr().out.strip().split()[-1]
    ledger = Ledger.open(db)
    try:
        assert ledger.authenticate(token).is_operator
        assert ledger.authenticate(agent_token).name == "alice"
        before = snapshot(ledger)
        monkeypatch.setenv(
            TOKEN_ENV, "a-chosen-operator-token-123"
        )  # the env var replaces the operator's token
        assert run_market(["init", "--db", db], "walla market") == 0
        assert (
            ledger.authenticate(token) is None
            and ledger.authenticate("a-chosen-operator-token-123").is_operator
        )
        assert (
            snapshot(ledger)["agents"] != before["agents"] and snapshot(ledger)["rounds"] == before["rounds"]
        )
    finally:
        ledger.close()
