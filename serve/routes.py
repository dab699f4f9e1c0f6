"""`walla serve`'s endpoints, at module level on one APIRouter; the Forecaster is `app.state.forecaster`
(create_serve_app, serve/app.py), reached through the `Fc` dependency, as the market's routes reach its
ledger.

GET  /v1/models              the pool as one model id, its agents (identity, tier), run key, head version
POST /v1/forecast            ForecastIn -> pooled probabilities, choice, per agent {probabilities, wager, weight}
POST /v1/forecasts           up to 64 of them, answered together
POST /v1/chat/completions    OpenAI's chat body -> the chosen option as content, the pool's log-probs in
                             logprobs.content[0].top_logprobs, usage summed over the agents
POST /v1/outcomes            the operator's token: resolve a forecast's round (payouts; --learn: a step)
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from walla.market.api import ClientError, bearer, current_principal, require_operator, validation_message
from walla.serve.batcher import QueueFull
from walla.serve.forecast import Forecaster, Job
from walla.serve.loading import identity_tag
from walla.serve.models import (
    ChatIn,
    ForecastIn,
    ForecastsIn,
    OutcomeIn,
    message_text,
    schema_options,
    split_options,
)

ABSTAIN = (
    "ABSTAIN"  # a chat answer's content when the pool abstains (walla.abstain_below); finish_reason stop
)
LOGPROB_FLOOR = -1e4  # log(0) as OpenAI's JSON can carry it
POLL_S = 0.2  # how often a waiting request checks that its caller is still there

router = APIRouter(prefix="/v1")


def forecaster(request: Request) -> Forecaster:
    return request.app.state.forecaster


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


Fc = Annotated[Forecaster, Depends(forecaster)]
Caller = Annotated[str, Depends(caller)]
Operator = Annotated[str, Depends(operator)]


def check_model(fc: Forecaster, model: str | None) -> None:
    if model is not None and model != fc.pool.model_id:
        raise ClientError(
            404, f"model: unknown model {ascii(model)[:120]} (this server serves {fc.pool.model_id})"
        )


async def answer(fc: Forecaster, request: Request, jobs: list[Job], who: str) -> list[dict]:
    """Queue every job, wait (freeing the queue if the caller leaves), then record and pool each."""
    limit = fc.max_queue
    if len(jobs) > limit:  # could never be queued at once: not a 429 to retry forever
        raise ClientError(
            413,
            f"forecasts: {len(jobs)} forecasts in one request, more than this server queues ({limit}, --max-queue)",
        )
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


def prepare(fc: Forecaster, body: ForecastIn) -> Job:
    below = body.walla.abstain_below if body.walla is not None else None
    return fc.prepare(body.question, list(body.options or []) or None, body.context, body.question_id, below)


@router.get("/models", tags=["serve"])
def models(fc: Fc, _: Caller) -> dict:
    return {"object": "list", "data": [model_card(fc)]}


def model_card(fc: Forecaster) -> dict:
    pool = fc.pool
    c = pool.choice
    return {
        "id": pool.model_id,
        "object": "model",
        "created": pool.created,  # when the heads served were written: from memory, never the disk's now
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
            "head_digest": pool.head_digest,
            "learning": fc.learn,
            "promise": fc.promise,
            "selective": pool.selective,
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


@router.post("/forecast", tags=["serve"])
async def forecast(body: ForecastIn, request: Request, fc: Fc, who: Caller) -> dict:
    check_model(fc, body.model)
    return (await answer(fc, request, [prepare(fc, body)], who))[0]


@router.post("/forecasts", tags=["serve"])
async def forecasts(body: ForecastsIn, request: Request, fc: Fc, who: Caller) -> dict:
    check_model(fc, body.model)
    for f in body.forecasts:
        check_model(fc, f.model)
    return {"forecasts": await answer(fc, request, [prepare(fc, f) for f in body.forecasts], who)}


@router.post("/outcomes", tags=["serve"])
def outcomes(body: OutcomeIn, fc: Fc, _: Operator) -> dict:
    return fc.outcome(body.round, body.label, list(body.target) if body.target is not None else None)


@router.post("/chat/completions", tags=["openai"])
async def chat(body: ChatIn, request: Request, fc: Fc, who: Caller) -> Response:
    """OpenAI's chat completion of the pool's answer; `stream: true` sends it as one SSE chunk, then [DONE]."""
    check_model(fc, body.model)
    if body.tools or body.tool_choice not in (None, "none"):
        raise ClientError(
            400, "tools: the pool answers multiple-choice questions only; it makes no tool calls"
        )
    if body.n is not None and body.n != 1:
        raise ClientError(400, f"n: the pool gives one answer per question (n = 1), got {body.n}")
    job = prepare(fc, chat_forecast(body))
    out = (await answer(fc, request, [job], who))[0]
    as_json = schema_options(body.response_format) is not None
    if not body.stream:
        return JSONResponse(chat_completion(out, as_json))
    return StreamingResponse(chat_stream(out, as_json), media_type="text/event-stream")


def chat_stream(out: dict, as_json: bool = False):
    """The answer as OpenAI's stream: one chat.completion.chunk with the whole answer, then [DONE]."""
    whole = chat_completion(out, as_json)
    (choice,) = whole["choices"]
    chunk = {
        **{k: whole[k] for k in ("id", "created", "model", "usage", "walla")},
        "object": "chat.completion.chunk",
        "choices": [
            {**{k: choice[k] for k in ("index", "logprobs", "finish_reason")}, "delta": choice["message"]}
        ],
    }
    yield f"data: {json.dumps(chunk, ensure_ascii=True)}\n\n"
    yield "data: [DONE]\n\n"


