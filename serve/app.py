"""`walla serve`'s HTTP app (FastAPI, the market's idioms: typed bodies, auth as a dependency, one-line errors):
the endpoints of serve/routes.py on the Forecaster held in `app.state.forecaster`.

    app = create_serve_app(Forecaster(pool, ledger).start(), open_access=True)   # uvicorn serves it

Auth: `Authorization: Bearer <token>` of the ledger: the operator's or a caller's (`walla market add-agent NAME
--caller`; a market agent's token is refused, and the market's API refuses a caller's);
none needed with `open` (a local server), except for outcomes. Errors: `{"error": "<field>: <what>"}` on one
line (4xx; the market's error handlers, market/api/_server.py), OpenAI error objects on /v1/chat/completions; 404
an unknown model id or question_id; 413 a prompt over --max-prompt-tokens; 429 with Retry-After when a model's
queue is full; 503 with Retry-After when a request waited past the batcher's deadline, and when every agent
failed on the question. A caller that disconnects while its request waits frees its place in the queue.
"""

from __future__ import annotations

import json
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException as StarletteHTTPException
from walla.market.api import (
    BodyLimit,
    ClientError,
    ConnectionLimits,
    error_handlers,
    error_response,
    install_auth,
)
from walla.market.launch import first_line
from walla.market.ledger import CALLER, OPERATOR
from walla.serve import routes
from walla.serve.batcher import QueueFull, QueueTimeout
from walla.serve.forecast import Forecaster

MAX_BODY = 1024 * 1024  # bytes: 64 forecasts of long questions
RETRY_AFTER_S = 1
log = logging.getLogger("walla.serve")


def create_serve_app(
    fc: Forecaster,
    open_access: bool = False,
    max_body: int = MAX_BODY,
    limits: ConnectionLimits = ConnectionLimits(),
) -> FastAPI:
    """The app serving `fc`'s pool: serve/routes.py's router, the ledger's auth, the market's error lines.
    `limits` are the market's slow-client guard's (market/api/_guard.py guarded_config reads them from
    app.state, as it does the market's)."""
    app = FastAPI(
        title="walla serve",
        description="A trained pool of LLMs answering new questions: calibrated, wager-weighted (docs/serve.md).",
        version=fc.ledger.version,
    )
    # no per-token rate (the queue bounds the work); callers' tokens, never a market agent's (issue 45)
    install_auth(app, fc.ledger, rate=0.0, burst=1, roles=(CALLER, OPERATOR))
    app.state.forecaster, app.state.open_access = fc, open_access
    app.state.limits = limits
    error_handlers(app)
    app.add_exception_handler(QueueFull, _queue_full)
    app.add_exception_handler(QueueTimeout, _queue_timeout)
    for exc in (SQLAlchemyError, OSError):  # the ledger's database, the run's files: 503, one line
        app.add_exception_handler(exc, _storage_fault)
    # on /v1/chat/completions the market's one-line errors become OpenAI error objects (what `openai` reads);
    # exception handlers, not a middleware: an http middleware would hide a caller's disconnect
    for exc in (ClientError, RequestValidationError, StarletteHTTPException):
        app.add_exception_handler(exc, _shaping(app.exception_handlers[exc]))
    app.include_router(routes.router)
    app.add_middleware(BodyLimit, limit=max_body, timeout=limits.read_timeout)
    return app


async def _queue_full(req: Request, e: QueueFull) -> Response:
    resp = error_response(429, f"queue: {e}; retry after {RETRY_AFTER_S} s")
    resp.headers["Retry-After"] = str(RETRY_AFTER_S)
    return openai_shaped(req, resp)


async def _queue_timeout(req: Request, e: QueueTimeout) -> Response:
    resp = error_response(
        503, f"queue: {e}; retry after {RETRY_AFTER_S} s", {"Retry-After": str(RETRY_AFTER_S)}
    )
    return openai_shaped(req, resp)


async def _storage_fault(req: Request, e: Exception) -> Response:
    """A database or file the answer needs that failed (a read-only or full ledger, a database server down, the
    run's files gone): 503 with one line and Retry-After, logged as one line; never a 500 with a traceback."""
    what = "ledger" if isinstance(e, SQLAlchemyError) else "storage"
    line = first_line(e) if isinstance(e, SQLAlchemyError) else (e.strerror or str(e))
    log.warning("walla serve: %s %s: %s unavailable (%s)", req.method, req.url.path, what, line)
    resp = error_response(
        503, f"{what}: unavailable ({line}); retry later", {"Retry-After": str(RETRY_AFTER_S)}
    )
    return openai_shaped(req, resp)


def _shaping(inner):
    async def handler(req: Request, e: Exception) -> Response:
        return openai_shaped(req, await inner(req, e))

    return handler


ERROR_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}


def openai_shaped(req: Request, resp: Response) -> Response:
    """A market-style error response as an OpenAI error object on /v1/chat/ paths (others unchanged)."""
    if resp.status_code < 400 or not req.url.path.startswith("/v1/chat/"):
        return resp
    try:
        message = str(json.loads(resp.body).get("error"))
    except (ValueError, AttributeError):
        message = bytes(resp.body).decode("utf-8", "replace")[:300]
    status = resp.status_code
    err = {
        "message": message,
        "type": ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error"),
        "param": message.split(":", 1)[0] if ": " in message else None,
        "code": status,
    }
    headers = {k: v for k, v in resp.headers.items() if k.lower() == "retry-after"}
    return Response(json.dumps({"error": err}, ensure_ascii=True), status, headers, "application/json")
