"""Audit a ledger end to end: it proves the tables' state from the hash-chained event log, and the log
against the heads the operator recorded, so neither an edited row nor a rewritten chain passes.

    engine = open_readonly("market.db")          # never writes, never creates a table
    problem, summary = audit(engine, read_heads(Path("m.heads")), read_keys(None), "m.heads")  # audit/heads.py

Checked, in this order (the first failure is reported, as one line naming the table, row and column):
    values   every stored value has its column's type, and JSON columns their shape (audit/values.py)
    events   the hash chain links (events.first_break): no event edited, deleted or inserted in place
    MACs     from the ledger's key_set event on, every event has a MAC, and with the key each verifies
             (events.first_unsigned): no event appended or rewritten by someone without the key
    heads    every recorded head `ID HASH [HMAC]` is the chain's event ID: a chain rewritten (hashes
             recomputed after an edit, a deletion, a renumbering or a reordering) is caught up to the last
             head recorded; with a key, each head line's HMAC-SHA256 (chained to the line before) verifies;
             heads only move forward, and the file holds the last line the ledger noted (not cut, not gone)
    state    the event log replayed (audit_replay.rebuild: payouts recomputed with the mechanism from the
             replayed reports and the settings each round's opening event recorded) equals every row of
             agents, rounds, reports, resolutions and payouts, field by field (audit_replay.compare)

The chain's hashes have no key: whoever can write the database can recompute every one. What anchors it is
the key, held outside the database by the server that signs each event and by the audit, and the head file,
kept off the database's machine (or append-only): a server with --head-file and `walla market audit --head
FILE` append the current head to it (docs/market.md); the head file is read and checked by audit/heads.py.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from sqlalchemy import Engine, create_engine, event, inspect
from walla.market import db, events
from walla.market.audit._heads import check_heads
from walla.market.audit._rebuild import Mismatch, compare, rebuild
from walla.market.audit._values import read_rows


def open_readonly(database: str | Path) -> Engine:
    """An engine that can only read the ledger at `database`: SQLite opened with mode=ro (no file created, no
    journal mode changed), PostgreSQL with default_transaction_read_only. Each audit reads one snapshot.

    Raises:
        FileNotFoundError: a SQLite path that is not a file.
    """
    url = db.database_url(database)
    if not url.startswith("sqlite"):
        ro = {"options": "-c default_transaction_read_only=on"}
        return create_engine(url, connect_args=ro, isolation_level="REPEATABLE READ")
    path = Path(url.split(":///", 1)[1])
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such ledger file")
    uri = f"{path.as_uri()}?mode=ro"
    engine = create_engine(
        "sqlite://", creator=lambda: sqlite3.connect(uri, uri=True, check_same_thread=False)
    )

    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn, _record) -> None:
        dbapi_conn.isolation_level = None  # BEGIN below: every table read in one snapshot
        dbapi_conn.execute("PRAGMA query_only=ON")

    @event.listens_for(engine, "begin")
    def _begin(conn) -> None:
        conn.exec_driver_sql("BEGIN")

    return engine


def not_a_ledger(engine: Engine) -> str | None:
    """Why the database is not a walla market ledger (a missing table or column), None when it is one."""
    found = inspect(engine)
    tables = set(found.get_table_names())
    for table in db.metadata.sorted_tables:
        if table.name not in tables:
            return f"no table {table.name}"
        have = {c["name"] for c in found.get_columns(table.name)}
        missing = [
            c.name
            for c in table.columns
            if c.name not in have and (table.name, c.name) not in db.LATER_COLUMNS
        ]
        if missing:
            return (
                f"table {table.name} has no column {missing[0]} (made by another program, or an older walla)"
            )
    return None


SERVED_SOURCE = "walla serve "  # the `source` of a round walla serve opened (serve/forecast.py SOURCE)


def open_served(rounds: list) -> list[int]:
    """The ids of rounds `walla serve` opened that are still open. A served round is closed in the request that
    opened it, so an open one was cut short (a kill, a database fault) and holds only some reports: the
    server voids its own when it starts again or its database returns."""
    return [int(r.id) for r in rounds if r.status == "open" and str(r.source or "").startswith(SERVED_SOURCE)]


def audit(
    source,
    heads: list | None = None,
    keys: list[bytes] | None = None,
    head_source: str | None = None,
    new_head_file: bool = False,
) -> tuple[str | None, dict]:
    """(the first problem as one line, or None; counts, the largest payout difference, the chain's head and
    what anchored it: `signed_from`, `checked` (MACs verified), `anchored` (a head file checked)).

    `source`: a Ledger or an Engine (open_readonly); `keys`: the market's keys (keys.read_keys), which verify
    the events' MACs and the head lines; `head_source`: the --head file, `heads` its records (read_heads;
    None when it does not exist, which `new_head_file` allows).
    """
    keys = list(keys or [])
    engine = getattr(source, "engine", source)
    with engine.connect() as conn:
        rows, problem = read_rows(conn)
    last = rows["events"][-1] if rows["events"] else None
    summary = {
        "events": len(rows["events"]),
        "payouts": len(rows["payouts"]),
        "rounds": len(rows["rounds"]),
        "max_diff": 0.0,
        "head": (last.id, last.hash) if last is not None else (0, events.GENESIS),
        "anchored": head_source is not None,
        "open_served": open_served(rows["rounds"]),
    }
    problem = problem or events.first_break(rows["events"])
    if problem is None:
        problem, signed = events.first_unsigned(rows["events"], keys)
        summary.update(signed)
    if problem is None and head_source is not None:
        problem = check_heads(rows["events"], heads, keys, head_source, new_head_file)
    if problem is not None:
        return problem, summary
    try:
        state = rebuild(rows["events"])
    except Mismatch as e:
        return str(e), summary
    summary["max_diff"] = state.max_diff
    return compare(rows, state), summary
