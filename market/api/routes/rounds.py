"""Rounds: list, open, read, close, resolve, and the pooled forecast (the operator's while the round is open).

GET  /rounds?status=open|closed|resolved&after=ID&limit=N     everyone (agents: not the operator's own rounds;
                                                              at most LIST_BUDGET bytes a page)
POST /rounds                  operator   RoundIn -> RoundOut
GET  /rounds/{id}                        one round (its resolution once resolved)
POST /rounds/{id}/close       operator
POST /rounds/{id}/resolve     operator   ResolutionIn: pays once, idempotent
POST /rounds/{id}/correct     operator   ResolutionIn: reverses the paid rows, pays the new answer
POST /rounds/{id}/void        operator   VoidIn {reason}: no payouts (paid ones reversed)
GET  /rounds/{id}/pool                   operator; agents once the round's publish_pool allows, no weights
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query
from walla.market.api._deps import AfterId, CurrentPrincipal, LedgerDep, Operator, RoundId
from walla.market.api._errors import bad
from walla.market.api._models import DIGITS, PoolOut, ResolutionIn, ResolutionOut, RoundIn, RoundOut, VoidIn
from walla.market.api.routes import within_budget
from walla.market.ledger import Principal

router = APIRouter(prefix="/rounds", tags=["rounds"])


def for_viewer(rnd: dict, who: Principal) -> dict:
    """A round as `who` may see it: agents do not learn how many reports an unresolved round holds."""
    if not who.is_operator and rnd["status"] != "resolved":
        return {**rnd, "n_reports": None}
    return rnd


@router.get("")
def list_rounds(
    ledger: LedgerDep,
    who: CurrentPrincipal,
    status: Literal["open", "closed", "resolved", "void"] | None = None,
    after: AfterId = 0,
    limit: Annotated[int, Query(ge=1, le=1000), DIGITS] = 100,
) -> list[RoundOut]:
    return within_budget([for_viewer(r, who) for r in ledger.list_rounds(status, after, limit, viewer=who)])


@router.post("", status_code=201)
def open_round(body: RoundIn, ledger: LedgerDep, _: Operator) -> RoundOut:
    return ledger.open_round(
        body.question,
        list(body.options),
        body.settings,
        body.close_at,
        publish_pool=body.publish_pool,
        max_wager=body.max_wager,
        criteria=body.criteria,
        source=body.source,
    )


@router.get("/{rid}")
def get_round(rid: RoundId, ledger: LedgerDep, who: CurrentPrincipal) -> RoundOut:
    return for_viewer(ledger.get_round(rid, viewer=who), who)


@router.post("/{rid}/close")
def close_round(rid: RoundId, ledger: LedgerDep, _: Operator) -> RoundOut:
    return ledger.close_round(rid)


def _target(ledger, rid: int, body: ResolutionIn) -> list[float]:
    try:
        return body.target_for(ledger.round_options(rid))
    except ValueError as e:
        field, _, what = str(e).partition(": ")
        raise bad(field, what) from None


@router.post("/{rid}/resolve")
def resolve(rid: RoundId, body: ResolutionIn, ledger: LedgerDep, _: Operator) -> ResolutionOut:
    return ledger.resolve(rid, body.label, _target(ledger, rid, body), body.note)


@router.post("/{rid}/correct")
def correct(rid: RoundId, body: ResolutionIn, ledger: LedgerDep, _: Operator) -> ResolutionOut:
    return ledger.correct(rid, body.label, _target(ledger, rid, body), body.note)


@router.post("/{rid}/void")
def void(rid: RoundId, body: VoidIn, ledger: LedgerDep, _: Operator) -> RoundOut:
    return ledger.void(rid, body.reason)


@router.get("/{rid}/pool", response_model_exclude_none=True)
def pool(rid: RoundId, ledger: LedgerDep, who: CurrentPrincipal) -> PoolOut:
    return ledger.pooled(rid, who)
