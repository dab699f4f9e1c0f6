"""`walla serve`'s HTTP API (FastAPI, the market's idioms: typed bodies, auth as a dependency, one-line errors).

GET  /v1/models              the pool as one model id, its agents (identity, tier), run key, head version
POST /v1/forecast            ForecastIn -> pooled probabilities, choice, per agent {probabilities, wager, weight}
POST /v1/forecasts           up to 64 of them, answered together
POST /v1/chat/completions    OpenAI's chat body -> the chosen option as content, the pool's log-probs in
                             logprobs.content[0].top_logprobs, usage summed over the agents
POST /v1/outcomes            the operator's token: resolve a forecast's round (payouts; --learn: a step)

Auth: `Authorization: Bearer <token>` of the ledger: the operator's or a caller's (`walla market add-agent NAME
--caller`; a market agent's token is refused, and the market's API refuses a caller's);
none needed with `open` (a local server), except for outcomes. Errors: `{"error": "<field>: <what>"}` on one
line (4xx), OpenAI error objects on /v1/chat/completions; 404 an unknown model id or question_id; 429 with
Retry-After when a model's queue is full; 503 when every agent failed on the question. A caller that
disconnects while its request waits frees its place in the queue.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Annotated

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from walla.market.api import (
    BodyLimit,
    ClientError,
    _error_handlers,
    bearer,
    current_principal,
    error_response,
    install_auth,
    require_operator,
    validation_message,
)
from walla.market.ledger import CALLER, OPERATOR
from walla.serve.batcher import QueueFull
from walla.serve.forecast import Forecaster, Job, identity_tag
from walla.serve.loading import pool_promise
from walla.serve.models import ChatIn, ForecastIn, ForecastsIn, OutcomeIn, message_text, split_options

MAX_BODY = 1024 * 1024  # bytes: 64 forecasts of long questions
RETRY_AFTER_S = 1
LOGPROB_FLOOR = -1e4  # log(0) as OpenAI's JSON can carry it
POLL_S = 0.2  # how often a waiting request checks that its caller is still there


async def caller(
    request: Request, cred: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> str:
    """Who asks: any ledger token's holder (the market's bearer check), or "open" on an open server."""
    if request.app.state.open_access:
        return "open"
    return (await current_principal(request, request.app.state.ledger, cred)).name


async def operator(
    request: Request, cred: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> str:
    return (await require_operator(await current_principal(request, request.app.state.ledger, cred))).name


Caller = Annotated[str, Depends(caller)]
Operator = Annotated[str, Depends(operator)]


def create_serve_app(fc: Forecaster, open_access: bool = False, max_body: int = MAX_BODY) -> FastAPI:
    pool = fc.pool
    app = FastAPI(
        title="walla serve",
        description="A trained pool of LLMs answering new questions: calibrated, wager-weighted (docs/serve.md).",
        version=fc.ledger.version,
    )
    # no per-token rate (the queue bounds the work); callers' tokens, never a market agent's (issue 45)
    install_auth(app, fc.ledger, rate=0.0, burst=1, roles=(CALLER, OPERATOR))
    app.state.open_access = open_access
    _error_handlers(app)

    @app.exception_handler(QueueFull)
    async def _full(req: Request, e: QueueFull) -> Response:
        resp = error_response(429, f"queue: {e}; retry after {RETRY_AFTER_S} s")
        resp.headers["Retry-After"] = str(RETRY_AFTER_S)
        return openai_shaped(req, resp)

    # on /v1/chat/completions the market's one-line errors become OpenAI error objects (what `openai` reads);
    # exception handlers, not a middleware: an http middleware would hide a caller's disconnect
    for exc in (ClientError, RequestValidationError, StarletteHTTPException):
        app.add_exception_handler(exc, _shaping(app.exception_handlers[exc]))

    def check_model(model: str | None) -> None:
        if model is not None and model != pool.model_id:
            raise ClientError(
                404, f"model: unknown model {ascii(model)[:120]} (this server serves {pool.model_id})"
            )

    async def answer(request: Request, jobs: list[Job], who: str) -> list[dict]:
        """Queue every job, wait (freeing the queue if the caller leaves), then record and pool each."""
        futs = []
        try:
            for job in jobs:
                futs.append(fc.submit(job))
        except QueueFull:
            for fs in futs:
                for f in fs.values():
                    f.cancel()
            raise
        waiting = [asyncio.wrap_future(f) for fs in futs for f in fs.values()]
        gathered = asyncio.gather(*waiting, return_exceptions=True)
        while not gathered.done():
            await asyncio.wait({gathered}, timeout=POLL_S)
            if not gathered.done() and await request.is_disconnected():
                gathered.cancel()  # cancels the queued futures: the batcher drops them
                raise ClientError(400, "request: the client disconnected")
        return [await run_in_threadpool(fc.finish, job, fs, who) for job, fs in zip(jobs, futs, strict=True)]

    def prepare(body: ForecastIn) -> Job:
        return fc.prepare(body.question, list(body.options or []) or None, body.context, body.question_id)

    @app.get("/v1/models", tags=["serve"])
    def models(_: Caller) -> dict:
        return {"object": "list", "data": [model_card()]}

    def model_card() -> dict:
        c = pool.choice
        return {
            "id": pool.model_id,
            "object": "model",
            "created": int(pool.run_dir.stat().st_mtime),
            "owned_by": "walla",
            "walla": {
                "scenario": c.scenario,
                "method": c.method,
                "run_key": f"{c.method}/{c.key_id}",
                "label": c.label,
                "seed": pool.seed,
                "dataset": pool.dataset,
                "template": pool.template.name,
                "settings": pool.settings.as_dict(),
                "head_version": pool.head_version,
                "learning": fc.learn,
                "promise": pool_promise(pool.agents),
                "agents": [
                    {
                        "name": a.name,
                        "slot": a.slot,
                        "model": a.model,
                        "identity": a.llm.settled.identity,
                        "identity_tag": identity_tag(a.llm.settled.identity),
                        "tier": a.llm.tier,
                        "promise": a.llm.promise,
                        "identity_differs": a.llm.differs,
                        "head_version": a.head_version,
                    }
                    for a in pool.agents
                ],
            },
        }

    @app.post("/v1/forecast", tags=["serve"])
    async def forecast(body: ForecastIn, request: Request, who: Caller) -> dict:
        check_model(body.model)
        return (await answer(request, [prepare(body)], who))[0]

    @app.post("/v1/forecasts", tags=["serve"])
    async def forecasts(body: ForecastsIn, request: Request, who: Caller) -> dict:
        check_model(body.model)
        for f in body.forecasts:
            check_model(f.model)
        return {"forecasts": await answer(request, [prepare(f) for f in body.forecasts], who)}

    @app.post("/v1/outcomes", tags=["serve"])
    def outcomes(body: OutcomeIn, _: Operator) -> dict:
        return fc.outcome(body.round, body.label, list(body.target) if body.target is not None else None)

    @app.post("/v1/chat/completions", tags=["openai"])
    async def chat(body: ChatIn, request: Request, who: Caller) -> dict:
        check_model(body.model)
        if body.stream:
            raise ClientError(400, "stream: not supported (the answer is one pooled choice)")
        job = prepare(chat_forecast(body))
        out = (await answer(request, [job], who))[0]
        return chat_completion(out)

    app.add_middleware(BodyLimit, limit=max_body)

    return app


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


def chat_forecast(body: ChatIn) -> ForecastIn:
    """The forecast a chat body asks: the last user message's question, options from `walla.options` or
    its trailing 'A. ...' block (ClientError 400 naming the field)."""
    users = [m for m in body.messages if isinstance(m, dict) and m.get("role") == "user"]
    if not users:
        raise ClientError(400, "messages: no user message")
    try:
        text = message_text(users[-1])
        ext = body.walla
        if ext is not None and ext.options is not None:
            question, options = text, list(ext.options)
        else:
            question, options = split_options(text)
        return ForecastIn(question=question, options=options, context=ext.context if ext else None)
    except ValidationError as e:
        raise ClientError(*validation_message(list(e.errors()))) from None
    except ValueError as e:
        raise ClientError(400, str(e)) from None


def _logprob(p: float) -> float:
    return math.log(p) if p > 0 else LOGPROB_FLOOR


def chat_completion(out: dict) -> dict:
    """An OpenAI chat.completion of a forecast: content = the chosen option, top_logprobs = the pool."""
    top = [
        {"token": o, "logprob": _logprob(p), "bytes": list(o.encode("utf-8"))}
        for o, p in zip(out["options"], out["probabilities"], strict=True)
    ]
    chosen = top[out["choice"]]
    usage = out["usage"]["prompt_tokens"]
    return {
        "id": f"chatcmpl-walla-{out['round']}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": out["model"],
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": out["answer"]},
                "logprobs": {"content": [{**chosen, "top_logprobs": top}]},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": usage, "completion_tokens": 0, "total_tokens": usage},
        "walla": out,
    }
