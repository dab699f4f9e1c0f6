"""The event chain's own events: which key signs it, and the head lines a server writes to its head file.

    ledger.signing()                       # (signed_from, key id in force) of the ledger; (None, None): unsigned
    line = ledger.sign_with(keys)          # every later event signed with keys[0]; a line to print, or None
    ledger.record_head(Path("m.heads"))    # the current head appended to the file, and noted in the ledger

Signing starts with a `key_set` event, signed by the key it names, that says how many events before it are
unsigned (a ledger written before it had a key). A key file whose first key is not the one in force but
holds it below is a rotation: a `key_rotated` event, signed by the old key, names the new one, which signs
every event after it. A key file without the key in force is refused: no event signed by another key can
follow (the audit would reject it).

Each head line a server writes is noted by a `head_recorded` event (signed like every other): its file,
line number, head and MAC. The audit then knows which lines the file must still hold, so a head file cut
short or deleted is caught, not only one edited (audit/heads.py).
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

from sqlalchemy import Connection, select
from walla.market import db, events
from walla.market.audit import head_line, holds_noted, identity, noted_in, parse_heads
from walla.market.keys import key_id


def _last_key_event(conn: Connection):
    e = db.events.c
    q = select(e.id, e.kind, e.data).where(e.kind.in_(events.KEY_KINDS)).order_by(e.id.desc()).limit(1)
    return conn.execute(q).first()


def signing(ledger) -> tuple[int | None, str | None]:
    """(the id of the ledger's key_set event, the id of the key that signs now); (None, None): unsigned."""
    with ledger.engine.connect() as conn:
        last = _last_key_event(conn)
        if last is None:
            return None, None
        first = conn.execute(
            select(db.events.c.id).where(db.events.c.kind == "key_set").order_by(db.events.c.id).limit(1)
        ).scalar()
    return first, json.loads(last.data)["key_id"]


def sign_with(ledger, keys: list[bytes]) -> str | None:
    """Sign every event this ledger appends from now on with keys[0]: a key_set event on an unsigned ledger,
    a key_rotated one (signed by the old key, found below keys[0]) when another key is in force. Returns the
    line to print (events left unsigned, a rotation), None when keys[0] already signs.

    Raises:
        ValueError: the key in force is not among `keys` (one line naming its id).
    """
    new = key_id(keys[0])
    by_id = {key_id(k): k for k in keys}

    def txn(conn: Connection) -> str | None:
        last_id, _ = events.last_link(conn)  # PostgreSQL: the chain's lock, so two servers cannot both rotate
        last = _last_key_event(conn)
        now = ledger.clock()
        if last is None:
            ledger.append_event(
                conn, "key_set", now, key=keys[0], data={"key_id": new, "unsigned_through": last_id}
            )
            if last_id == 0:
                return None
            return (
                f"the ledger's events 1..{last_id} are unsigned (written before it had a key); "
                f"signed from event {last_id + 1} on with key {new}"
            )
        current = json.loads(last.data)["key_id"]
        if current == new:
            return None
        if current not in by_id:
            raise ValueError(
                f"the ledger's events are signed by key {current}, which the key file does not hold (to rotate, "
                "put the new key on the first line and the old one below it)"
            )
        ledger.append_event(conn, "key_rotated", now, key=by_id[current], data={"key_id": new})
        return (
            f"key rotated: event {last_id + 1}, signed by the old key {current}, hands signing to key {new}"
        )

    line = ledger.transaction(txn)
    ledger.key = keys[0]
    return line


def record_head(ledger, path: Path) -> int | None:
    """Append the chain's head to the head file `path` (signed with the ledger's key) and note the line in a
    head_recorded event; None when nothing was appended since the file's last noted line. Returns the line.

    The file is locked while it is read and appended (an audit may append to it too), and a head is written
    only ahead of its last line: heads only move forward.

    Raises:
        OSError: the file cannot be written. ValueError: its lines are not a head file's, or its last head is
        ahead of this ledger's chain (another ledger's file?).
    """
    path = path.resolve()

    def txn(conn: Connection) -> int | None:
        last_id, last_hash = events.last_link(conn)
        e = db.events.c
        last = conn.execute(select(e.kind, e.data).where(e.id == last_id)).first()
        idle = json.loads(last.data) if last is not None and last.kind == "head_recorded" else {}
        q = select(e.id, e.kind, e.data).where(e.kind == "head_recorded").order_by(e.id)
        noted = noted_in(conn.execute(q).all(), str(path))
        if noted and not path.exists():  # never start the file afresh: that would hide its deletion
            eid, d = noted[-1]
            raise ValueError(
                f"{path}: no such head file, but the ledger's event {eid} (head_recorded) says line {d['line']} "
                "was written to it (deleted? `walla market audit --head FILE --new-head-file` starts a new one)"
            )
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "r+", encoding="utf-8") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.seek(0)
            text = f.read()
            heads, n_lines = parse_heads(text, str(path))
            problem = holds_noted(heads, noted, str(path))
            if problem is not None:  # appending would hide that lines were cut
                raise ValueError(problem)
            if heads and heads[-1][1] > last_id:
                raise ValueError(
                    f"{path} line {heads[-1][0]}: head {heads[-1][1]} is ahead of this ledger's chain"
                )
            if heads and idle.get("file") == str(path) and idle.get("line") == heads[-1][0]:
                return None  # nothing appended since this file's last line, noted (and checked above)
            if heads and heads[-1][1:3] == (last_id, last_hash):  # an audit appended this head already
                n, mac = heads[-1][0], heads[-1][3]
            else:
                prev = (heads[-1][3] or "") if heads else ""
                line = head_line(last_id, last_hash, ledger.key, prev)
                f.write(("" if not text or text.endswith("\n") else "\n") + line + "\n")
                f.flush()
                os.fsync(f.fileno())
                n = n_lines + 1
                mac = line.split()[2] if ledger.key is not None else None
                heads = heads or [(n, last_id, last_hash, mac)]
        data = {"file": str(path), "line": n, "head": last_id, "mac": mac, "first": identity(heads[0])}
        ledger.append_event(conn, "head_recorded", ledger.clock(), data=data)
        return n

    return ledger.transaction(txn)
