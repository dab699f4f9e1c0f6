"""The market's ledger: every agent, round, report, resolution and payout, in one database (db.py).

    ledger = Ledger.open("market.db")                       # or a postgresql:// URL
    token = ledger.add_agent("alice")                        # printed once; only its sha256 is stored
    rid = ledger.open_round("Is it red?", ["yes", "no"], RoundSettings())["id"]
    ledger.submit_report(rid, agent_id, [0.8, 0.2], 0.3)     # replaces the agent's report until close
    ledger.resolve(rid, label=0, target=[1.0, 0.0])          # pays once, in one transaction

Invariants (each enforced by one transaction and a uniqueness constraint, not by the caller's care):
    * one current report per (round, agent); a report is accepted only while its round is open
      (status open and before close_at) -- checked inside the transaction that writes it;
    * a resolution is one transaction: resolution row + every payout row + the round's status, or
      nothing. Retrying with the same answer returns the recorded result and pays nothing; another
      answer is refused (409). resolutions.round_id is the primary key, so two racing resolvers cannot
      both commit;
    * a round's total net payout (the market's deficit for it) is recorded with its bound c2^2/c3.
Concurrency: writers start with BEGIN IMMEDIATE on SQLite (one writer at a time, readers never blocked);
on PostgreSQL the round's row is locked FOR UPDATE to resolve/close and FOR SHARE to submit, so a report
can never slip in after the resolution read the reports.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, bindparam, func, insert, select, update
from sqlalchemy.exc import IntegrityError, OperationalError
from walla.market import db, events
from walla.market.errors import ClientError, bad
from walla.market.models import RoundSettings
from walla.market.payouts import pooled_forecast, round_payouts, worst_payout

OPERATOR = "operator"
OPEN_STATES = ("open", "closed")  # a round whose reports are not yet paid (or voided)
RETRIES = 5  # a write that lost a race (unique key, deadlock, serialization) is retried from scratch
SAME_ANSWER_ATOL = 1e-12
# how long a token found valid is trusted without a database read; a revoke or rotation by this process
# takes effect at once, one by another process (a second server on the same database) within this long
AUTH_TTL_S = 2.0
# what every round's opening event records: its question and the mechanism's settings, walla's version
ROUND_STAMP = (
    "question",
    "options",
    "settings",
    "deficit_bound",
    "close_at",
    "publish_pool",
    "max_wager",
    "criteria",
    "source",
    "walla_version",
)


class LedgerInvariantError(RuntimeError):
    """A write that would break a money invariant (a non-finite score, payout or bound): refused and rolled
    back. The API's types make it unreachable from a client; reaching it is a bug, answered 500."""


def check_finite(what: str, values) -> None:
    """Raise LedgerInvariantError unless every value is a finite float (called inside the writing txn)."""
    for i, v in enumerate(values):
        if not math.isfinite(v):
            raise LedgerInvariantError(f"{what}[{i}]: {v} is not finite; nothing was written")


def walla_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("walla")
    except PackageNotFoundError:  # a source checkout that was never installed
        return "unknown"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_token() -> str:
    return "wm_" + secrets.token_urlsafe(32)


@dataclass(frozen=True)
class Principal:
    """Who sent a request: an agent or the operator."""

    id: int
    name: str
    role: str
    max_wager: float | None = None
    floor: float | None = None

    @property
    def is_operator(self) -> bool:
        return self.role == OPERATOR


def _dumps(values: list) -> str:
    return json.dumps(values, separators=(",", ":"))  # floats as repr: exact round trip


# the hot path (a report per agent per round) runs prebuilt statements with parameter dicts
REPORT_INSERT = insert(db.reports)
REPORT_UPDATE = update(db.reports).where(db.reports.c.id == bindparam("report_id"))


def _same(old: list[float], new: list[float]) -> bool:
    return len(old) == len(new) and all(abs(a - b) <= SAME_ANSWER_ATOL for a, b in zip(old, new, strict=True))


