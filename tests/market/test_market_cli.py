"""`walla market` under the `walla` root (with `walla check`); `walla market init/add-agent` work."""

from __future__ import annotations

from market_fixtures import snapshot
from walla.cli.lazy import run
from walla.cli.main import app as walla_app
from walla.market.cli import run_market
from walla.market.cli_operator import TOKEN_ENV
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
