"""Reports: submit or replace one (with the wager limits and the agent's floor), read them, pool them.

Each public function is a method of Ledger (ledger/__init__.py binds them), so `ledger` is the Ledger itself.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from sqlalchemy import Connection, bindparam, func, insert, select, update
from walla.market import db
from walla.market.api import ClientError, RoundSettings, bad
from walla.market.ledger.common import (
    AGENT,
    OPEN_STATES,
    OPERATOR_ONLY,
    Principal,
    check_finite,
    checked_id,
    dumps,
)
from walla.market.ledger.rounds import close_row, insert_round, round_dict, round_row, status
from walla.market.payouts import pooled_forecast, worst_payout

if TYPE_CHECKING:
    from walla.market.ledger import Ledger

# the hot path (a report per agent per round) runs prebuilt statements with parameter dicts
REPORT_INSERT = insert(db.reports)
REPORT_UPDATE = update(db.reports).where(db.reports.c.id == bindparam("report_id"))


def submit_report(
    ledger: Ledger, rid: int, agent: Principal, probs: list[float], wager: float, *, served: bool = False
) -> dict:
    """Write or replace `agent`'s report; 409 when the round is no longer open (checked in the txn), 404
    when it is the operator's alone, unless `served` (walla serve writing its own agents' reports)."""
    if agent.role != AGENT:
        raise ClientError(
            403, f"authorization: the {agent.role} does not submit reports; use an agent's token"
        )

    def txn(conn: Connection) -> dict:
        row = round_row(conn, rid, lock="share", viewer=None if served else agent)
        now = status(row, ledger.clock())
        if now != "open":
            raise ClientError(409, f"round: round {rid} is {now}; reports are accepted only while open")
        return write_report(ledger, conn, row, agent, probs, wager)

    return ledger.transaction(txn)


def write_report(
    ledger: Ledger, conn: Connection, row, agent: Principal, probs: list[float], wager: float
) -> dict:
    """Write or replace `agent`'s report on the open round `row` and append its event, inside the caller's
    write transaction (the limits and the floor checked there, against the agent's locked row)."""
    rid = row.id
    if len(probs) != row.n_options:
        raise bad("probabilities", f"expected {row.n_options} numbers (one per option), got {len(probs)}")
    check_finite("report", [*probs, wager])
    check_limits(conn, row, agent_lock(conn, agent), wager)
    r = db.reports.c
    old = conn.execute(select(db.reports).where((r.round_id == rid) & (r.agent_id == agent.id))).first()
    values = {"probabilities": dumps(probs), "wager": wager, "submitted_at": ledger.clock()}
    if old is None:
        version = 1
        new = conn.execute(REPORT_INSERT, {"round_id": rid, "agent_id": agent.id, "version": 1, **values})
        report_id = checked_id("report", new.inserted_primary_key[0])
    else:
        version, report_id = old.version + 1, old.id
        conn.execute(REPORT_UPDATE, {"report_id": report_id, "version": version, **values})
    ledger.append_event(
        conn,
        "report",
        values["submitted_at"],
        round_id=rid,
        agent_id=agent.id,
        data={"probabilities": probs, "wager": wager, "version": version, "id": report_id},
    )
    return {
        "round": rid,
        "agent": agent.name,
        "probabilities": probs,
        "wager": wager,
        "version": version,
        "submitted_at": values["submitted_at"],
    }


def record_closed_round(
    ledger: Ledger,
    question: str,
    options: list[str],
    settings: RoundSettings,
    reports: list[tuple[Principal, list[float], float]],
    *,
    source: str,
    publish_pool: str = OPERATOR_ONLY,
) -> dict:
    """A round opened, every (agent, probabilities, wager) report written and the round closed, in ONE write
    transaction: whole or absent (walla serve's forecasts). The events are those of open_round, each
    submit_report and close_round, in that order, so the audit reads it as any other round."""
    for agent, _, _ in reports:
        if agent.role != AGENT:
            raise ClientError(403, f"authorization: the {agent.role} does not submit reports")
    values = settings.as_dict()
    check_finite("round settings", [values["c1"], values["c2"], values["c3"]])

    def txn(conn: Connection) -> dict:
        now = ledger.clock()
        rnd = insert_round(
            ledger, conn, question, options, settings, None, now, publish_pool, None, None, source
        )
        row = round_row(conn, rnd["id"], lock="update")
        for agent, probs, wager in reports:
            write_report(ledger, conn, row, agent, probs, wager)
        close_row(ledger, conn, row)
        return round_dict(ledger, conn, round_row(conn, rnd["id"]))

    return ledger.transaction(txn)


def agent_lock(conn: Connection, agent: Principal):
    """The agent's row, locked FOR UPDATE until the transaction ends (SQLite: the writer lock already is):
    the agent's reports are checked against its limits one at a time, each seeing the one before committed.
    401 when the token was revoked or rotated meanwhile: another server's change, which this server's cache
    of tokens may not have seen yet (AUTH_TTL_S), is seen here, in the database, at once."""
    row = conn.execute(select(db.agents).where(db.agents.c.id == agent.id).with_for_update()).first()
    stale = agent.token_hash is not None and row is not None and row.token_hash != agent.token_hash
    if row is None or row.revoked_at is not None or stale:
        raise ClientError(401, "authorization: unknown or revoked token")
    return row


def check_limits(conn: Connection, row, agent, wager: float) -> None:
    """The round's and the agent's maximum wager, and the agent's floor: its balance minus the worst-case
    loss of every unpaid report (this one instead of its old report) may not go below it (409).

    `agent`: its locked row (agent_lock). The balance and the unpaid reports are read in one statement, so a
    resolution committing meanwhile is either wholly in it (paid, no longer unpaid) or not at all."""
    for who, cap in (("round", row.max_wager), ("agent", agent.max_wager)):
        if cap is not None and wager > cap:
            raise bad("wager", f"{wager:g} is over the {who}'s maximum wager {cap:g}", 409)
    if agent.floor is None:
        return
    a, p, r, rd = db.agents.c, db.payouts.c, db.reports.c, db.rounds.c
    balance = select(func.coalesce(func.sum(p.payout), 0.0)).where(p.agent_id == agent.id).scalar_subquery()
    unpaid = db.reports.join(db.rounds, rd.id == r.round_id)
    mine = (r.agent_id == a.id) & rd.status.in_(OPEN_STATES) & (r.round_id != row.id)
    q = (
        select(balance.label("balance"), r.wager, rd.c2, rd.c3)
        .select_from(db.agents.outerjoin(unpaid, mine))
        .where(a.id == agent.id)
    )
    rows = conn.execute(q).all()  # one row per unpaid report; one row of NULLs when there is none
    worst = float(rows[0].balance) + sum(
        worst_payout(u.wager, u.c2, u.c3) for u in rows if u.wager is not None
    )
    worst += worst_payout(wager, row.c2, row.c3)
    if worst < agent.floor:
        raise bad(
            "wager",
            f"{wager:g} could take {agent.name}'s balance to {worst:.6g}, below its floor {agent.floor:g}",
            409,
        )


def report_history(ledger: Ledger, rid: int) -> list[dict]:
    """Every submission of a round, replacements included, in the order they were made (operator): the
    round's report events."""
    e, a = db.events.c, db.agents.c
    q = (
        select(e.at, e.agent_id, e.data, a.name)
        .join(db.agents, a.id == e.agent_id)
        .where((e.round_id == rid) & (e.kind == "report"))
        .order_by(e.id)
    )
    with ledger.engine.connect() as conn:
        round_row(conn, rid)
        out = []
        for row in conn.execute(q):
            data = json.loads(row.data)
            data.pop("id", None)  # the report's row id: the audit's, not the API's
            out.append({"round": rid, "agent": row.name, **data, "submitted_at": row.at})
        return out


def get_report(ledger: Ledger, rid: int, agent: Principal) -> dict:
    with ledger.engine.connect() as conn:
        round_row(conn, rid, viewer=agent)
        r = db.reports.c
        row = conn.execute(select(db.reports).where((r.round_id == rid) & (r.agent_id == agent.id))).first()
    if row is None:
        raise ClientError(404, f"report: {agent.name} has no report in round {rid}")
    return report_dict(row, agent.name)


def report_dict(row, name: str) -> dict:
    return {
        "round": row.round_id,
        "agent": name,
        "probabilities": json.loads(row.probabilities),
        "wager": row.wager,
        "version": row.version,
        "submitted_at": row.submitted_at,
    }


def reports_of(conn: Connection, rid: int) -> list:
    """The round's reports with agent names, in agent-id order (the order payouts are computed in)."""
    q = (
        select(db.reports, db.agents.c.name)
        .join(db.agents, db.agents.c.id == db.reports.c.agent_id)
        .where(db.reports.c.round_id == rid)
        .order_by(db.reports.c.agent_id)
    )
    return list(conn.execute(q))


def round_reports(ledger: Ledger, rid: int, viewer: Principal | None = None) -> list[dict]:
    """Every report of a round (the server shows them to agents only after resolution, and never those of a
    round that is the operator's alone: 404 to an agent `viewer`)."""
    with ledger.engine.connect() as conn:
        round_row(conn, rid, viewer=viewer)
        return [report_dict(row, row.name) for row in reports_of(conn, rid)]


def pooled(ledger: Ledger, rid: int, viewer: Principal) -> dict:
    """The wager-weighted pool of the round's current reports (payouts.pooled_forecast).

    The operator's at any time, with the per-report weights. An agent's only once the round's
    `publish_pool` allows (at close or after resolution; 403 before, or never), and without the weights:
    with the pool, the weights and its own report an agent could solve for another's open report.
    """
    with ledger.engine.connect() as conn:
        row = round_row(conn, rid, viewer=viewer)
        if not viewer.is_operator:
            now = status(row, ledger.clock())
            published = (row.publish_pool == "close" and now in ("closed", "resolved")) or (
                row.publish_pool == "resolution" and now == "resolved"
            )
            if not published:
                when = {"close": "it closes", "resolution": "it is resolved"}.get(row.publish_pool)
                what = f"private until {when}" if when else "not published to agents"
                raise ClientError(403, f"round: the pooled forecast of round {rid} is {what}")
        reps = reports_of(conn, rid)
    probs = [json.loads(r.probabilities) for r in reps]
    out = {"round": rid, **pooled_forecast(probs, [r.wager for r in reps], row.pooling, row.n_options)}
    if not viewer.is_operator:
        out["weights"] = None
    return out
