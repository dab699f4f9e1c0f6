"""The market's ledger: every agent, round, report, resolution and payout, in one database (db.py).

    ledger = Ledger.open("market.db")                       # or a postgresql:// URL
    token = ledger.add_agent("alice")                        # printed once; only its sha256 is stored
    rid = ledger.open_round("Is it red?", ["yes", "no"], RoundSettings())["id"]
    ledger.submit_report(rid, agent_id, [0.8, 0.2], 0.3)     # replaces the agent's report until close
    ledger.resolve(rid, label=0, target=[1.0, 0.0])          # pays once, in one transaction

Invariants (each enforced by one transaction and a uniqueness constraint, not by the caller's care):
    * one current report per (round, agent); a report is accepted only while its round is open
      (status open and before close_at) -- checked inside the transaction that writes it;
    * a resolution is one transaction: resolution row + every payout row + the round's status, or
      nothing. Retrying with the same answer returns the recorded result and pays nothing; another
      answer is refused (409). resolutions.round_id is the primary key, so two racing resolvers cannot
      both commit;
    * a round's total net payout (the market's deficit for it) is recorded with its bound c2^2/c3.
Concurrency: writers start with BEGIN IMMEDIATE on SQLite (one writer at a time, readers never blocked);
on PostgreSQL the round's row is locked FOR UPDATE to resolve/close and FOR SHARE to submit, so a report
can never slip in after the resolution read the reports, and the agent's row FOR UPDATE to submit, so its
reports' limit checks (the floor) run one at a time, each seeing the one before (reports.agent_lock).

The Ledger class holds the connection, the transaction loop and the event chain's last link; its methods
are plain functions of the modules along the ledger's seams, bound below:
    accounts.py     agents, the operator, tokens (add, revoke, rotate, authenticate), balances and payouts
    rounds.py       open, read, list and close rounds
    reports.py      submit a report (limits and floor), read and pool the reports; a closed round with its
                    reports in one transaction (walla serve's forecasts)
    resolution.py   resolve, correct or void a round: the resolutions entry, its payout rows and event
    tokens.py       the cache of tokens found valid, which a revoke or rotation empties after its commit
    chain.py        the chain's own events: the key that signs them (key_set, key_rotated), head lines
    common.py       the shared constants, Principal, token hashing, row helpers
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, func, select
from sqlalchemy.exc import DataError, IntegrityError, OperationalError
from walla.market import db, events
from walla.market.ledger import accounts, chain, reports, resolution, rounds
from walla.market.ledger.common import (
    AGENT,
    AUTH_TTL_S,
    CALLER,
    OPEN_STATES,
    OPERATOR,
    OPERATOR_ONLY,
    RETRIES,
    ROUND_STAMP,
    SAME_ANSWER_ATOL,
    LedgerInvariantError,
    Principal,
    check_finite,
    hash_token,
    ids_used_up,
    new_token,
    walla_version,
)
from walla.market.ledger.tokens import TokenCache

# PostgreSQL's SQLSTATEs of an id past its integer column: a sequence at its maximum (a serial column's is
# 2^31 - 1), a value past the column's type
IDS_USED_UP = ("2200H", "22003")


def _table_of(e: DataError) -> str:
    """'round' of a failed 'INSERT INTO rounds ...' (the row kind an error names)."""
    m = re.match(r"\s*INSERT INTO (\w+)", str(e.statement or ""), re.IGNORECASE)
    return m.group(1).removesuffix("s") if m else "row"


__all__ = [
    "AGENT",
    "AUTH_TTL_S",
    "CALLER",
    "OPEN_STATES",
    "OPERATOR",
    "OPERATOR_ONLY",
    "RETRIES",
    "ROUND_STAMP",
    "SAME_ANSWER_ATOL",
    "Ledger",
    "LedgerInvariantError",
    "Principal",
    "check_finite",
    "hash_token",
    "new_token",
    "walla_version",
]


class Ledger:
    """All reads and writes of the market's database; raises ClientError for what a client got wrong."""

    def __init__(self, engine: Engine, clock: Callable[[], float] = time.time) -> None:
        self.engine = engine
        self.writer = engine.execution_options(**db.WRITE)
        self.clock = clock
        self.version = walla_version()
        # SQLite has one writer at a time and makes waiters poll (sleeps of up to 100 ms: p99 spikes of ~1 s
        # under 16 concurrent writers); queueing this process's writers on a lock instead keeps waits short.
        # Other processes (the CLI) still meet SQLite's busy timeout. PostgreSQL: row locks, no queue.
        sqlite = engine.dialect.name == "sqlite"
        self._queue = threading.Lock() if sqlite else contextlib.nullcontext()
        # SQLite: this process's writers run one at a time (the lock above), so the event chain's last link
        # is kept here and an append is one INSERT; another process's append makes it stale, and the insert
        # then fails on the events' primary key and the transaction is retried with the link read afresh.
        self._sqlite = sqlite
        self.token_cache = TokenCache()  # the tokens authenticate found valid (tokens.py)
        self.key: bytes | None = None  # signs every event appended (chain.sign_with sets it); None: unsigned
        self._head: tuple[int, str] | None = None
        self._pending: tuple[int, str] | None = None

    @classmethod
    def open(cls, database: str | Path) -> Ledger:
        return cls(db.make_engine(database))

    def close(self) -> None:
        self.engine.dispose()

    def transaction(self, fn: Callable[[Connection], Any]) -> Any:
        """fn(conn) in one write transaction, retried when it lost a race to another writer: the one way the
        ledger's modules (accounts, rounds, reports, resolution, chain) write."""
        for attempt in range(RETRIES):
            try:
                with self._queue:
                    self._pending = None
                    try:
                        with self.writer.begin() as conn:
                            out = fn(conn)
                    except DataError as e:  # PostgreSQL: a sequence past its integer column
                        if getattr(e.orig, "sqlstate", None) in IDS_USED_UP:
                            raise ids_used_up(_table_of(e)) from None
                        raise
                    except (IntegrityError, OperationalError):
                        self._head = None  # maybe a stale link (another process appended): read it again
                        raise
                    if self._pending is not None:
                        self._head = self._pending
                    return out
            except (IntegrityError, OperationalError):
                if attempt == RETRIES - 1:
                    raise
                time.sleep(0.01 * (attempt + 1))
        raise AssertionError("unreachable")

    def append_event(self, conn: Connection, kind: str, at: float, key: bytes | None = None, **kw) -> None:
        """Append one event to the hash chain inside the caller's write transaction (events.py), signed with
        `key` (a rotation's old key), else the ledger's key when it has one."""
        head = (self._pending or self._head) if self._sqlite else None
        link = events.append(conn, kind, at, head=head, key=key or self.key, **kw)
        if self._sqlite:
            self._pending = link

    def counts(self) -> dict[str, int]:
        """Row counts of every table (audits and the load test)."""
        with self.engine.connect() as conn:
            return {
                t.name: int(conn.execute(select(func.count()).select_from(t)).scalar_one())
                for t in db.metadata.sorted_tables
            }

    # agents, the operator and tokens (accounts.py)
    add_agent = accounts.add_agent
    ensure_operator = accounts.ensure_operator
    revoke = accounts.revoke
    rotate = accounts.rotate
    authenticate = accounts.authenticate
    cached_principal = accounts.cached_principal
    recently_refused = accounts.recently_refused
    agent_summary = accounts.agent_summary
    agent_payouts = accounts.agent_payouts
    agents_overview = accounts.agents_overview
    # rounds (rounds.py)
    open_round = rounds.open_round
    get_round = rounds.get_round
    round_options = rounds.round_options
    list_rounds = rounds.list_rounds
    close_round = rounds.close_round
    is_resolved = rounds.is_resolved
    # reports (reports.py)
    submit_report = reports.submit_report
    record_closed_round = reports.record_closed_round
    report_history = reports.report_history
    get_report = reports.get_report
    round_reports = reports.round_reports
    pooled = reports.pooled
    # the chain's key and heads (chain.py)
    signing = chain.signing
    sign_with = chain.sign_with
    record_head = chain.record_head
    # resolution and payouts (resolution.py)
    resolve = resolution.resolve
    correct = resolution.correct
    void = resolution.void
