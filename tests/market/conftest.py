"""Market fixtures: a live server on a free loopback port over a fresh ledger, on SQLite and on PostgreSQL.

    def test_x(market):              # parametrized: sqlite, postgresql
        alice = market.agent("alice")            # a MarketClient with alice's token
        rid = market.op.open_round("Q?", ["a", "b"])["id"]

One server per test module and database; each test starts from an emptied ledger (reset_ledger: every
row deleted, ids restarted, the operator re-created), which is what a fresh ledger is.

PostgreSQL: a real server started once per session from the distribution's binaries (initdb + pg_ctl on a
temporary directory and a free port; as root they run as the `postgres` or `nobody` user, initdb refuses
root); each test gets its own database. Skipped with the reason printed when no server binaries exist
(`make setup-market` installs them: apt-get install postgresql).
"""

from __future__ import annotations

import subprocess

import pytest

pytest.importorskip("fastapi", reason="the market needs the market extra: pip install 'walla[market]'")

from market_fixtures import OP_TOKEN, Market, reset_ledger, start_postgres  # noqa: E402
from trained_market import train_tiny_market  # noqa: E402
from walla.market.client import MarketClient  # noqa: E402
from walla.market.ledger import Ledger  # noqa: E402
from walla.market.local import LocalServer  # noqa: E402


@pytest.fixture(scope="session")
def pg_server():
    pytest.importorskip("psycopg", reason="PostgreSQL tests need psycopg (the market extra)")
    try:
        server = start_postgres()
    except (FileNotFoundError, RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        print(f"\nwalla market: PostgreSQL tests skipped: {e}")
        pytest.skip(f"PostgreSQL unavailable: {e}")
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request, tmp_path) -> str:
    """A fresh, empty ledger database: a SQLite file, or a new database on the session's PostgreSQL."""
    if request.param == "sqlite":
        return str(tmp_path / "market.db")
    return request.getfixturevalue("pg_server").create_database()


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def live_market(request, tmp_path_factory):
    """One ledger and one live server per test module and database (a server start is ~0.2 s, ~40 tests)."""
    if request.param == "sqlite":
        database = str(tmp_path_factory.mktemp("market") / "market.db")
    else:
        database = request.getfixturevalue("pg_server").create_database()
    ledger = Ledger.open(database)
    server = LocalServer(ledger).start()
    yield ledger, server
    server.stop()
    ledger.close()


@pytest.fixture
def market(live_market):
    """The module's live market, emptied for this test: no rounds, no agents but the operator."""
    ledger, server = live_market
    reset_ledger(ledger)
    ledger.ensure_operator(OP_TOKEN)
    m = Market(ledger, server, MarketClient(server.url, OP_TOKEN))
    try:
        yield m
    finally:
        for c in [m.op, *m.clients]:
            c.close()


@pytest.fixture(scope="session")
def trained(tmp_path_factory) -> dict:
    """A tiny trained market (trained_market.py): its model, store, runs and scenario name."""
    return train_tiny_market(tmp_path_factory.mktemp("market-replay"))
