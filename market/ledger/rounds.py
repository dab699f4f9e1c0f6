"""Rounds: open, read, list and close them; a round's row, its status and its latest resolution entry.

Each public function is a method of Ledger (ledger/__init__.py binds them), so `ledger` is the Ledger itself.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from sqlalchemy import Connection, func, insert, select, update
from walla.market import db
from walla.market.api import ClientError, RoundSettings, bad
from walla.market.ledger.common import (
    OPERATOR_ONLY,
    ROUND_STAMP,
    SERVED_SOURCE,
    Principal,
    check_finite,
    checked_id,
    settings_of,
)

if TYPE_CHECKING:
    from walla.market.ledger import Ledger


def status(row, now: float) -> str:
    """The round's status at `now`: an open round past its close_at is closed."""
    if row.status == "open" and row.close_at is not None and now >= row.close_at:
        return "closed"
    return row.status


def round_row(conn: Connection, rid: int, lock: str | None = None, viewer: Principal | None = None):
    """The round's row (404 unknown), locked FOR UPDATE (lock="update") or FOR SHARE (lock="share").
    `viewer`: an agent gets the same 404 for a round that is the operator's alone (it cannot tell the two)."""
    q = select(db.rounds).where(db.rounds.c.id == rid)
    if lock is not None:
        q = q.with_for_update(read=lock == "share")
    row = conn.execute(q).first()
    if row is None or (viewer is not None and not viewer.is_operator and operator_only(row)):
        raise ClientError(404, f"round: no round {rid}")
    return row


def operator_only(row) -> bool:
    """Whether the round is the operator's alone (ledger/common.py OPERATOR_ONLY: walla serve's forecasts)."""
    legacy = row.publish_pool == "never" and str(row.source or "").startswith(SERVED_SOURCE)
    return row.publish_pool == OPERATOR_ONLY or legacy


def market_rounds():
    """The SQL condition of the rounds agents may see (not operator_only)."""
    c = db.rounds.c
    legacy = (c.publish_pool == "never") & c.source.startswith(SERVED_SOURCE)
    return (c.publish_pool != OPERATOR_ONLY) & ~func.coalesce(legacy, False)


def current(conn: Connection, rid: int):
    """The round's latest resolutions entry (None before any)."""
    r = db.resolutions.c
    return conn.execute(
        select(db.resolutions).where(r.round_id == rid).order_by(r.seq.desc()).limit(1)
    ).first()


def round_dict(ledger: Ledger, conn: Connection, row) -> dict:
    n = conn.execute(select(func.count()).where(db.reports.c.round_id == row.id)).scalar_one()
    out = {
        "id": row.id,
        "question": row.question,
        "options": json.loads(row.options),
        "settings": settings_of(row).as_dict(),
        "deficit_bound": settings_of(row).deficit_bound,
        "status": status(row, ledger.clock()),
        "close_at": row.close_at,
        "created_at": row.created_at,
        "closed_at": row.closed_at,
        "n_reports": int(n),
        "publish_pool": row.publish_pool,
        "max_wager": row.max_wager,
        "criteria": row.criteria,
        "source": row.source,
        "walla_version": row.walla_version,
        "resolution": None,
    }
    if row.status in ("resolved", "void"):
        out["resolution"] = resolution_dict(current(conn, row.id))
    return out


def resolution_dict(res) -> dict:
    return {
        "kind": res.kind,
        "seq": res.seq,
        "label": res.label,
        "target": json.loads(res.target),
        "n_reports": res.n_reports,
        "total_payout": res.total_payout,
        "deficit_bound": res.deficit_bound,
        "resolved_at": res.resolved_at,
        "note": res.note,
    }


def open_round(
    ledger: Ledger,
    question: str,
    options: list[str],
    settings: RoundSettings,
    close_at: float | None = None,
    *,
    publish_pool: str = "resolution",
    max_wager: float | None = None,
    criteria: str | None = None,
    source: str | None = None,
) -> dict:
    """Open a round with its mechanism settings, stamped with walla's version. 400 when close_at is past."""
    now = ledger.clock()
    if close_at is not None and close_at <= now:
        raise bad("close_at", f"must be in the future (unix seconds > {now:.0f}), got {close_at}")
    values = settings.as_dict()
    check_finite("round settings", [values["c1"], values["c2"], values["c3"]])

    def txn(conn: Connection) -> dict:
        return insert_round(
            ledger,
            conn,
            question,
            options,
            settings,
            close_at,
            now,
            publish_pool,
            max_wager,
            criteria,
            source,
        )

    return ledger.transaction(txn)


