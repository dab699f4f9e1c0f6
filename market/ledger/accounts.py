"""Agents, the operator and their tokens: register, revoke, rotate, authenticate; balances and payouts.

Each function is a method of Ledger (ledger/__init__.py binds them), so `ledger` is the Ledger itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import Connection, func, insert, select, update
from walla.market import db
from walla.market.api import ClientError, bad
from walla.market.ledger.common import (
    OPERATOR,
    Principal,
    check_finite,
    checked_id,
    hash_token,
    new_token,
    token_check,
)
from walla.market.ledger.rounds import market_rounds

if TYPE_CHECKING:
    from walla.market.ledger import Ledger


def add_agent(
    ledger: Ledger,
    name: str,
    role: str = "agent",
    token: str | None = None,
    max_wager: float | None = None,
    floor: float | None = None,
) -> str:
    """Register an agent; returns its token (only the hash is stored). 409 when the name is taken, compared
    case-folded (the database's unique index on lower(name) is the guarantee, this the clear message)."""
    if role != OPERATOR and name.lower() == OPERATOR:
        raise bad("name", f"{name!r} is reserved for the market's operator", 409)
    token = token or new_token()
    check_finite("agent limits", [v for v in (max_wager, floor) if v is not None])

    def txn(conn: Connection) -> None:
        a = db.agents.c
        taken = conn.execute(select(a.name).where(func.lower(a.name) == name.lower())).first()
        if taken is not None:
            raise bad("name", f"an agent named {taken.name!r} already exists", 409)
        now = ledger.clock()
        aid = conn.execute(
            insert(db.agents).values(
                name=name,
                token_hash=hash_token(token),
                role=role,
                created_at=now,
                max_wager=max_wager,
                floor=floor,
            )
        ).inserted_primary_key[0]
        checked_id("agent", aid)
        limits = {"name": name, "role": role, "max_wager": max_wager, "floor": floor}
        limits["token"] = token_check(hash_token(token))
        ledger.append_event(conn, "agent_added", now, agent_id=aid, data=limits)

    ledger.transaction(txn)
    ledger.token_cache.allow(hash_token(token))  # a chosen token refused before is valid from now on
    return token


def ensure_operator(ledger: Ledger, token: str | None = None) -> str | None:
    """The operator's credentials: set to `token` when given (replacing the old one), else created once.

    Returns the token when this call created or set it, None when an operator already existed.
    """

    changed: list[int] = []  # the operator's id, once its token is set

    def txn(conn: Connection) -> str | None:
        row = conn.execute(select(db.agents).where(db.agents.c.role == OPERATOR)).first()
        if token is None and row is not None:
            return None
        new = token or new_token()
        owner = conn.execute(select(db.agents).where(db.agents.c.token_hash == hash_token(new))).first()
        if owner is not None and owner.role != OPERATOR:
            raise bad("operator token", f"is agent {owner.name!r}'s token; choose another", 409)
        if row is None:
            taken = conn.execute(select(db.agents).where(func.lower(db.agents.c.name) == OPERATOR)).first()
            if taken is not None:
                raise bad(
                    "operator",
                    f"an agent named {taken.name!r} holds the operator's name; this ledger cannot get an "
                    "operator (start a new one with `walla market init` before add-agent)",
                    409,
                )
        now = ledger.clock()
        if row is None:
            aid = conn.execute(
                insert(db.agents).values(
                    name=OPERATOR, token_hash=hash_token(new), role=OPERATOR, created_at=now
                )
            ).inserted_primary_key[0]
            checked_id("agent", aid)
            data = {"name": OPERATOR, "token": token_check(hash_token(new))}
            ledger.append_event(conn, "operator_added", now, agent_id=aid, data=data)
            changed.append(aid)
        elif row.token_hash != hash_token(new):
            conn.execute(update(db.agents).where(db.agents.c.id == row.id).values(token_hash=hash_token(new)))
            data = {"token": token_check(hash_token(new))}
            ledger.append_event(conn, "operator_token_set", now, agent_id=row.id, data=data)
            changed.append(row.id)
        return new

    new = None
    try:
        new = ledger.transaction(txn)
        return new
    finally:  # after the commit: the operator's old token is forgotten, its new one no longer refused
        for aid in changed:
            ledger.token_cache.invalidate(aid)
        if new is not None:
            ledger.token_cache.allow(hash_token(new))


def revoke(ledger: Ledger, name: str) -> dict:
    """Refuse the agent's token from now on (its rows stay); 404 unknown, 409 already revoked."""

    def txn(conn: Connection) -> dict:
        row = agent_row(conn, name)
        if row.revoked_at is not None:
            raise ClientError(409, f"name: {row.name}'s token is already revoked")
        now = ledger.clock()
        conn.execute(update(db.agents).where(db.agents.c.id == row.id).values(revoked_at=now))
        ledger.append_event(conn, "token_revoked", now, agent_id=row.id)
        changed.append(row.id)
        return {"name": row.name, "revoked_at": now}

    changed: list[int] = []
    try:
        return ledger.transaction(txn)
    finally:  # after the commit: that agent's token only; a lookup that read its old row cannot re-cache it
        for aid in changed:
            ledger.token_cache.invalidate(aid)


def rotate(ledger: Ledger, name: str) -> str:
    """A new token for the agent (the old one stops working at once; a revoked agent is reinstated)."""
    token = new_token()

    def txn(conn: Connection) -> None:
        row = agent_row(conn, name)
        values = {"token_hash": hash_token(token), "revoked_at": None}
        conn.execute(update(db.agents).where(db.agents.c.id == row.id).values(**values))
        data = {"token": token_check(values["token_hash"])}
        ledger.append_event(conn, "token_rotated", ledger.clock(), agent_id=row.id, data=data)
        changed.append(row.id)

    changed: list[int] = []
    try:
        ledger.transaction(txn)
    finally:  # after the commit, as revoke
        for aid in changed:
            ledger.token_cache.invalidate(aid)
    ledger.token_cache.allow(hash_token(token))
    return token


def agent_row(conn: Connection, name: str):
    """The agent's row, locked for the rest of the transaction (404 unknown; the operator is no agent)."""
    a = db.agents.c
    row = conn.execute(
        select(db.agents).where((func.lower(a.name) == name.lower()) & (a.role != OPERATOR)).with_for_update()
    ).first()
    if row is None:
        raise ClientError(404, f"name: no agent named {name!r}")
    return row


def authenticate(ledger: Ledger, token: str) -> Principal | None:
    """Who holds `token`; None for an unknown or revoked token. A known token is remembered for
    AUTH_TTL_S (cached_principal); this process's revoke/rotate forget it for every lookup after they
    answered, this one included when it read the row before their commit (tokens.TokenCache). Another
    process's revoke or rotation: its reads accept the old token for at most AUTH_TTL_S, its reports not
    at all (reports.agent_lock compares the token with the locked row's)."""
    key = hash_token(token)
    generation = ledger.token_cache.generation()  # before the read: a change committed after it wins
    with ledger.engine.connect() as conn:
        row = conn.execute(select(db.agents).where(db.agents.c.token_hash == key)).first()
    if row is None or row.revoked_at is not None:
        ledger.token_cache.put_refused(key, generation)  # the next AUTH_TTL_S answer it without a read
        return None
    who = Principal(row.id, row.name, row.role, row.max_wager, row.floor, token_hash=key)
    ledger.token_cache.put(key, who, generation)
    return who


def cached_principal(ledger: Ledger, token_hash: str) -> Principal | None:
    """The principal authenticate found for this token hash less than AUTH_TTL_S ago (no database read:
    the API's hot path), else None."""
    return ledger.token_cache.get(token_hash)


def recently_refused(ledger: Ledger, token_hash: str) -> bool:
    """Whether authenticate refused this token hash less than AUTH_TTL_S ago (no database read)."""
    return ledger.token_cache.refused(token_hash)


def agent_summary(ledger: Ledger, agent: Principal) -> dict:
    p, r = db.payouts.c, db.reports.c
    with ledger.engine.connect() as conn:
        balance = conn.execute(select(func.coalesce(func.sum(p.payout), 0.0)).where(p.agent_id == agent.id))
        n_rep = conn.execute(select(func.count()).where(r.agent_id == agent.id)).scalar_one()
        n_pay = conn.execute(select(func.count()).where(p.agent_id == agent.id)).scalar_one()
        balance = float(balance.scalar_one())
    return {
        "id": agent.id,
        "name": agent.name,
        "role": agent.role,
        "balance": balance,
        "n_reports": int(n_rep),
        "n_payouts": int(n_pay),
    }


def agent_payouts(
    ledger: Ledger, agent: Principal, after: int = 0, limit: int = 1000, market_only: bool = False
) -> list[dict]:
    """The agent's own payouts, by round id (`after`: rounds with a larger id only); `market_only`: none of
    a round that is the operator's alone (what the market's API shows)."""
    p = db.payouts.c
    q = select(db.payouts).where((p.agent_id == agent.id) & (p.round_id > after))
    if market_only:
        q = q.join(db.rounds, db.rounds.c.id == p.round_id).where(market_rounds())
    q = q.order_by(p.round_id, p.id).limit(limit)
    with ledger.engine.connect() as conn:
        return [payout_dict(row) for row in conn.execute(q)]


def payout_dict(row) -> dict:
    return {
        "round": row.round_id,
        "seq": row.seq,
        "kind": row.kind,
        "wager": row.wager,
        "score": row.score,
        "baseline": row.baseline,
        "advantage": row.advantage,
        "payout": row.payout,
    }


def agents_overview(ledger: Ledger) -> list[dict]:
    """Every agent with its balance and counts (operator view)."""
    a, p, r = db.agents.c, db.payouts.c, db.reports.c
    bal = (
        select(p.agent_id, func.sum(p.payout).label("balance"), func.count().label("n_payouts"))
        .group_by(p.agent_id)
        .subquery()
    )
    rep = select(r.agent_id, func.count().label("n_reports")).group_by(r.agent_id).subquery()
    q = (
        select(a.id, a.name, a.role, bal.c.balance, bal.c.n_payouts, rep.c.n_reports)
        .outerjoin(bal, bal.c.agent_id == a.id)
        .outerjoin(rep, rep.c.agent_id == a.id)
        .where(a.role != OPERATOR)
        .order_by(a.id)
    )
    with ledger.engine.connect() as conn:
        return [
            {
                "id": row.id,
                "name": row.name,
                "balance": float(row.balance or 0.0),
                "n_reports": int(row.n_reports or 0),
                "n_payouts": int(row.n_payouts or 0),
            }
            for row in conn.execute(q)
        ]
