"""The ledger's event log: every write appends one entry, in the same transaction, hash-chained to the last.

    append(conn, "report", at, round_id=3, agent_id=2, data={...})   # inside the writing transaction
    problem = first_break(rows)                                          # None when the chain is whole

hash_n = sha256(hash_{n-1} + canonical JSON of (id, at, kind, round_id, agent_id, data)), hash_0 = GENESIS.
Canonical JSON: sorted keys, no spaces, floats as Python's repr (exact round trip), so the audit recomputes
every hash from the stored columns. The id is the primary key and written explicitly (last + 1), so two
writers that read the same last link cannot both append: one insert fails and its transaction is retried.
Appends queue on a PostgreSQL advisory lock; SQLite has one writer at a time, and the ledger keeps the
last link in memory there (one INSERT per event). An edited, deleted or inserted event breaks the chain at
that row. The chain itself has no key: rewriting it whole (every hash recomputed) is caught by the MACs and
the heads the operator records outside the database, and the audit replays the log against every table
(audit/prove.py).

MACs: a server holding the market's key (_keys.py) stores mac = HMAC(key, hash) with every event it writes,
so an event written by anyone without the key (an insert, or a chain rewritten after an edit) does not
verify. Signing starts with a `key_set` event (data: the key's id and `unsigned_through`, the events written
before it without a MAC); a `key_rotated` event, signed by the old key, names the key that signs from the
next event on; `head_recorded` notes a head line a server wrote to its head file (ledger/chain.py).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from sqlalchemy import Connection, insert, select, text
from walla.market import db
from walla.market.keys import event_mac, key_id, verifies

GENESIS = "0" * 64
LOCK_KEY = 0x77616C6C61  # PostgreSQL advisory lock of the chain ("walla")
INSERT = insert(db.events)  # built once: executed with a parameter dict (no per-call .values() compile)


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def link(prev_hash: str, eid: int, at: float, kind: str, round_id, agent_id, data: str) -> str:
    body = canonical([eid, at, kind, round_id, agent_id, data])
    return hashlib.sha256((prev_hash + body).encode("utf-8")).hexdigest()


def last_link(conn: Connection) -> tuple[int, str]:
    """(id, hash) of the chain's last event, (0, GENESIS) when empty. On PostgreSQL, first a transaction-scoped
    advisory lock: appends queue behind each other (READ COMMITTED would let two read the same last link)."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": LOCK_KEY})
    e = db.events.c
    row = conn.execute(select(e.id, e.hash).order_by(e.id.desc()).limit(1)).first()
    return (0, GENESIS) if row is None else (row.id, row.hash)


def append(
    conn: Connection,
    kind: str,
    at: float,
    round_id: int | None = None,
    agent_id: int | None = None,
    data: dict | None = None,
    head: tuple[int, str] | None = None,
    key: bytes | None = None,
) -> tuple[int, str]:
    """Append one event after `head` (the last link; read with last_link when None); returns the new link.
    With `key`, the event carries its MAC under that key (keys.event_mac).

    A stale `head` (another writer appended meanwhile) makes the insert fail on the events' primary key
    (IntegrityError): the caller's transaction is rolled back and retried with a fresh head.
    """
    last_id, last_hash = head if head is not None else last_link(conn)
    eid, body = last_id + 1, canonical(data or {})
    h = link(last_hash, eid, at, kind, round_id, agent_id, body)
    row = {"id": eid, "at": at, "kind": kind, "round_id": round_id, "agent_id": agent_id, "data": body}
    mac = event_mac(key, h) if key is not None else None
    conn.execute(INSERT, {**row, "prev_hash": last_hash, "hash": h, "mac": mac})
    return eid, h


def first_break(rows: list) -> str | None:
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
    return None


KEY_KINDS = ("key_set", "key_rotated")  # the events that say which key signs


def key_events(data: str, kind: str, eid: int) -> tuple[str, int | None]:
    """(the key id a key event names, its unsigned_through); ValueError naming the row when malformed."""
    d = json.loads(data)
    kid, through = d.get("key_id"), d.get("unsigned_through")
    if not isinstance(kid, str) or (kind == "key_set" and type(through) is not int):
        raise ValueError(f"events: row {eid} ({kind}) data does not name a key_id and unsigned_through")
    return kid, through


def first_unsigned(rows: list, keys: list[bytes]) -> tuple[str | None, dict]:
    """The first event whose MAC is missing, out of place or (given `keys`) does not verify, as one line;
    and what was found: `signed_from` (the key_set event's id, None for an unsigned ledger) and `checked`
    (the MACs verified with a key). Without keys only the shape is checked: MACs from the first key_set on,
    none before it."""
    by_id = {key_id(k): k for k in keys}
    signed_from, signer = None, None
    for r in rows:
        if r.mac is None:
            if signed_from is not None:
                return (
                    f"events: row {r.id} ({r.kind}) has no MAC, but the ledger is signed from event "
                    f"{signed_from} on (written by someone without the market's key)"
                ), {}
            continue
        try:
            named = key_events(r.data, r.kind, r.id) if r.kind in KEY_KINDS else None
        except ValueError as e:
            return str(e), {}
        if signed_from is None:
            if r.kind != "key_set" or named[1] != r.id - 1:
                return (
                    f"events: row {r.id} ({r.kind}) has a MAC, but signing starts with a key_set event that "
                    f"follows every unsigned one (a MAC written by hand?)"
                ), {}
            signed_from, signer = r.id, named[0]
        elif r.kind == "key_set":
            return f"events: row {r.id} (key_set) sets a key a second time (a rotation is key_rotated)", {}
        if keys:
            key = by_id.get(signer)
            if key is None:
                held = "the key file does not hold"
                return f"events: row {r.id} ({r.kind}) is signed by key {signer}, which {held}", {}
            if not verifies(r.mac, key, r.hash):
                return (
                    f"events: row {r.id} ({r.kind}) MAC does not verify with key {signer} (written without "
                    "the market's key: forged, or edited and rechained)"
                ), {}
        if r.kind == "key_rotated":
            signer = named[0]
    return None, {"signed_from": signed_from, "checked": bool(keys) and signed_from is not None}
