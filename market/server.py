"""The market's HTTP API (FastAPI), over one Ledger.

    uvicorn: create_app(Ledger.open("market.db"))           # `walla market serve` does this

Auth: `Authorization: Bearer <token>` on every endpoint but GET / (the dashboard page, which asks for the
operator's token and sends it the same way). Operator-only: open/close/resolve rounds, register agents,
read every report and the market's statistics. Agents: read rounds and the pooled forecast, submit and
read their OWN report, read their own payouts and balance; another agent's report only once the round
is resolved.

Errors are JSON `{"error": "<field>: <what is wrong>"}` on one line: 400 malformed body or value, 401
missing/unknown token, 403 not allowed for this token, 404 unknown round/report, 409 state conflict
(closed round, different resolution, taken name), 413 body over MAX_BODY. A server-side bug is a 500
`{"error": "internal error"}`; a client's mistake never is, and a refused write writes nothing.

Endpoints (JSON):
    GET  /rounds?status=open|closed|resolved&after=ID&limit=N     list
    POST /rounds                  operator   {question, options, [variant, c1, c2, c3, pooling, close_at]}
    GET  /rounds/{id}                        one round (with its resolution once resolved)
    POST /rounds/{id}/close       operator
    POST /rounds/{id}/resolve     operator   {label} or {target}: payouts, idempotent
    PUT  /rounds/{id}/report      agent      {probabilities, wager}: submit or replace while open
    GET  /rounds/{id}/report      agent      own report
    GET  /rounds/{id}/reports                operator any time; agents once resolved
    GET  /rounds/{id}/pool                   wager-weighted pooled forecast of the current reports
    GET  /me, GET /me/payouts?after=ID       own balance and payouts
    POST /agents                  operator   {name} -> token (shown once)
    GET  /agents                  operator   balances
    GET  /market                  operator   statistics for the dashboard (stats.py)
    GET  /                                   the dashboard page
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send
from walla.market import validation as v
from walla.market.errors import ClientError
from walla.market.ledger import Ledger, Principal
from walla.market.payouts import pooled_forecast, round_payouts
from walla.market.stats import market_stats

MAX_BODY = 64 * 1024  # bytes; a report of 26 options is < 1 KiB
DASHBOARD = Path(__file__).with_name("dashboard.html")
log = logging.getLogger("walla.market")


class BodyLimit:
    """Refuse a request body over `limit` bytes with 413, by Content-Length or while streaming it in."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            return await _send_error(send, 413, f"body: larger than {self.limit} bytes")
        seen = 0

        async def limited() -> dict:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise ClientError(413, f"body: larger than {self.limit} bytes")
            return message

        await self.app(scope, limited, send)


async def _send_error(send: Send, status: int, message: str) -> None:
    resp = JSONResponse({"error": message}, status_code=status)
    await send({"type": "http.response.start", "status": status, "headers": resp.raw_headers})
    await send({"type": "http.response.body", "body": resp.body})


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": " ".join(str(message).split())}, status_code=status)


def create_app(ledger: Ledger, max_body: int = MAX_BODY) -> FastAPI:
    """The API over `ledger` (see module docstring)."""
    warm_up()
    app = FastAPI(title="walla market", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.ledger = ledger
    _error_handlers(app)
    _routes(app, ledger)
    app.add_middleware(BodyLimit, limit=max_body)
    return app


def warm_up() -> None:
    """One tiny payout and pool through torch before serving: its first call in a process costs ~0.8 s here,
    which would otherwise land on the first resolution."""
    round_payouts([[0.5, 0.5], [0.9, 0.1]], [0.5, 0.1], [1.0, 0.0], v.RoundSettings())
    pooled_forecast([[0.5, 0.5]], [0.5], "log", 2)


def _error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ClientError)
    async def _client(_req: Request, e: ClientError) -> JSONResponse:
        return _error(e.status, e.message)

    @app.exception_handler(StarletteHTTPException)
    async def _http(req: Request, e: StarletteHTTPException) -> JSONResponse:
        what = {
            404: f"path: no endpoint {req.url.path}",
            405: f"method: {req.method} not allowed on {req.url.path}",
        }
        return _error(e.status_code, what.get(e.status_code, str(e.detail)))

    @app.exception_handler(Exception)
    async def _internal(_req: Request, e: Exception) -> JSONResponse:
        log.exception("walla market: internal error")
        return _error(500, "internal error")


def _principal(ledger: Ledger, request: Request) -> Principal:
    header = request.headers.get("authorization")
    if not header:
        raise ClientError(401, "authorization: missing bearer token (header 'Authorization: Bearer <token>')")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ClientError(401, "authorization: expected 'Bearer <token>'")
    who = ledger.authenticate(token.strip())
    if who is None:
        raise ClientError(401, "authorization: unknown token")
    return who


