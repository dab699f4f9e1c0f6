"""Resolution and payouts: resolve a round, correct its answer or void it, each one transaction that writes
a resolutions entry, its payout rows (reversals of the previous entry first) and its event.

Each public function is a method of Ledger (ledger/__init__.py binds them), so `ledger` is the Ledger itself.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from sqlalchemy import Connection, insert, select, update
from walla.market import db
from walla.market.api import ClientError, RoundSettings, bad
from walla.market.ledger.common import LedgerInvariantError, check_finite, dumps, same
from walla.market.ledger.reports import reports_of
from walla.market.ledger.rounds import current, round_dict, round_row, status
from walla.market.payouts import round_payouts

if TYPE_CHECKING:
    from walla.market.ledger import Ledger

EVENT_OF = {"resolve": "resolved", "correct": "resolution_corrected", "void": "round_voided"}


def resolve(
    ledger: Ledger, rid: int, label: int | None, target: list[float], note: str | None = None
) -> dict:
    """Resolve a round with its answer and pay every report, in one transaction (see ledger/__init__.py).
    Every score, payout and the bound must be finite, or nothing is written (LedgerInvariantError)."""

    def txn(conn: Connection) -> dict:
        row = round_row(conn, rid, lock="update")
        if len(target) != row.n_options:
            raise bad("target", f"expected {row.n_options} numbers (one per option), got {len(target)}")
        if row.status == "void":
            raise ClientError(409, f"round: round {rid} is void ({current(conn, rid).note})")
        if row.status == "resolved":
            return already_resolved(conn, rid, label, target)
        out = entry(ledger, conn, row, "resolve", 1, label, target, note, reverse=[])
        at = out.pop("at")
        conn.execute(
            update(db.rounds)
            .where(db.rounds.c.id == rid)
            .values(status="resolved", closed_at=row.closed_at or at)
        )
        return out

    return ledger.transaction(txn)


def correct(
    ledger: Ledger, rid: int, label: int | None, target: list[float], note: str | None = None
) -> dict:
    """Correct a resolved round's answer: append rows reversing every payout of the current resolution, a new
    resolution entry and its payouts from the stored reports -- never an edit or a delete. 409 when the
    round is not resolved or the answer is the current one."""

    def txn(conn: Connection) -> dict:
        row = round_row(conn, rid, lock="update")
        if len(target) != row.n_options:
            raise bad("target", f"expected {row.n_options} numbers (one per option), got {len(target)}")
        if row.status != "resolved":
            raise ClientError(
                409,
                f"round: round {rid} is {status(row, ledger.clock())}; only a resolved round is corrected",
            )
        cur = current(conn, rid)
        if same(json.loads(cur.target), target):
            field = "label" if label is not None else "target"
            raise bad(field, f"round {rid} is already resolved with this answer; nothing to correct", 409)
        out = entry(ledger, conn, row, "correct", cur.seq + 1, label, target, note, paid(conn, rid, cur.seq))
        out.pop("at")
        return out

    return ledger.transaction(txn)


def void(ledger: Ledger, rid: int, reason: str) -> dict:
    """Void a round: no payouts (a resolved round's are reversed by appended rows), the reason recorded,
    reports refused from then on. 409 when it is void already."""

    def txn(conn: Connection) -> dict:
        row = round_row(conn, rid, lock="update")
        if row.status == "void":
            raise ClientError(409, f"round: round {rid} is already void")
        cur = current(conn, rid) if row.status == "resolved" else None
        seq = cur.seq + 1 if cur is not None else 1
        reverse = paid(conn, rid, cur.seq) if cur is not None else []
        at = entry(ledger, conn, row, "void", seq, None, [], reason, reverse)["at"]
        conn.execute(
            update(db.rounds)
            .where(db.rounds.c.id == rid)
            .values(status="void", closed_at=row.closed_at or at)
        )
        return round_dict(ledger, conn, round_row(conn, rid))

    return ledger.transaction(txn)


def recorded_settings(conn: Connection, rid: int) -> RoundSettings:
    """The settings the round's round_opened event recorded: what a resolution pays with, whatever its
    rounds row says now (an edit of that row is the audit's to name, not a payout's to follow)."""
    e = db.events.c
    q = select(e.data).where((e.round_id == rid) & (e.kind == "round_opened"))
    data = conn.execute(q).scalar_one_or_none()
    if data is None:
        raise LedgerInvariantError(f"round {rid} has no round_opened event; run `walla market audit`")
    return RoundSettings.model_construct(**json.loads(data)["settings"])


def paid(conn: Connection, rid: int, seq: int) -> list:
    """The pay rows of entry `seq` (what a correction or a void reverses), in agent-id order."""
    p = db.payouts.c
    q = select(db.payouts).where((p.round_id == rid) & (p.seq == seq) & (p.kind == "pay"))
    return list(conn.execute(q.order_by(p.agent_id)))


def entry(
    ledger: Ledger,
    conn: Connection,
    row,
    kind: str,
    seq: int,
    label,
    target: list[float],
    note,
    reverse: list,
) -> dict:
    """One resolutions entry with its payout rows: `reverse` rows negated, then (unless a void) a pay row per
    report computed from the stored reports. Every number is checked finite before anything is written."""
    rid = row.id
    reps = reports_of(conn, rid) if kind != "void" else []
    s = recorded_settings(conn, rid)
    pay = round_payouts([json.loads(r.probabilities) for r in reps], [r.wager for r in reps], target, s)
    for what, values in vars(pay).items():
        check_finite(what, values)
    check_finite("total and bound", [pay.total, s.deficit_bound])
    total = pay.total  # the round's outlay under this entry: its rows net of the reversals sum to it
    now = ledger.clock()
    conn.execute(
        insert(db.resolutions).values(
            round_id=rid,
            seq=seq,
            kind=kind,
            label=label,
            target=dumps(target),
            n_reports=len(reps),
            total_payout=total,
            deficit_bound=s.deficit_bound,
            resolved_at=now,
            note=note,
        )
    )
    common = {"round_id": rid, "seq": seq}
    rows = [
        {
            **common,
            "kind": "reverse",
            "agent_id": p.agent_id,
            "report_id": p.report_id,
            "wager": p.wager,
            "score": p.score,
            "baseline": p.baseline,
            "advantage": p.advantage,
            "payout": -p.payout,
        }
        for p in reverse
    ] + [
        {
            **common,
            "kind": "pay",
            "agent_id": r.agent_id,
            "report_id": r.id,
            "wager": r.wager,
            "score": pay.score[i],
            "baseline": pay.baseline[i],
            "advantage": pay.advantage[i],
            "payout": pay.payout[i],
        }
        for i, r in enumerate(reps)
    ]
    if rows:
        conn.execute(insert(db.payouts), rows)
    ledger.append_event(
        conn,
        EVENT_OF[kind],
        now,
        round_id=rid,
        data={
            "seq": seq,
            "label": label,
            "target": target,
            "note": note,
            "total_payout": total,
            "payouts": {str(r["agent_id"]): r["payout"] for r in rows if r["kind"] == "pay"},
            "reversed": {str(r["agent_id"]): r["payout"] for r in rows if r["kind"] == "reverse"},
        },
    )
    return {
        "round": rid,
        "resolved_now": True,
        "total_payout": total,
        "deficit_bound": s.deficit_bound,
        "n_reports": len(reps),
        "payouts": {r.name: pay.payout[i] for i, r in enumerate(reps)},
        "at": now,
    }


def already_resolved(conn: Connection, rid: int, label: int | None, target: list[float]) -> dict:
    """A retried resolution: the recorded result when the answer is the same (nothing paid), else 409."""
    res = current(conn, rid)
    old = json.loads(res.target)
    if not same(old, target):
        answer = f"label {res.label}" if res.label is not None else f"target {old}"
        raise ClientError(
            409,
            f"{'label' if label is not None else 'target'}: round {rid} was already "
            f"resolved with another answer ({answer}; POST /rounds/{rid}/correct changes it)",
        )
    p = db.payouts.c
    q = (
        select(p.payout, db.agents.c.name)
        .join(db.agents, db.agents.c.id == p.agent_id)
        .where((p.round_id == rid) & (p.seq == res.seq) & (p.kind == "pay"))
        .order_by(p.agent_id)
    )
    return {
        "round": rid,
        "resolved_now": False,
        "total_payout": res.total_payout,
        "deficit_bound": res.deficit_bound,
        "n_reports": res.n_reports,
        "payouts": {r.name: r.payout for r in conn.execute(q)},
    }
