"""A served forecast's round is one ledger transaction (issue 45): opened, every report written and closed
together, or nothing at all; its events are those of an opening, each report and a close, so the audit
reads it as any other round; and it is the operator's alone (the agents' endpoints never show it)."""

from __future__ import annotations

import pytest
from market_fixtures import snapshot
from walla.market.api import ClientError, RoundSettings
from walla.market.audit import audit
from walla.market.ledger import OPERATOR_ONLY, Ledger, reports


def _agents(ledger: Ledger, n: int = 3):
    return [ledger.authenticate(ledger.add_agent(f"served{i}")) for i in range(n)]


def test_a_closed_round_with_its_reports_is_one_transaction(database):
    ledger = Ledger.open(database)
    try:
        ledger.ensure_operator()
        agents = _agents(ledger)
        rows = [(a, [0.7 - 0.1 * i, 0.3 + 0.1 * i], 0.2 + 0.1 * i) for i, a in enumerate(agents)]
        rnd = ledger.record_closed_round(
            "Is it red?", ["yes", "no"], RoundSettings(), rows, source="walla serve x"
        )
        assert rnd["status"] == "closed" and rnd["n_reports"] == 3 and rnd["publish_pool"] == OPERATOR_ONLY
        kinds = [e["kind"] for e in _events(ledger, rnd["id"])]
        assert kinds == ["round_opened", "report", "report", "report", "round_closed"]
        ledger.resolve(rnd["id"], 0, [1.0, 0.0])
        problem, summary = audit(ledger)
        assert problem is None and summary["rounds"] == 1, problem
    finally:
        ledger.close()


def test_a_failure_between_the_reports_leaves_nothing(database, monkeypatch):
    """Before, the opening, each report and the close were transactions of their own: a failure on the
    second report left an open round with one report (voided only at the next start)."""
    ledger = Ledger.open(database)
    try:
        ledger.ensure_operator()
        agents = _agents(ledger)
        before = snapshot(ledger)
        write = reports.write_report
        calls = []

        def second_fails(*args, **kw):
            calls.append(1)
            if len(calls) == 2:
                raise ClientError(401, "authorization: unknown or revoked token")
            return write(*args, **kw)

        monkeypatch.setattr(reports, "write_report", second_fails)
        rows = [(a, [0.5, 0.5], 0.1) for a in agents]
        with pytest.raises(ClientError):
            ledger.record_closed_round("Q?", ["a", "b"], RoundSettings(), rows, source="walla serve x")
        assert snapshot(ledger) == before  # no round, no report, no event
        assert audit(ledger)[0] is None
    finally:
        ledger.close()


def _events(ledger: Ledger, rid: int) -> list[dict]:
    from sqlalchemy import select
    from walla.market import db

    with ledger.engine.connect() as conn:
        q = select(db.events.c.kind).where(db.events.c.round_id == rid).order_by(db.events.c.id)
        return [{"kind": k} for k in conn.execute(q).scalars()]
