"""Market fixtures: a live server on a free loopback port over a fresh ledger, on SQLite and on PostgreSQL.

    def test_x(market):              # parametrized: sqlite, postgresql
        alice = market.agent("alice")            # a MarketClient with alice's token
        rid = market.op.open_round("Q?", ["a", "b"])["id"]

PostgreSQL: a real server started once per session from the distribution's binaries (initdb + pg_ctl on a
temporary directory and a free port; as root they run as the `postgres` or `nobody` user, initdb refuses
root); each test gets its own database. Skipped with the reason printed when no server binaries exist
(`make setup-market` installs them: apt-get install postgresql).
"""

from __future__ import annotations

import subprocess

import pytest

pytest.importorskip("fastapi", reason="the market needs the market extra: pip install 'walla[market]'")

from market_fixtures import OP_TOKEN, Market, start_postgres  # noqa: E402
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


@pytest.fixture
def market(database):
    ledger = Ledger.open(database)
    ledger.ensure_operator(OP_TOKEN)
    server = LocalServer(ledger).start()
    m = Market(ledger, server, MarketClient(server.url, OP_TOKEN))
    try:
        yield m
    finally:
        for c in [m.op, *m.clients]:
            c.close()
        server.stop()
        ledger.close()


@pytest.fixture(scope="session")
def trained(tmp_path_factory) -> dict:
    """A tiny trained market (trained_market.py): its model, store, runs and scenario name."""
    return train_tiny_market(tmp_path_factory.mktemp("market-replay"))
