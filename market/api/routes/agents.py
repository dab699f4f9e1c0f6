"""Accounts: an agent's own balance and payouts; the operator registers agents and reads every balance and
the dashboard's statistics.

    GET  /me, GET /me/payouts?after=ID&limit=N   own balance and payouts
    POST /agents                  operator   AgentIn -> {name, token} (the token is shown once)
    GET  /agents                  operator   balances
POST /agents/{name}/revoke    operator   the agent's token is refused from now on
POST /agents/{name}/rotate    operator   -> {name, token}: a new token, the old one refused
    GET  /market                  operator   statistics for the dashboard (stats.py)
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from walla.market.api._deps import AfterId, CurrentPrincipal, LedgerDep, Operator
from walla.market.api._models import DIGITS, AgentIn, AgentOut, AgentToken, MeOut, PayoutOut
from walla.market.api.routes import within_budget
from walla.market.stats import market_stats
from walla.market.text import NAME_PATTERN

router = APIRouter(tags=["agents"])


@router.get("/me")
def me(ledger: LedgerDep, who: CurrentPrincipal) -> MeOut:
    return ledger.agent_summary(who)


@router.get("/me/payouts")
def my_payouts(
    ledger: LedgerDep,
    who: CurrentPrincipal,
    after: AfterId = 0,
    limit: Annotated[int, Query(ge=1, le=10000), DIGITS] = 1000,
) -> list[PayoutOut]:
    return within_budget(ledger.agent_payouts(who, after, limit, market_only=True), group="round")


@router.post("/agents", status_code=201)
def add_agent(body: AgentIn, ledger: LedgerDep, _: Operator) -> AgentToken:
    token = ledger.add_agent(body.name, max_wager=body.max_wager, floor=body.floor)
    return AgentToken(name=body.name, token=token)


AgentPath = Annotated[str, Path(pattern=NAME_PATTERN, max_length=64)]


@router.post("/agents/{name}/revoke")
def revoke(name: AgentPath, ledger: LedgerDep, _: Operator) -> dict:
    return ledger.revoke(name)


@router.post("/agents/{name}/rotate")
def rotate(name: AgentPath, ledger: LedgerDep, _: Operator) -> AgentToken:
    return AgentToken(name=name, token=ledger.rotate(name))


@router.get("/agents")
def agents(ledger: LedgerDep, _: Operator) -> list[AgentOut]:
    return ledger.agents_overview()


@router.get("/market")
def market(ledger: LedgerDep, _: Operator) -> dict:
    return market_stats(ledger)
