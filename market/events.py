"""The ledger's event log: every write appends one entry, in the same transaction, hash-chained to the last.

    append(conn, "report", at, round_id=3, agent_id=2, data={...})   # inside the writing transaction
    problem = first_break(rows)                                          # None when the chain is whole

hash_n = sha256(hash_{n-1} + canonical JSON of (id, at, kind, round_id, agent_id, data)), hash_0 = GENESIS.
Canonical JSON: sorted keys, no spaces, floats as Python's repr (exact round trip), so the audit recomputes
every hash from the stored columns. Writers serialize on the one `chain_head` row (SELECT ... FOR UPDATE
on PostgreSQL; SQLite has one writer at a time), so the chain never forks; an edited, deleted or inserted
event breaks it at that row.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from sqlalchemy import Connection, insert, select, update
from walla.market import db

GENESIS = "0" * 64


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def link(prev_hash: str, eid: int, at: float, kind: str, round_id, agent_id, data: str) -> str:
    body = canonical([eid, at, kind, round_id, agent_id, data])
    return hashlib.sha256((prev_hash + body).encode("utf-8")).hexdigest()


def append(
    conn: Connection,
    kind: str,
    at: float,
    round_id: int | None = None,
    agent_id: int | None = None,
    data: dict | None = None,
) -> str:
    """Append one event after the chain's head (locked until the transaction ends); returns its hash."""
    head = conn.execute(select(db.chain_head).where(db.chain_head.c.id == 1).with_for_update()).first()
    if head is None:
        conn.execute(insert(db.chain_head).values(id=1, last_id=0, last_hash=GENESIS))
        last_id, last_hash = 0, GENESIS
    else:
        last_id, last_hash = head.last_id, head.last_hash
    eid, text = last_id + 1, canonical(data or {})
    h = link(last_hash, eid, at, kind, round_id, agent_id, text)
    conn.execute(
        insert(db.events).values(
            id=eid,
            at=at,
            kind=kind,
            round_id=round_id,
            agent_id=agent_id,
            data=text,
            prev_hash=last_hash,
            hash=h,
        )
    )
    conn.execute(update(db.chain_head).where(db.chain_head.c.id == 1).values(last_id=eid, last_hash=h))
    return h


def first_break(rows: list, head=None) -> str | None:
    """The first event (in id order) whose link does not verify, as one line; None when the chain is whole."""
    prev = GENESIS
    for i, r in enumerate(rows, start=1):
        if r.id != i:
            return f"events: row id {r.id} where {i} was expected (an event was deleted or inserted)"
        if r.prev_hash != prev:
            return f"events: row {r.id} ({r.kind}) prev_hash does not match row {r.id - 1}'s hash"
        if link(prev, r.id, r.at, r.kind, r.round_id, r.agent_id, r.data) != r.hash:
            return f"events: row {r.id} ({r.kind}) hash does not match its contents (edited)"
        prev = r.hash
    if head is not None and (head.last_id != len(rows) or head.last_hash != prev):
        return f"events: chain_head says {head.last_id} events, the log ends at {len(rows)} (truncated)"
    return None