def insert_round(
    ledger: Ledger,
    conn: Connection,
    question: str,
    options: list[str],
    settings: RoundSettings,
    close_at: float | None,
    now: float,
    publish_pool: str,
    max_wager: float | None,
    criteria: str | None,
    source: str | None,
) -> dict:
    """The round's row and its round_opened event, inside the caller's write transaction."""
    check_finite("deficit bound", [settings.deficit_bound])
    rid = conn.execute(
        insert(db.rounds).values(
            question=question,
            options=json.dumps(options),
            n_options=len(options),
            status="open",
            close_at=close_at,
            created_at=now,
            publish_pool=publish_pool,
            max_wager=max_wager,
            criteria=criteria,
            source=source,
            walla_version=ledger.version,
            **settings.as_dict(),
        )
    ).inserted_primary_key[0]
    checked_id("round", rid)
    rnd = round_dict(ledger, conn, round_row(conn, rid))
    stamped = {k: rnd[k] for k in ROUND_STAMP}
    ledger.append_event(conn, "round_opened", now, round_id=rid, data=stamped)
    return rnd


def get_round(ledger: Ledger, rid: int, viewer: Principal | None = None) -> dict:
    """The round (404 unknown, and to an agent `viewer` a round that is the operator's alone)."""
    with ledger.engine.connect() as conn:
        return round_dict(ledger, conn, round_row(conn, rid, viewer=viewer))


def round_options(ledger: Ledger, rid: int) -> int:
    """The round's option count (for validating a body before the write); 404 when unknown."""
    with ledger.engine.connect() as conn:
        return int(round_row(conn, rid).n_options)


def is_resolved(ledger: Ledger, rid: int, viewer: Principal | None = None) -> bool:
    with ledger.engine.connect() as conn:
        return round_row(conn, rid, viewer=viewer).status == "resolved"


def list_rounds(
    ledger: Ledger,
    status: str | None = None,
    after: int = 0,
    limit: int = 100,
    viewer: Principal | None = None,
) -> list[dict]:
    """Rounds by id; to an agent `viewer`, only the market's (none that is the operator's alone)."""
    now = ledger.clock()
    c = db.rounds.c
    q = select(db.rounds).where(c.id > after).order_by(c.id).limit(limit)
    if viewer is not None and not viewer.is_operator:
        q = q.where(market_rounds())
    before_close = c.close_at.is_(None) | (c.close_at > now)
    if status == "open":
        q = q.where((c.status == "open") & before_close)
    elif status == "closed":
        q = q.where((c.status == "closed") | ((c.status == "open") & ~before_close))
    elif status in ("resolved", "void"):
        q = q.where(c.status == status)
    elif status is not None:
        raise bad("status", f"expected open, closed, resolved or void, got {status!r}")
    with ledger.engine.connect() as conn:
        return [round_dict(ledger, conn, row) for row in conn.execute(q)]


def close_round(ledger: Ledger, rid: int) -> dict:
    def txn(conn: Connection) -> dict:
        row = round_row(conn, rid, lock="update")
        if row.status in ("resolved", "void"):
            raise ClientError(409, f"round: round {rid} is already {row.status}")
        if row.status == "open":
            close_row(ledger, conn, row)
        return round_dict(ledger, conn, round_row(conn, rid))

    return ledger.transaction(txn)


def close_row(ledger: Ledger, conn: Connection, row) -> None:
    """Close an open round (its row locked by the caller's write transaction) and append round_closed."""
    now = ledger.clock()
    closed = min(now, row.close_at) if row.close_at is not None else now
    conn.execute(update(db.rounds).where(db.rounds.c.id == row.id).values(status="closed", closed_at=closed))
    ledger.append_event(conn, "round_closed", now, round_id=row.id, data={"closed_at": closed})
