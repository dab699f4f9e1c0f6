"""The market's HTTP API (FastAPI), over one Ledger: routers by resource (routes/), auth as a dependency
(api/deps.py), typed bodies and answers (models.py), OpenAPI at /openapi.json and /docs.

    uvicorn: create_app(Ledger.open("market.db"))           # `walla market serve` does this

Auth: `Authorization: Bearer <token>` on every endpoint but GET / (the dashboard page, which asks for the
operator's token and sends it the same way), /openapi.json and /docs. Operator-only: open/close/resolve
rounds, register agents, read every report, the pooled forecast of an open round and the market's
statistics. Agents: read rounds, submit and read their OWN report, read their own payouts and balance;
another agent's report only once the round is resolved, a round's pool only once its `publish_pool` allows
(at close or after resolution), never the per-report weights. Endpoints: routes/rounds.py, reports.py,
agents.py.

Errors are JSON `{"error": "<field>: <what is wrong>"}` on one line: 400 malformed body or value, 401
missing/unknown token, 403 not allowed for this token, 404 unknown round/report/path, 405 method, 408
request not received within the read timeout, 409 state conflict (closed round, different resolution,
taken name, over a limit), 413 body over MAX_BODY, 429 over the token's rate, too many unknown tokens or
open connections from one address (with Retry-After). A server-side bug is a 500 `{"error": "internal
error"}`; a client's mistake never is, and a refused write writes nothing. HEAD is answered wherever GET is.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import anyio
from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send
from walla.market.api._deps import UNKNOWN_TOKEN_RATE, install_auth
from walla.market.api._errors import ClientError
from walla.market.api._guard import READ_TIMEOUT_S, ConnectionLimits
from walla.market.api._models import RoundSettings
from walla.market.api.routes import agents, reports, rounds
from walla.market.ledger import Ledger
from walla.market.payouts import pooled_forecast, round_payouts

MAX_BODY = 64 * 1024  # bytes; a report of 26 options is < 1 KiB
RATE = 0.0  # requests per second per token (0: unlimited); `walla market serve --rate` sets it
BURST = 200
DASHBOARD = Path(__file__).with_name("dashboard.html")
log = logging.getLogger("walla.market")


def error_response(status: int, message: object, headers: dict[str, str] | None = None) -> Response:
    """One-line JSON error; ASCII-escaped, so a lone surrogate echoed from the input cannot break encoding."""
    body = json.dumps({"error": " ".join(str(message).split())}, ensure_ascii=True)
    return Response(body, status_code=status, media_type="application/json", headers=headers)


class BodyLimit:
    """Refuse a request body over `limit` bytes (413, by Content-Length or while streaming it in) or one that
    is not whole within `timeout` seconds of the app's call (408). Served by uvicorn, api/guard.py's deadline
    (headers and body within `timeout` of the request's first byte) comes first; this one holds under any
    ASGI server."""

    def __init__(self, app: ASGIApp, limit: int, timeout: float = READ_TIMEOUT_S) -> None:
        self.app, self.limit, self.timeout = app, limit, timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            return await _send(send, error_response(413, f"body: larger than {self.limit} bytes"))
        seen = 0
        deadline = anyio.current_time() + self.timeout  # for the whole body, not per chunk

        async def limited() -> dict:
            nonlocal seen
            with anyio.CancelScope(deadline=deadline) as scope:  # no task per chunk (asyncio.wait_for's)
                message = await receive()
            if scope.cancelled_caught:
                raise HTTPException(408, f"body: not received within {self.timeout:g} s")
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise HTTPException(413, f"body: larger than {self.limit} bytes")
            return message

        await self.app(scope, limited, send)


class HeadAsGet:
    """Answer HEAD wherever GET is served (RFC 9110 9.3.2; FastAPI's routes take GET only): the app sees a
    GET, the client gets its status and headers without the body."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            return await self.app(scope, receive, send)

        async def headers_only(message: dict) -> None:
            if message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, headers_only)


async def _send(send: Send, resp: Response) -> None:
    await send({"type": "http.response.start", "status": resp.status_code, "headers": resp.raw_headers})
    await send({"type": "http.response.body", "body": resp.body})


def create_app(
    ledger: Ledger,
    max_body: int = MAX_BODY,
    rate: float = RATE,
    burst: int = BURST,
    unknown_token_rate: float = UNKNOWN_TOKEN_RATE,
    limits: ConnectionLimits = ConnectionLimits(),
) -> FastAPI:
    """The API over `ledger` (see module docstring); `rate` requests/s per token (0: unlimited). The
    connection `limits` hold when it is served by api/_guard.py's guarded_config, as `walla market serve` and
    LocalServer do (the body's read deadline holds in any server)."""
    warm_up()
    app = FastAPI(
        title="walla market",
        description="A live wagering market on walla's mechanism (docs/market.md).",
        version=ledger.version,
    )
    install_auth(app, ledger, rate, burst, unknown_token_rate)  # per token, and per address for unknown ones
    app.state.limits = limits
    error_handlers(app)
    for module in (rounds, reports, agents):
        app.include_router(module.router)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def dashboard() -> HTMLResponse:
        return HTMLResponse(DASHBOARD.read_text(encoding="utf-8"))

    app.add_middleware(BodyLimit, limit=max_body, timeout=limits.read_timeout)
    app.add_middleware(HeadAsGet)
    return app


def warm_up() -> None:
    """One tiny payout and pool through torch before serving: its first call in a process costs ~0.8 s here,
    which would otherwise land on the first resolution."""
    round_payouts([[0.5, 0.5], [0.9, 0.1]], [0.5, 0.1], [1.0, 0.0], RoundSettings())
    pooled_forecast([[0.5, 0.5]], [0.5], "log", 2)


def _field(loc: tuple) -> str:
    """('body', 'probabilities', 1) -> 'probabilities[1]'; ('query', 'limit') -> 'limit'."""
    out = ""
    for p in loc[1:]:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or str(loc[0] if loc else "body")


def validation_message(errors: list[dict]) -> tuple[int, str]:
    """(status, one line) for the first of pydantic's errors: 404 for an id in the path, else 400."""
    e = errors[0]
    loc = tuple(e.get("loc") or ("body",))
    msg = str(e.get("msg", "invalid"))
    msg = msg.removeprefix("Value error, ")
    if loc[0] == "path":
        what = "round" if loc[-1] == "rid" else "name"
        return (
            404,
            f"{what}: no such {'id' if what == 'round' else 'agent'} {ascii(str(e.get('input', '')))[:60]}",
        )
    if e.get("type") == "json_invalid":
        return 400, f"body: not valid JSON ({(e.get('ctx') or {}).get('error', 'decode error')})"
    if loc == ("body",) and e.get("type") in ("model_attributes_type", "dict_type"):
        return 400, "body: expected a JSON object (Content-Type: application/json)"
    if loc == ("body",) and e.get("type") == "missing":
        return 400, "body: missing (expected a JSON object, Content-Type: application/json)"
    if len(loc) == 1 and ": " in msg:  # a model-level check names its own field
        return 400, msg
    field = _field(loc)
    if e.get("type") == "extra_forbidden":
        return 400, f"{field}: unknown field"
    if e.get("type") == "missing":
        return 400, f"{field}: missing"
    return 400, f"{field}: {msg}"


def error_handlers(app: FastAPI) -> None:
    """The API's one-line errors (module docstring): a ClientError, a bad body, an unknown path or method; any
    other exception a 500 `internal error` with its traceback in the log."""

    @app.exception_handler(ClientError)
    async def _client(_req: Request, e: ClientError) -> Response:
        return error_response(e.status, e.message, e.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_req: Request, e: RequestValidationError) -> Response:
        return error_response(*validation_message(list(e.errors())))

    @app.exception_handler(StarletteHTTPException)
    async def _http(req: Request, e: StarletteHTTPException) -> Response:
        what = {
            404: f"path: no endpoint {ascii(req.url.path)[1:-1][:200]}",
            405: f"method: {req.method} not allowed on {ascii(req.url.path)[1:-1][:200]}",
        }
        detail = str(e.detail)
        if e.status_code == 400 and "parsing the body" in detail:
            detail = "body: not valid JSON (or nested too deeply)"
        return error_response(e.status_code, what.get(e.status_code, detail))

    @app.exception_handler(Exception)
    async def _internal(_req: Request, e: Exception) -> Response:
        log.exception("walla market: internal error")
        return error_response(500, "internal error")
