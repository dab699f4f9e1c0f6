"""Helpers of the market tests: a PostgreSQL server of our own, the Market handle, ledger snapshots.

from market_fixtures import OP_TOKEN, snapshot      # pytest puts tests/market on sys.path
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field

from sqlalchemy import select, text
from walla.market import db
from walla.market.client import MarketClient
from walla.market.ledger import Ledger
from walla.market.local import LocalServer, free_port

OP_TOKEN = "operator-token-for-tests-0123456789"


def pg_bindir() -> str | None:
    """The directory of initdb/pg_ctl/postgres: pg_config's, the newest Debian one, or PATH's."""
    for cand in sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]), reverse=True
    ):
        if os.path.exists(os.path.join(cand, "initdb")):
            return cand
    initdb = shutil.which("initdb")
    return os.path.dirname(initdb) if initdb else None


def _as_user() -> list[str]:
    """Prefix that runs a command unprivileged when we are root (initdb and postgres refuse root)."""
    if os.geteuid() != 0:
        return []
    for user in ("postgres", "nobody"):
        try:
            pwd.getpwnam(user)
            return ["runuser", "-u", user, "--"]
        except KeyError:
            continue
    raise RuntimeError("running as root and no unprivileged user (postgres, nobody) to run PostgreSQL as")


@dataclass
class PgServer:
    bindir: str
    root: str
    port: int
    prefix: list[str] = field(default_factory=list)

    @property
    def admin_url(self) -> str:
        return f"postgresql://walla@127.0.0.1:{self.port}/postgres"

    def url(self, name: str) -> str:
        return f"postgresql://walla@127.0.0.1:{self.port}/{name}"

    def create_database(self) -> str:
        import psycopg  # optional: the market extra; only a PostgreSQL test gets here (conftest skips without it)

        name = "m_" + uuid.uuid4().hex[:12]
        with psycopg.connect(
            f"host=127.0.0.1 port={self.port} user=walla dbname=postgres", autocommit=True
        ) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        """Immediate shutdown without waiting for it (-W): the directory goes once postmaster.pid is gone."""
        data = f"{self.root}/data"
        subprocess.run(
            [*self.prefix, f"{self.bindir}/pg_ctl", "-D", data, "-m", "immediate", "-W", "stop"],
            capture_output=True,
            timeout=60,
        )
        wait_until(lambda: not os.path.exists(f"{self.root}/data/postmaster.pid"), timeout=5)
        shutil.rmtree(self.root, ignore_errors=True)


def start_postgres() -> PgServer:
    bindir = pg_bindir()
    if bindir is None:
        raise FileNotFoundError("no PostgreSQL server binaries (initdb) found; run `make setup-market`")
    prefix = _as_user()
    root = tempfile.mkdtemp(prefix="walla-pg-")
    if prefix:
        shutil.chown(root, user=prefix[2])
    port = free_port()
    run = lambda *cmd: subprocess.run([*prefix, *cmd], capture_output=True, text=True, timeout=120)  # noqa: E731
    r = run(f"{bindir}/initdb", "-D", f"{root}/data", "-U", "walla", "-A", "trust", "--no-sync", "-E", "UTF8")
    if r.returncode != 0:
        raise RuntimeError(f"initdb failed: {(r.stderr or r.stdout).strip().splitlines()[-1]}")
    opts = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
    r = run(f"{bindir}/pg_ctl", "-D", f"{root}/data", "-o", opts, "-l", f"{root}/log", "-w", "start")
    if r.returncode != 0:
        raise RuntimeError(f"pg_ctl start failed: {(r.stderr or r.stdout).strip().splitlines()[-1]}")
    return PgServer(bindir, root, port, prefix)


@dataclass
class Market:
    ledger: Ledger
    server: LocalServer
    op: MarketClient
    clients: list[MarketClient] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.server.url

    def client(self, token: str) -> MarketClient:
        c = MarketClient(self.url, token)
        self.clients.append(c)
        return c

    def agent(self, name: str) -> MarketClient:
        return self.client(self.op.add_agent(name))


def wait_until(cond, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


def snapshot(ledger: Ledger) -> dict:
    """Every row of every ledger table (to show a refused request wrote nothing)."""
    with ledger.engine.connect() as conn:
        return {t.name: sorted(map(tuple, conn.execute(select(t)))) for t in db.metadata.sorted_tables}


def reset_ledger(ledger: Ledger) -> None:
    """Delete every row of every ledger table and restart the ids: an empty ledger, as a fresh one is."""
    tables = db.metadata.sorted_tables
    with ledger.engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text(f"TRUNCATE {', '.join(t.name for t in tables)} RESTART IDENTITY CASCADE"))
        else:  # SQLite: ids restart from max(id) + 1 (no AUTOINCREMENT), i.e. from 1
            for t in reversed(tables):
                conn.execute(t.delete())
    ledger._head = (
        None  # the event chain's last link this process keeps (ledger/__init__.py): the log is gone
    )
    ledger.token_cache.invalidate()  # and the tokens it has seen
    ledger.key = None  # a fresh ledger is unsigned until sign_with (ledger/chain.py)