def _settings(row) -> RoundSettings:
    return RoundSettings.model_construct(  # stored values: checked when they were written
        variant=row.variant, c1=row.c1, c2=row.c2, c3=row.c3, pooling=row.pooling
    )


class Ledger:
    """All reads and writes of the market's database; raises ClientError for what a client got wrong."""

    def __init__(self, engine: Engine, clock: Callable[[], float] = time.time) -> None:
        self.engine = engine
        self.writer = engine.execution_options(**db.WRITE)
        self.clock = clock
        self.version = walla_version()
        # SQLite has one writer at a time and makes waiters poll (sleeps of up to 100 ms: p99 spikes of ~1 s
        # under 16 concurrent writers); queueing this process's writers on a lock instead keeps waits short.
        # Other processes (the CLI) still meet SQLite's busy timeout. PostgreSQL: row locks, no queue.
        sqlite = engine.dialect.name == "sqlite"
        self._queue = threading.Lock() if sqlite else contextlib.nullcontext()
        # SQLite: this process's writers run one at a time (the lock above), so the event chain's last link
        # is kept here and an append is one INSERT; another process's append makes it stale, and the insert
        # then fails on the events' primary key and the transaction is retried with the link read afresh.
        self._sqlite = sqlite
        self._auth: dict[str, tuple[Principal, float]] = {}  # token hash -> (principal, expiry): authenticate
        self._head: tuple[int, str] | None = None
        self._pending: tuple[int, str] | None = None

    @classmethod
    def open(cls, database: str | Path) -> Ledger:
        return cls(db.make_engine(database))

    def close(self) -> None:
        self.engine.dispose()

    def _write(self, fn: Callable[[Connection], Any]) -> Any:
        """fn(conn) in one write transaction, retried when it lost a race to another writer."""
        for attempt in range(RETRIES):
            try:
                with self._queue:
                    self._pending = None
                    try:
                        with self.writer.begin() as conn:
                            out = fn(conn)
                    except (IntegrityError, OperationalError):
                        self._head = None  # maybe a stale link (another process appended): read it again
                        raise
                    if self._pending is not None:
                        self._head = self._pending
                    return out
            except (IntegrityError, OperationalError):
                if attempt == RETRIES - 1:
                    raise
                time.sleep(0.01 * (attempt + 1))
        raise AssertionError("unreachable")

    def _append(self, conn: Connection, kind: str, at: float, **kw) -> None:
        """Append one event to the hash chain inside the caller's write transaction (events.py)."""
        head = (self._pending or self._head) if self._sqlite else None
        link = events.append(conn, kind, at, head=head, **kw)
        if self._sqlite:
            self._pending = link

    # ------------------------------------------------------------------------------------------ agents

    def add_agent(
        self,
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
            now = self.clock()
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
            limits = {"name": name, "role": role, "max_wager": max_wager, "floor": floor}
            self._append(conn, "agent_added", now, agent_id=aid, data=limits)

        self._write(txn)
        return token

    def ensure_operator(self, token: str | None = None) -> str | None:
        """The operator's credentials: set to `token` when given (replacing the old one), else created once.

        Returns the token when this call created or set it, None when an operator already existed.
        """

        def txn(conn: Connection) -> str | None:
            row = conn.execute(select(db.agents).where(db.agents.c.role == OPERATOR)).first()
            if token is None and row is not None:
                return None
            new = token or new_token()
            owner = conn.execute(select(db.agents).where(db.agents.c.token_hash == hash_token(new))).first()
            if owner is not None and owner.role != OPERATOR:
                raise bad("operator token", f"is agent {owner.name!r}'s token; choose another", 409)
            if row is None:
                taken = conn.execute(
                    select(db.agents).where(func.lower(db.agents.c.name) == OPERATOR)
                ).first()
                if taken is not None:
                    raise bad(
                        "operator",
                        f"an agent named {taken.name!r} holds the operator's name; this ledger cannot get an "
                        "operator (start a new one with `walla market init` before add-agent)",
                        409,
                    )
            now = self.clock()
            if row is None:
                aid = conn.execute(
                    insert(db.agents).values(
                        name=OPERATOR, token_hash=hash_token(new), role=OPERATOR, created_at=now
                    )
                ).inserted_primary_key[0]
                self._append(conn, "operator_added", now, agent_id=aid)
            elif row.token_hash != hash_token(new):
                conn.execute(
                    update(db.agents).where(db.agents.c.id == row.id).values(token_hash=hash_token(new))
                )
                self._append(conn, "operator_token_set", now, agent_id=row.id)
            return new

        return self._write(txn)

    def revoke(self, name: str) -> dict:
        """Refuse the agent's token from now on (its rows stay); 404 unknown, 409 already revoked."""

        def txn(conn: Connection) -> dict:
            row = self._agent_row(conn, name)
            if row.revoked_at is not None:
                raise ClientError(409, f"name: {row.name}'s token is already revoked")
            now = self.clock()
            conn.execute(update(db.agents).where(db.agents.c.id == row.id).values(revoked_at=now))
            self._auth.clear()
            self._append(conn, "token_revoked", now, agent_id=row.id)
            return {"name": row.name, "revoked_at": now}

        return self._write(txn)

    def rotate(self, name: str) -> str:
        """A new token for the agent (the old one stops working at once; a revoked agent is reinstated)."""
        token = new_token()

        def txn(conn: Connection) -> None:
            row = self._agent_row(conn, name)
            values = {"token_hash": hash_token(token), "revoked_at": None}
            conn.execute(update(db.agents).where(db.agents.c.id == row.id).values(**values))
            self._auth.clear()
            self._append(conn, "token_rotated", self.clock(), agent_id=row.id)

        self._write(txn)
        return token

    def _agent_row(self, conn: Connection, name: str):
        a = db.agents.c
        row = conn.execute(
            select(db.agents)
            .where((func.lower(a.name) == name.lower()) & (a.role != OPERATOR))
            .with_for_update()
        ).first()
        if row is None:
            raise ClientError(404, f"name: no agent named {name!r}")
        return row

    def authenticate(self, token: str) -> Principal | None:
        """Who holds `token`; None for an unknown or revoked token. A known token is remembered for
        AUTH_TTL_S (cached_principal); this process's revoke/rotate forget it at once."""
        key = hash_token(token)
        with self.engine.connect() as conn:
            row = conn.execute(select(db.agents).where(db.agents.c.token_hash == key)).first()
        if row is None or row.revoked_at is not None:
            return None
        who = Principal(row.id, row.name, row.role, row.max_wager, row.floor)
        if len(self._auth) > 10_000:
            self._auth.clear()
        self._auth[key] = (who, time.monotonic() + AUTH_TTL_S)
        return who

    def cached_principal(self, token_hash: str) -> Principal | None:
        """The principal authenticate found for this token hash less than AUTH_TTL_S ago (no database read:
        the API's hot path), else None."""
        hit = self._auth.get(token_hash)
        return hit[0] if hit is not None and hit[1] > time.monotonic() else None

    # ------------------------------------------------------------------------------------------ rounds

    def _status(self, row) -> str:
        if row.status == "open" and row.close_at is not None and self.clock() >= row.close_at:
            return "closed"
        return row.status

    def _round_row(self, conn: Connection, rid: int, lock: str | None = None):
        q = select(db.rounds).where(db.rounds.c.id == rid)
        if lock is not None:
            q = q.with_for_update(read=lock == "share")
        row = conn.execute(q).first()
        if row is None:
            raise ClientError(404, f"round: no round {rid}")
        return row

    def _round_dict(self, conn: Connection, row) -> dict:
        n = conn.execute(select(func.count()).where(db.reports.c.round_id == row.id)).scalar_one()
        out = {
            "id": row.id,
            "question": row.question,
            "options": json.loads(row.options),
            "settings": _settings(row).as_dict(),
            "deficit_bound": _settings(row).deficit_bound,
            "status": self._status(row),
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
            out["resolution"] = self._resolution_dict(self._current(conn, row.id))
        return out

    @staticmethod
    def _resolution_dict(res) -> dict:
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
        self,
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
        now = self.clock()
        if close_at is not None and close_at <= now:
            raise bad("close_at", f"must be in the future (unix seconds > {now:.0f}), got {close_at}")
        values = settings.as_dict()
        check_finite("round settings", [values["c1"], values["c2"], values["c3"]])

        def txn(conn: Connection) -> dict:
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
                    walla_version=self.version,
                    **values,
                )
            ).inserted_primary_key[0]
            rnd = self._round_dict(conn, self._round_row(conn, rid))
            stamped = {k: rnd[k] for k in ROUND_STAMP}
            self._append(conn, "round_opened", now, round_id=rid, data=stamped)
            return rnd

        return self._write(txn)

    def get_round(self, rid: int) -> dict:
        with self.engine.connect() as conn:
            return self._round_dict(conn, self._round_row(conn, rid))

    def round_options(self, rid: int) -> int:
        """The round's option count (for validating a body before the write); 404 when unknown."""
        with self.engine.connect() as conn:
            return int(self._round_row(conn, rid).n_options)

    def list_rounds(self, status: str | None = None, after: int = 0, limit: int = 100) -> list[dict]:
        now = self.clock()
        c = db.rounds.c
        q = select(db.rounds).where(c.id > after).order_by(c.id).limit(limit)
        before_close = c.close_at.is_(None) | (c.close_at > now)
        if status == "open":
            q = q.where((c.status == "open") & before_close)
        elif status == "closed":
            q = q.where((c.status == "closed") | ((c.status == "open") & ~before_close))
        elif status in ("resolved", "void"):
            q = q.where(c.status == status)
        elif status is not None:
            raise bad("status", f"expected open, closed, resolved or void, got {status!r}")
        with self.engine.connect() as conn:
            return [self._round_dict(conn, row) for row in conn.execute(q)]

    def close_round(self, rid: int) -> dict:
        def txn(conn: Connection) -> dict:
            row = self._round_row(conn, rid, lock="update")
            if row.status in ("resolved", "void"):
                raise ClientError(409, f"round: round {rid} is already {row.status}")
            if row.status == "open":
                now = self.clock()
                closed = min(now, row.close_at) if row.close_at is not None else now
                conn.execute(
                    update(db.rounds).where(db.rounds.c.id == rid).values(status="closed", closed_at=closed)
                )
                self._append(conn, "round_closed", now, round_id=rid, data={"closed_at": closed})
            return self._round_dict(conn, self._round_row(conn, rid))

        return self._write(txn)

    # ------------------------------------------------------------------------------------------ reports

    def submit_report(self, rid: int, agent: Principal, probs: list[float], wager: float) -> dict:
        """Write or replace `agent`'s report; 409 when the round is no longer open (checked in the txn)."""
        if agent.is_operator:
            raise ClientError(
                403, "authorization: the operator does not submit reports; use an agent's token"
            )

        def txn(conn: Connection) -> dict:
            row = self._round_row(conn, rid, lock="share")
            status = self._status(row)
            if status != "open":
                raise ClientError(
                    409, f"round: round {rid} is {status}; reports are accepted only while open"
                )
            if len(probs) != row.n_options:
                raise bad(
                    "probabilities", f"expected {row.n_options} numbers (one per option), got {len(probs)}"
                )
            check_finite("report", [*probs, wager])
            self._check_limits(conn, row, agent, wager)
            r = db.reports.c
            old = conn.execute(
                select(db.reports).where((r.round_id == rid) & (r.agent_id == agent.id))
            ).first()
            values = {"probabilities": _dumps(probs), "wager": wager, "submitted_at": self.clock()}
            if old is None:
                version = 1
                conn.execute(REPORT_INSERT, {"round_id": rid, "agent_id": agent.id, "version": 1, **values})
            else:
                version = old.version + 1
                conn.execute(REPORT_UPDATE, {"report_id": old.id, "version": version, **values})
            self._append(
                conn,
                "report",
                values["submitted_at"],
                round_id=rid,
                agent_id=agent.id,
                data={"probabilities": probs, "wager": wager, "version": version},
            )
            return {
                "round": rid,
                "agent": agent.name,
                "probabilities": probs,
                "wager": wager,
                "version": version,
            }

        return self._write(txn)

    def _check_limits(self, conn: Connection, row, agent: Principal, wager: float) -> None:
        """The round's and the agent's maximum wager, and the agent's floor: its balance minus the worst-case
        loss of every unpaid report (this one instead of its old report) may not go below it (409)."""
        for who, cap in (("round", row.max_wager), ("agent", agent.max_wager)):
            if cap is not None and wager > cap:
                raise bad("wager", f"{wager:g} is over the {who}'s maximum wager {cap:g}", 409)
        if agent.floor is None:
            return
        p, r, rd = db.payouts.c, db.reports.c, db.rounds.c
        balance = conn.execute(select(func.coalesce(func.sum(p.payout), 0.0)).where(p.agent_id == agent.id))
        unpaid = conn.execute(
            select(r.wager, rd.c2, rd.c3)
            .join(db.rounds, rd.id == r.round_id)
            .where((r.agent_id == agent.id) & rd.status.in_(OPEN_STATES) & (r.round_id != row.id))
        )
        worst = float(balance.scalar_one()) + sum(worst_payout(u.wager, u.c2, u.c3) for u in unpaid)
        worst += worst_payout(wager, row.c2, row.c3)
        if worst < agent.floor:
            raise bad(
                "wager",
                f"{wager:g} could take {agent.name}'s balance to {worst:.6g}, below its floor {agent.floor:g}",
                409,
            )

    def report_history(self, rid: int) -> list[dict]:
        """Every submission of a round, replacements included, in the order they were made (operator): the
        round's report events."""
        e, a = db.events.c, db.agents.c
        q = (
            select(e.at, e.agent_id, e.data, a.name)
            .join(db.agents, a.id == e.agent_id)
            .where((e.round_id == rid) & (e.kind == "report"))
            .order_by(e.id)
        )
        with self.engine.connect() as conn:
            self._round_row(conn, rid)
            return [
                {"round": rid, "agent": row.name, **json.loads(row.data), "submitted_at": row.at}
                for row in conn.execute(q)
            ]

    def get_report(self, rid: int, agent: Principal) -> dict:
        with self.engine.connect() as conn:
            self._round_row(conn, rid)
            r = db.reports.c
            row = conn.execute(
                select(db.reports).where((r.round_id == rid) & (r.agent_id == agent.id))
            ).first()
        if row is None:
            raise ClientError(404, f"report: {agent.name} has no report in round {rid}")
        return self._report_dict(row, agent.name)

    @staticmethod
    def _report_dict(row, name: str) -> dict:
        return {
            "round": row.round_id,
            "agent": name,
            "probabilities": json.loads(row.probabilities),
            "wager": row.wager,
            "version": row.version,
            "submitted_at": row.submitted_at,
        }

    def _reports(self, conn: Connection, rid: int) -> list:
        """The round's reports with agent names, in agent-id order (the order payouts are computed in)."""
        q = (
            select(db.reports, db.agents.c.name)
            .join(db.agents, db.agents.c.id == db.reports.c.agent_id)
            .where(db.reports.c.round_id == rid)
            .order_by(db.reports.c.agent_id)
        )
        return list(conn.execute(q))

    def round_reports(self, rid: int) -> list[dict]:
        """Every report of a round (the server shows them to agents only after resolution)."""
        with self.engine.connect() as conn:
            self._round_row(conn, rid)
            return [self._report_dict(row, row.name) for row in self._reports(conn, rid)]

    def is_resolved(self, rid: int) -> bool:
        with self.engine.connect() as conn:
            return self._round_row(conn, rid).status == "resolved"

    def pooled(self, rid: int, viewer: Principal) -> dict:
        """The wager-weighted pool of the round's current reports (payouts.pooled_forecast).

        The operator's at any time, with the per-report weights. An agent's only once the round's
        `publish_pool` allows (at close or after resolution; 403 before, or never), and without the weights:
        with the pool, the weights and its own report an agent could solve for another's open report.
        """
        with self.engine.connect() as conn:
            row = self._round_row(conn, rid)
            if not viewer.is_operator:
                status = self._status(row)
                published = (row.publish_pool == "close" and status in ("closed", "resolved")) or (
                    row.publish_pool == "resolution" and status == "resolved"
                )
                if not published:
                    when = {"close": "it closes", "resolution": "it is resolved"}.get(row.publish_pool)
                    what = f"private until {when}" if when else "not published to agents"
                    raise ClientError(403, f"round: the pooled forecast of round {rid} is {what}")
            reps = self._reports(conn, rid)
        probs = [json.loads(r.probabilities) for r in reps]
        out = {"round": rid, **pooled_forecast(probs, [r.wager for r in reps], row.pooling, row.n_options)}
        if not viewer.is_operator:
            out["weights"] = None
        return out

    # ------------------------------------------------------------------------------------------ resolution

    def resolve(self, rid: int, label: int | None, target: list[float], note: str | None = None) -> dict:
        """Resolve a round with its answer and pay every report, in one transaction (see module docstring).
        Every score, payout and the bound must be finite, or nothing is written (LedgerInvariantError)."""

        def txn(conn: Connection) -> dict:
            row = self._round_row(conn, rid, lock="update")
            if len(target) != row.n_options:
                raise bad("target", f"expected {row.n_options} numbers (one per option), got {len(target)}")
            if row.status == "void":
                raise ClientError(409, f"round: round {rid} is void ({self._current(conn, rid).note})")
            if row.status == "resolved":
                return self._already_resolved(conn, rid, label, target)
            out = self._entry(conn, row, "resolve", 1, label, target, note, reverse=[])
            at = out.pop("at")
            conn.execute(
                update(db.rounds)
                .where(db.rounds.c.id == rid)
                .values(status="resolved", closed_at=row.closed_at or at)
            )
            return out

        return self._write(txn)

    def correct(self, rid: int, label: int | None, target: list[float], note: str | None = None) -> dict:
        """Correct a resolved round's answer: append rows reversing every payout of the current resolution, a new
        resolution entry and its payouts from the stored reports -- never an edit or a delete. 409 when the
        round is not resolved or the answer is the current one."""

        def txn(conn: Connection) -> dict:
            row = self._round_row(conn, rid, lock="update")
            if len(target) != row.n_options:
                raise bad("target", f"expected {row.n_options} numbers (one per option), got {len(target)}")
            if row.status != "resolved":
                raise ClientError(
                    409, f"round: round {rid} is {self._status(row)}; only a resolved round is corrected"
                )
            cur = self._current(conn, rid)
            if _same(json.loads(cur.target), target):
                raise bad(
                    "label" if label is not None else "target", f"round {rid} is already resolved so", 409
                )
            out = self._entry(
                conn, row, "correct", cur.seq + 1, label, target, note, self._paid(conn, rid, cur.seq)
            )
            out.pop("at")
            return out

        return self._write(txn)

    def void(self, rid: int, reason: str) -> dict:
        """Void a round: no payouts (a resolved round's are reversed by appended rows), the reason recorded,
        reports refused from then on. 409 when it is void already."""

        def txn(conn: Connection) -> dict:
            row = self._round_row(conn, rid, lock="update")
            if row.status == "void":
                raise ClientError(409, f"round: round {rid} is already void")
            cur = self._current(conn, rid) if row.status == "resolved" else None
            seq = cur.seq + 1 if cur is not None else 1
            paid = self._paid(conn, rid, cur.seq) if cur is not None else []
            at = self._entry(conn, row, "void", seq, None, [], reason, paid)["at"]
            conn.execute(
                update(db.rounds)
                .where(db.rounds.c.id == rid)
                .values(status="void", closed_at=row.closed_at or at)
            )
            return self._round_dict(conn, self._round_row(conn, rid))

        return self._write(txn)

    def _current(self, conn: Connection, rid: int):
        """The round's latest resolutions entry (None before any)."""
        r = db.resolutions.c
        return conn.execute(
            select(db.resolutions).where(r.round_id == rid).order_by(r.seq.desc()).limit(1)
        ).first()

    def _paid(self, conn: Connection, rid: int, seq: int) -> list:
        """The pay rows of entry `seq` (what a correction or a void reverses), in agent-id order."""
        p = db.payouts.c
        q = select(db.payouts).where((p.round_id == rid) & (p.seq == seq) & (p.kind == "pay"))
        return list(conn.execute(q.order_by(p.agent_id)))

    def _entry(
        self, conn: Connection, row, kind: str, seq: int, label, target: list[float], note, reverse: list
    ) -> dict:
        """One resolutions entry with its payout rows: `reverse` rows negated, then (unless a void) a pay row per
        report computed from the stored reports. Every number is checked finite before anything is written."""
        rid = row.id
        reps = self._reports(conn, rid) if kind != "void" else []
        s = _settings(row)
        pay = round_payouts([json.loads(r.probabilities) for r in reps], [r.wager for r in reps], target, s)
        for what, values in vars(pay).items():
            check_finite(what, values)
        check_finite("total and bound", [pay.total, s.deficit_bound])
        total = pay.total  # the round's outlay under this entry: its rows net of the reversals sum to it
        now = self.clock()
        conn.execute(
            insert(db.resolutions).values(
                round_id=rid,
                seq=seq,
                kind=kind,
                label=label,
                target=_dumps(target),
                n_reports=len(reps),
                total_payout=total,
                deficit_bound=s.deficit_bound,
                resolved_at=now,
                note=note,
            )
        )
        rows = [
            {
                "round_id": rid,
                "seq": seq,
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
                "round_id": rid,
                "seq": seq,
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
        paid = {r.name: pay.payout[i] for i, r in enumerate(reps)}
        self._append(
            conn,
            {"resolve": "resolved", "correct": "resolution_corrected", "void": "round_voided"}[kind],
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
            "payouts": paid,
            "at": now,
        }

    def _already_resolved(self, conn: Connection, rid: int, label: int | None, target: list[float]) -> dict:
        res = self._current(conn, rid)
        old = json.loads(res.target)
        if not _same(old, target):
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
        paid = {r.name: r.payout for r in conn.execute(q)}
        return {
            "round": rid,
            "resolved_now": False,
            "total_payout": res.total_payout,
            "deficit_bound": res.deficit_bound,
            "n_reports": res.n_reports,
            "payouts": paid,
        }

    # ------------------------------------------------------------------------------------------ accounts

    def agent_summary(self, agent: Principal) -> dict:
        p, r = db.payouts.c, db.reports.c
        with self.engine.connect() as conn:
            balance = conn.execute(
                select(func.coalesce(func.sum(p.payout), 0.0)).where(p.agent_id == agent.id)
            )
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

    def agent_payouts(self, agent: Principal, after: int = 0, limit: int = 1000) -> list[dict]:
        """The agent's own payouts, by round id (`after`: rounds with a larger id only)."""
        p = db.payouts.c
        q = (
            select(db.payouts)
            .where((p.agent_id == agent.id) & (p.round_id > after))
            .order_by(p.round_id, p.id)
            .limit(limit)
        )
        with self.engine.connect() as conn:
            return [self._payout_dict(row) for row in conn.execute(q)]

    @staticmethod
    def _payout_dict(row) -> dict:
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

    def agents_overview(self) -> list[dict]:
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
        with self.engine.connect() as conn:
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

    def counts(self) -> dict[str, int]:
        """Row counts of every table (audits and the load test)."""
        with self.engine.connect() as conn:
            return {
                t.name: int(conn.execute(select(func.count()).select_from(t)).scalar_one())
                for t in db.metadata.sorted_tables
            }
