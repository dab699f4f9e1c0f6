"""What the operator's dashboard shows, computed from the ledger (GET /market).

Per resolved round (id order; a corrected round by its current answer, void rounds left out): the pooled forecast's Brier loss and hit (argmax == answer) next to the
uniform average's (the agents' plain mean, UniformAvg), every agent's wager, the round's net payout and
its deficit bound c2^2/c3. Per agent: balance, cumulative payouts. Brier is the unhalved
||p - target||^2 (mechanism.brier_loss, as walla eval's tables), accuracy the argmax with ties to the
lowest option.
"""

from __future__ import annotations

import json

import torch
from sqlalchemy import func, select
from walla.market import db
from walla.market.ledger import Ledger
from walla.train import mechanism

MAX_ROUNDS = 2000  # the most recent resolved rounds the page plots


def _round_stats(row, reports: list, names: dict[int, str]) -> dict:
    target = torch.tensor(json.loads(row.target), dtype=torch.float64)  # [K]
    out = {
        "round": row.round_id,
        "total_payout": row.total_payout,
        "deficit_bound": row.deficit_bound,
        "n_reports": len(reports),
        "wagers": {names[r.agent_id]: r.wager for r in reports},
    }
    if not reports:
        return {**out, "pool_brier": None, "uniform_brier": None, "pool_hit": None, "uniform_hit": None}
    p = torch.tensor([json.loads(r.probabilities) for r in reports], dtype=torch.float64)  # [M, K]
    w = torch.tensor([r.wager for r in reports], dtype=torch.float64)  # [M]
    pooled = mechanism.pool(p, w, row.pooling)  # [K]
    uniform = mechanism.pool(p, torch.ones_like(w), "linear")  # [K]
    best = int(target.argmax())
    return {
        **out,
        "pool_brier": float(mechanism.brier_loss(pooled, target)),
        "uniform_brier": float(mechanism.brier_loss(uniform, target)),
        "pool_hit": int(int(pooled.argmax()) == best),
        "uniform_hit": int(int(uniform.argmax()) == best),
    }


def market_stats(ledger: Ledger) -> dict:
    """Agents with balances and cumulative payouts, per-round series, and the market's totals."""
    res, rep, pay = db.resolutions, db.reports, db.payouts
    with ledger.engine.connect() as conn:
        names = {r.id: r.name for r in conn.execute(select(db.agents.c.id, db.agents.c.name))}
        current = select(res.c.round_id, func.max(res.c.seq).label("seq")).group_by(res.c.round_id).subquery()
        q = (
            select(res, db.rounds.c.pooling)
            .join(current, (current.c.round_id == res.c.round_id) & (current.c.seq == res.c.seq))
            .join(db.rounds, db.rounds.c.id == res.c.round_id)
            .where(db.rounds.c.status == "resolved")  # each resolved round's current answer; no voids
            .order_by(res.c.round_id.desc())
            .limit(MAX_ROUNDS)
        )
        rows = list(conn.execute(q))[::-1]
        first = rows[0].round_id if rows else 0
        by_round: dict[int, list] = {}
        for r in conn.execute(select(rep).where(rep.c.round_id >= first).order_by(rep.c.agent_id)):
            by_round.setdefault(r.round_id, []).append(r)
        paid = list(
            conn.execute(
                select(pay.c.round_id, pay.c.agent_id, pay.c.payout)
                .where(pay.c.round_id >= first)
                .order_by(pay.c.round_id)
            )
        )
    series = [_round_stats(row, by_round.get(row.round_id, []), names) for row in rows]
    cumulative: dict[str, list[list[float]]] = {}
    running: dict[str, float] = {}
    for p in paid:
        name = names[p.agent_id]
        running[name] = running.get(name, 0.0) + p.payout
        cumulative.setdefault(name, []).append([p.round_id, running[name]])
    scored = [s for s in series if s["pool_brier"] is not None]
    n = max(len(scored), 1)
    totals = {
        "rounds_resolved": len(series),
        "rounds": ledger.counts()["rounds"],
        "deficit": sum(s["total_payout"] for s in series),
        "deficit_bound": sum(s["deficit_bound"] for s in series),
        "pool_brier": sum(s["pool_brier"] for s in scored) / n if scored else None,
        "uniform_brier": sum(s["uniform_brier"] for s in scored) / n if scored else None,
        "pool_acc": sum(s["pool_hit"] for s in scored) / n if scored else None,
        "uniform_acc": sum(s["uniform_hit"] for s in scored) / n if scored else None,
    }
    return {"agents": ledger.agents_overview(), "rounds": series, "cumulative": cumulative, "totals": totals}
