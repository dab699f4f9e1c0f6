"""Audit a ledger end to end: the event chain verifies, and every payout row equals walla.train.mechanism's
net payout recomputed from the stored reports, the round's settings and the resolution's target.

    problem, summary = audit(ledger)        # problem: None, or one line naming the first mismatching row

Checked, in this order (the first failure is reported):
    events       the hash chain links (events.first_break): no event edited, deleted or inserted; every agent,
                 round and resolution entry has its event (a log cut short at the end)
    reports      every current report equals its last `report` event (no report edited after the fact)
    entries      per round, resolution entries 1..n; the round's status matches its last entry; every entry's
                 deficit bound is mechanism.deficit_bound(c2, c3) of the round and its total is within it
    payouts      per entry: one `pay` row per report, equal to mechanism.net_payout (to TOLERANCE) and to the
                 entry's event; one `reverse` row per pay row of the previous entry, its exact negation; the
                 entry's total = the sum of its pay rows; the round's rows sum to its last entry's total
"""

from __future__ import annotations

import json
from collections import defaultdict

import torch
from sqlalchemy import select
from walla.market import db, events
from walla.market.ledger import Ledger
from walla.train import mechanism

TOLERANCE = 1e-12  # |stored - recomputed| per payout (both float64 through the same formulas)


def _tables(ledger: Ledger) -> dict[str, list]:
    with ledger.engine.connect() as conn:
        order = {"events": db.events.c.id, "payouts": db.payouts.c.id, "resolutions": None}
        out = {}
        for t in (db.agents, db.rounds, db.reports, db.resolutions, db.payouts, db.events):
            q = select(t)
            if order.get(t.name) is not None:
                q = q.order_by(order[t.name])
            out[t.name] = list(conn.execute(q))
    return out


def _recompute(rnd, reps: list, target: list[float]) -> list[float]:
    p = torch.tensor([json.loads(r.probabilities) for r in reps], dtype=torch.float64)  # [M, K]
    w = torch.tensor([r.wager for r in reps], dtype=torch.float64)  # [M]
    q = torch.tensor(target, dtype=torch.float64)  # [K]
    return mechanism.net_payout(p, w, q, rnd.variant, rnd.c1, rnd.c2, rnd.c3).tolist()


def _check_tail(t: dict) -> str | None:
    """Every agent, round and resolution entry has its event: a log cut short at its end is caught too."""
    seen = {(e.kind, e.agent_id if e.kind.endswith("_added") else e.round_id) for e in t["events"]}
    for a in t["agents"]:
        if ("agent_added", a.id) not in seen and ("operator_added", a.id) not in seen:
            return f"agents: row id {a.id} ({a.name}) has no event (the event log was cut short?)"
    for r in t["rounds"]:
        if ("round_opened", r.id) not in seen:
            return f"rounds: row id {r.id} has no round_opened event (the event log was cut short?)"
    kinds = {"resolve": "resolved", "correct": "resolution_corrected", "void": "round_voided"}
    logged = {(e.round_id, json.loads(e.data).get("seq")) for e in t["events"] if e.kind in kinds.values()}
    for e in t["resolutions"]:
        if (e.round_id, e.seq) not in logged:
            return f"resolutions: round {e.round_id} seq {e.seq} has no event (the event log was cut short?)"
    return None


def _check_reports(t: dict) -> str | None:
    last: dict[tuple[int, int], dict] = {}
    for e in t["events"]:
        if e.kind == "report":
            last[(e.round_id, e.agent_id)] = json.loads(e.data)
    for r in t["reports"]:
        ev = last.get((r.round_id, r.agent_id))
        stored = {"probabilities": json.loads(r.probabilities), "wager": r.wager, "version": r.version}
        if ev != stored:
            return f"reports: row id {r.id} (round {r.round_id}, agent {r.agent_id}) differs from its last report event"
    return None


