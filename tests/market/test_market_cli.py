"""`walla market` under the `walla` root (with `walla check`); `walla market init/add-agent` work."""

from __future__ import annotations

import os
import stat

import pytest
import typer
from market_fixtures import snapshot
from walla.cli.lazy import run
from walla.cli.main import app as walla_app
from walla.market.cli import run_market
from walla.market.launch import TOKEN_ENV
from walla.market.ledger import Ledger


def test_walla_root_keeps_check(capfd):
    """In-process: the root's entry points and light --help are tests/cli's."""
    assert run(walla_app, ["--help"], "walla") == 0
    out, _ = capfd.readouterr()
    assert "check" in out and "market" in out
    assert run(walla_app, ["check", "--help"], "walla") == 0
    out, _ = capfd.readouterr()
    assert "--model" in out and "--backends" in out
    assert run(walla_app, ["check"], "walla") == 2  # the usage error for the missing required --model
    _, err = capfd.readouterr()
    assert "--model" in err and len(err.strip().splitlines()) == 1, err
    assert run(walla_app, ["market", "--help"], "walla") == 0
    out, _ = capfd.readouterr()
    assert "serve" in out and "replay" in out and "agent" in out


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


def test_agent_named_operator_before_init(tmp_path, capfd, monkeypatch):
    """Issue 29, finding 6: `add-agent operator` before `init` registered it (rc 0) and the ledger could then
    never get an operator; now the name is reserved (case-folded), one line, exit 1, and init still works."""
    db = str(tmp_path / "m.db")
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert run_market(["add-agent", "operator", "--db", db], "walla market") == 1
    err = capfd.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "reserved" in err and "Traceback" not in err
    assert run_market(["init", "--db", db], "walla market") == 0
    assert "operator token (shown once" in capfd.readouterr().out


def test_sqlite_file_is_private(tmp_path, monkeypatch):
    """Issue 29, finding 7: the ledger (money, token hashes) is created 0600, not 0644."""
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    db = tmp_path / "m.db"
    assert run_market(["init", "--db", str(db)], "walla market") == 0
    assert stat.S_IMODE(os.stat(db).st_mode) == 0o600


def test_agent_token_sources(tmp_path, monkeypatch, capfd):
    """Issue 29, finding 7: the agent's token from a file or the environment, not only the command line."""
    from walla.market.cli import agent_token
    from walla.market.cli._agent import TOKEN_ENV as AGENT_ENV

    monkeypatch.delenv(AGENT_ENV, raising=False)
    (tmp_path / "tok").write_text("wm_from-file\n")
    assert agent_token(None, tmp_path / "tok") == "wm_from-file"
    monkeypatch.setenv(AGENT_ENV, "wm_from-env")
    assert agent_token(None, None) == "wm_from-env"
    assert agent_token("wm_flag", None) == "wm_flag"
    monkeypatch.delenv(AGENT_ENV)
    with pytest.raises(typer.Exit):
        agent_token(None, None)
    with pytest.raises(typer.Exit):
        agent_token(None, tmp_path / "missing")
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 2 and AGENT_ENV in err[0] and "--token-file" in err[1]


def test_ledger_of_an_older_walla_is_refused(tmp_path, capfd, monkeypatch):
    """A ledger whose tables lack this version's columns is one line and exit 1, not 500s later."""
    import sqlite3

    db = tmp_path / "old.db"
    with sqlite3.connect(db) as c:
        c.execute("CREATE TABLE rounds (id INTEGER PRIMARY KEY, question TEXT)")
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert run_market(["init", "--db", str(db)], "walla market") == 1
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "older walla" in err[0] and "table rounds lacks column" in err[0], err