def _operator(who: Principal) -> None:
    if not who.is_operator:
        raise ClientError(403, "authorization: this endpoint needs the operator's token")


def _int_query(request: Request, key: str, default: int, lo: int, hi: int) -> int:
    raw = request.query_params.get(key)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ClientError(400, f"{key}: expected an integer, got {raw[:40]!r}") from None
    if not lo <= value <= hi:
        raise ClientError(400, f"{key}: expected {lo}..{hi}, got {value}")
    return value


Handler = Callable[..., Awaitable]


def _routes(app: FastAPI, ledger: Ledger) -> None:
    """Every endpoint; blocking ledger calls run in the threadpool."""

    async def who(request: Request) -> Principal:
        return await run_in_threadpool(_principal, ledger, request)

    async def body(request: Request) -> dict:
        return v.parse_json(await request.body())

    _round_routes(app, ledger, who, body)
    _account_routes(app, ledger, who, body)


def _round_routes(app: FastAPI, ledger: Ledger, who: Handler, body: Handler) -> None:
    call = run_in_threadpool

    @app.get("/", response_class=HTMLResponse)
    async def dashboard() -> HTMLResponse:
        return HTMLResponse(DASHBOARD.read_text(encoding="utf-8"))

    @app.get("/rounds")
    async def list_rounds(request: Request):
        await who(request)
        status = request.query_params.get("status")
        after = _int_query(request, "after", 0, 0, 2**62)
        limit = _int_query(request, "limit", 100, 1, 1000)
        return await call(ledger.list_rounds, status, after, limit)

    @app.post("/rounds", status_code=201)
    async def open_round(request: Request):
        _operator(await who(request))
        question, options, settings, close_at = v.round_body(await body(request), ledger.clock())
        return await call(ledger.open_round, question, options, settings, close_at)

    @app.get("/rounds/{rid}")
    async def get_round(rid: str, request: Request):
        await who(request)
        return await call(ledger.get_round, v.positive_id(rid))

    @app.post("/rounds/{rid}/close")
    async def close_round(rid: str, request: Request):
        _operator(await who(request))
        return await call(ledger.close_round, v.positive_id(rid))

    @app.post("/rounds/{rid}/resolve")
    async def resolve(rid: str, request: Request):
        _operator(await who(request))
        round_id = v.positive_id(rid)
        k = await call(ledger.round_options, round_id)
        label, target = v.resolution_body(await body(request), k)
        return await call(ledger.resolve, round_id, label, target)

    @app.put("/rounds/{rid}/report")
    async def submit(rid: str, request: Request):
        agent = await who(request)
        round_id = v.positive_id(rid)
        k = await call(ledger.round_options, round_id)
        probs, wager = v.report_body(await body(request), k)
        return await call(ledger.submit_report, round_id, agent, probs, wager)

    @app.get("/rounds/{rid}/report")
    async def own_report(rid: str, request: Request):
        agent = await who(request)
        return await call(ledger.get_report, v.positive_id(rid), agent)

    @app.get("/rounds/{rid}/reports")
    async def all_reports(rid: str, request: Request):
        agent = await who(request)
        round_id = v.positive_id(rid)
        if not agent.is_operator and not await call(ledger.is_resolved, round_id):
            raise ClientError(403, f"round: reports of round {round_id} are private until it is resolved")
        return await call(ledger.round_reports, round_id)

    @app.get("/rounds/{rid}/pool")
    async def pool(rid: str, request: Request):
        await who(request)
        return await call(ledger.pooled, v.positive_id(rid))


def _account_routes(app: FastAPI, ledger: Ledger, who: Handler, body: Handler) -> None:
    call = run_in_threadpool

    @app.get("/me")
    async def me(request: Request):
        return await call(ledger.agent_summary, await who(request))

    @app.get("/me/payouts")
    async def my_payouts(request: Request):
        agent = await who(request)
        after = _int_query(request, "after", 0, 0, 2**62)
        limit = _int_query(request, "limit", 1000, 1, 10000)
        return await call(ledger.agent_payouts, agent, after, limit)

    @app.post("/agents", status_code=201)
    async def add_agent(request: Request):
        _operator(await who(request))
        data = await body(request)
        v.only_fields(data, ("name",), ("name",))
        name = v.agent_name(data["name"])
        token = await call(ledger.add_agent, name)
        return {"name": name, "token": token}

    @app.get("/agents")
    async def agents(request: Request):
        _operator(await who(request))
        return await call(ledger.agents_overview)

    @app.get("/market")
    async def market(request: Request):
        _operator(await who(request))
        return await call(market_stats, ledger)