def _check_round(
    rnd, entries: list, reps: list, rows: list, names: dict, evs: dict
) -> tuple[str | None, float]:
    """The first problem of one round (None) and the largest |payout - recomputed| seen."""
    worst = 0.0
    if [e.seq for e in entries] != list(range(1, len(entries) + 1)):
        return f"resolutions: round {rnd.id} entries {[e.seq for e in entries]} are not 1..n", worst
    want_status = {
        None: ("open", "closed"),
        "resolve": ("resolved",),
        "correct": ("resolved",),
        "void": ("void",),
    }
    last_kind = entries[-1].kind if entries else None
    if rnd.status not in want_status[last_kind]:
        return (
            f"rounds: row id {rnd.id} status {rnd.status!r} but its last resolution entry is {last_kind}",
            worst,
        )
    prev_pay: list = []
    for e in entries:
        bound = mechanism.deficit_bound(rnd.c2, rnd.c3)
        if e.deficit_bound != bound or e.total_payout > bound + TOLERANCE:
            return (
                f"resolutions: round {rnd.id} seq {e.seq} bound {e.deficit_bound} (expected {bound}), total {e.total_payout}",
                worst,
            )
        mine = [r for r in rows if r.seq == e.seq]
        pay = [r for r in mine if r.kind == "pay"]
        rev = [r for r in mine if r.kind == "reverse"]
        if sorted((r.agent_id, r.report_id, -r.payout) for r in rev) != sorted(
            (r.agent_id, r.report_id, r.payout) for r in prev_pay
        ):
            bad = rev[0].id if rev else (prev_pay[0].id if prev_pay else "?")
            return (
                f"payouts: row id {bad} (round {rnd.id} seq {e.seq}): reversals do not negate entry {e.seq - 1}",
                worst,
            )
        want = _recompute(rnd, reps, json.loads(e.target)) if e.kind != "void" and reps else []
        if e.kind == "void":
            want = []
        by_agent = {r.agent_id: r for r in pay}
        if sorted(by_agent) != [r.agent_id for r in reps if e.kind != "void"] or len(pay) != len(by_agent):
            return (
                f"payouts: round {rnd.id} seq {e.seq} has {len(pay)} pay rows for {len(reps)} reports",
                worst,
            )
        event_pay = evs.get((rnd.id, e.seq), {}).get("payouts", {})
        for rep, value in zip(reps if e.kind != "void" else [], want, strict=True):
            row = by_agent[rep.agent_id]
            diff = abs(row.payout - value)
            worst = max(worst, diff)
            if diff > TOLERANCE * max(1.0, abs(value)) or row.report_id != rep.id or row.wager != rep.wager:
                return (
                    f"payouts: row id {row.id} (round {rnd.id}, agent {names.get(row.agent_id)}, seq {e.seq}) "
                    f"payout {row.payout!r}, recomputed from the stored report {value!r}"
                ), worst
            if event_pay.get(str(rep.agent_id)) != row.payout:
                return (
                    f"payouts: row id {row.id} (round {rnd.id}, agent {names.get(row.agent_id)}) differs from its event",
                    worst,
                )
        total = sum(r.payout for r in pay)
        if abs(total - e.total_payout) > TOLERANCE * max(1.0, len(pay)):
            return (
                f"resolutions: round {rnd.id} seq {e.seq} total {e.total_payout!r} but its pay rows sum to {total!r}",
                worst,
            )
        prev_pay = pay
    final = entries[-1].total_payout if entries and entries[-1].kind != "void" else 0.0
    if abs(sum(r.payout for r in rows) - final) > TOLERANCE * max(1.0, len(rows)):
        return f"payouts: round {rnd.id}'s rows do not sum to its last entry's total {final!r}", worst
    return None, worst


def audit(ledger: Ledger) -> tuple[str | None, dict]:
    """(the first problem as one line, or None; counts and the largest payout difference)."""
    t = _tables(ledger)
    summary = {
        "events": len(t["events"]),
        "payouts": len(t["payouts"]),
        "rounds": len(t["rounds"]),
        "max_diff": 0.0,
    }
    problem = events.first_break(t["events"])
    if problem is None:
        problem = _check_tail(t) or _check_reports(t)
    if problem is not None:
        return problem, summary
    names = {a.id: a.name for a in t["agents"]}
    by = {k: defaultdict(list) for k in ("entries", "reports", "rows")}
    for e in sorted(t["resolutions"], key=lambda e: (e.round_id, e.seq)):
        by["entries"][e.round_id].append(e)
    for r in sorted(t["reports"], key=lambda r: (r.round_id, r.agent_id)):
        by["reports"][r.round_id].append(r)
    for p in t["payouts"]:
        by["rows"][p.round_id].append(p)
    evs = {}
    for e in t["events"]:
        if e.kind in ("resolved", "resolution_corrected", "round_voided"):
            data = json.loads(e.data)
            evs[(e.round_id, data["seq"])] = data
    for rnd in sorted(t["rounds"], key=lambda r: r.id):
        problem, worst = _check_round(
            rnd, by["entries"][rnd.id], by["reports"][rnd.id], by["rows"][rnd.id], names, evs
        )
        summary["max_diff"] = max(summary["max_diff"], worst)
        if problem is not None:
            return problem, summary
    stray = sorted(set(by["rows"]) - {r.id for r in t["rounds"]})
    if stray:
        return f"payouts: rows of unknown round {stray[0]}", summary
    return None, summary
