"""Reports: an agent submits, replaces and reads its own; every report of a round is the operator's, and an
agent's to read once the round is resolved.

    PUT  /rounds/{id}/report      agent      ReportIn: submit or replace while open
    GET  /rounds/{id}/report      agent      its own report
    GET  /rounds/{id}/reports                operator any time; agents once resolved
    GET  /rounds/{id}/history     operator   every submission and replacement, with its time
"""

from __future__ import annotations

from fastapi import APIRouter
from walla.market.api._deps import CurrentPrincipal, LedgerDep, Operator, RoundId
from walla.market.api._errors import ClientError
from walla.market.api._models import ReportIn, ReportOut

router = APIRouter(prefix="/rounds", tags=["reports"])


@router.put("/{rid}/report")
def submit(rid: RoundId, body: ReportIn, ledger: LedgerDep, who: CurrentPrincipal) -> ReportOut:
    return ledger.submit_report(rid, who, list(body.probabilities), body.wager)


@router.get("/{rid}/report")
def own_report(rid: RoundId, ledger: LedgerDep, who: CurrentPrincipal) -> ReportOut:
    return ledger.get_report(rid, who)


@router.get("/{rid}/reports")
def all_reports(rid: RoundId, ledger: LedgerDep, who: CurrentPrincipal) -> list[ReportOut]:
    if not who.is_operator and not ledger.is_resolved(rid, viewer=who):
        raise ClientError(403, f"round: reports of round {rid} are private until it is resolved")
    return ledger.round_reports(rid, viewer=who)


@router.get("/{rid}/history")
def history(rid: RoundId, ledger: LedgerDep, _: Operator) -> list[ReportOut]:
    return ledger.report_history(rid)