def chat_forecast(body: ChatIn) -> ForecastIn:
    """The forecast a chat body asks: the last user message's question, options from `walla.options` or
    its trailing 'A. ...' block (ClientError 400 naming the field)."""
    users = [m for m in body.messages if isinstance(m, dict) and m.get("role") == "user"]
    if not users:
        raise ClientError(400, "messages: no user message")
    try:
        text = message_text(users[-1])
        ext = body.walla
        named = schema_options(body.response_format)
        if ext is not None and ext.options is not None:
            question, options = text, list(ext.options)
        elif named is not None:
            question, options = text, named
        else:
            question, options = split_options(text)
        below = (
            {"walla": {"abstain_below": ext.abstain_below}} if ext and ext.abstain_below is not None else {}
        )
        return ForecastIn(question=question, options=options, context=ext.context if ext else None, **below)
    except ValidationError as e:
        raise ClientError(*validation_message(list(e.errors()))) from None
    except ValueError as e:
        raise ClientError(400, str(e)) from None


def _logprob(p: float) -> float:
    return math.log(p) if p > 0 else LOGPROB_FLOOR


def chat_completion(out: dict, as_json: bool = False) -> dict:
    """An OpenAI chat.completion of a forecast: content = the chosen option (as a JSON string where the request's
    response_format asked for a JSON schema), top_logprobs = the pool."""
    top = [
        {"token": o, "logprob": _logprob(p), "bytes": list(o.encode("utf-8"))}
        for o, p in zip(out["options"], out["probabilities"], strict=True)
    ]
    best = max(range(len(top)), key=lambda j: out["probabilities"][j])
    chosen = top[best]
    content = json.dumps(out["answer"]) if as_json else out["answer"]
    if out.get("abstained"):  # docs/serve.md: the content a caller can test for; the pool still in logprobs
        content = ABSTAIN
    usage = out["usage"]["prompt_tokens"]
    return {
        "id": f"chatcmpl-walla-{out['round']}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": out["model"],
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": content,
                },
                "logprobs": {"content": [{**chosen, "top_logprobs": top}]},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": usage, "completion_tokens": 0, "total_tokens": usage},
        "walla": out,
    }
