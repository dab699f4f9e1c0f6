"""The API's dependencies: the ledger, who is asking (a bearer token), the operator check, typed ids, and a
per-token rate limit.

    @router.post("/rounds")
    def open_round(body: RoundIn, ledger: LedgerDep, op: Operator) -> RoundOut: ...

The dependencies are async: current_principal reads the ledger in the threadpool only for a token it has
not seen in the last AUTH_TTL_S (ledger/tokens.py). The unknown-token limit never refuses a valid token
(issue 45: a revoked token hammered from one address locked the operator out of it): it counts only tokens
that FAILED their lookup, per token (a refused token is answered from the cache, without a read, and gets a
429 after UNKNOWN_TOKEN_BURST of them) and per address (after UNKNOWN_TOKEN_BURST distinct failed tokens,
at UNKNOWN_TOKEN_RATE per second, the address's failures answer 429 and its lookups of tokens not seen
before wait their turn, one at a time for all such addresses: a flood of random tokens costs one database
connection, and a valid token among them still passes). The bearer scheme is documented in the OpenAPI
schema. Every refusal is a ClientError: 401 no or unknown token, 403 not the operator (or a token of
another API's principals: `roles`), 429 over the token's rate or the unknown-token limits (with Retry-After).
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from typing import Annotated

from fastapi import Depends, Path, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool
from walla.market.api._errors import ClientError
from walla.market.api._models import DIGITS, MAX_ID
from walla.market.ledger import AGENT, CALLER, OPERATOR, Ledger, Principal, hash_token

MAX_BUCKETS = 100_000
UNKNOWN_TOKEN_BURST = 20  # failed lookups a token, or a client address, may cause at once ...
UNKNOWN_TOKEN_RATE = 1.0  # ... and per second after them; then 429 (a valid token is never refused by it)
bearer = HTTPBearer(auto_error=False, description="an agent's or the operator's token")


class RateLimit:
    """A token bucket per key: `rate` requests per second on average, bursts of `burst` (rate 0: no limit).

    In-process and per server: one `walla market serve` is one ledger's writer anyway. A key over its rate
    gets `what` (a 429 line, with Retry-After) and writes nothing. Keys are token hashes (--rate) or client
    addresses (unknown tokens: current_principal).
    """

    def __init__(
        self, rate: float, burst: int, what: str = "authorization: over this token's rate limit"
    ) -> None:
        self.rate, self.burst, self.what = rate, burst, what
        self.buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens left, last time)
        self.lock = threading.Lock()

    def _left(self, key: str, now: float) -> float:
        left, last = self.buckets.get(key, (float(self.burst), now))
        return min(float(self.burst), left + (now - last) * self.rate)

    def _refuse(self, left: float) -> ClientError:
        wait = max(1, math.ceil((1.0 - left) / self.rate))
        return ClientError(
            429, f"{self.what} of {self.rate:g} requests/s; retry after {wait} s", {"Retry-After": str(wait)}
        )

    def take(self, key: str) -> None:
        """Spend one request of `key`'s, or ClientError 429 when it has none left."""
        if self.rate <= 0:
            return
        now = time.monotonic()
        with self.lock:
            left = self._left(key, now)
            if left < 1.0:
                self.buckets[key] = (left, now)
                raise self._refuse(left)
            self.buckets[key] = (left - 1.0, now)
            if len(self.buckets) > MAX_BUCKETS:  # random keys must not grow memory: forget refilled buckets
                full = now - self.burst / self.rate
                self.buckets = {k: v for k, v in self.buckets.items() if v[1] > full}

    def check(self, key: str) -> None:
        """ClientError 429 when `key` has no request left; spends nothing."""
        if self.rate > 0:
            with self.lock:
                left = self._left(key, time.monotonic())
            if left < 1.0:
                raise self._refuse(left)


def install_auth(
    app,
    ledger: Ledger,
    rate: float,
    burst: int,
    unknown_token_rate: float = UNKNOWN_TOKEN_RATE,
    roles: tuple[str, ...] = (AGENT, OPERATOR),
) -> None:
    """What current_principal reads from an app's state: the ledger, the per-token rate limit, the limits on
    failed lookups (per token and per address; 0: no limit) and the roles whose tokens this API takes (the
    market: agents and the operator; walla serve: its callers and the operator). Every app that
    authenticates through these dependencies installs them here."""
    app.state.ledger = ledger
    app.state.rate_limit = RateLimit(rate, burst)
    app.state.refused_token = RateLimit(
        unknown_token_rate,
        UNKNOWN_TOKEN_BURST,
        "authorization: unknown or revoked token, sent over the limit",
    )
    app.state.unknown_tokens = RateLimit(
        unknown_token_rate,
        UNKNOWN_TOKEN_BURST,
        "authorization: too many unknown tokens from this address, over",
    )
    app.state.unknown_lookups = asyncio.Lock()  # the lookups of addresses over their unknown-token budget
    app.state.roles = tuple(roles)


async def get_ledger(request: Request) -> Ledger:
    """async: no threadpool hop for what needs no I/O (each hop costs a submission ~0.3 ms under load)."""
    return request.app.state.ledger


LedgerDep = Annotated[Ledger, Depends(get_ledger)]


async def current_principal(
    request: Request,
    ledger: LedgerDep,
    cred: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Principal:
    """The agent or operator whose bearer token the request carries (401 otherwise). A token seen in the
    last AUTH_TTL_S needs no database read and no threadpool hop (Ledger.cached_principal), and so does
    one refused in that time (Ledger.recently_refused); the unknown-token limits (module docstring) count
    only refusals."""
    if cred is None:
        if request.headers.get("authorization"):
            raise ClientError(401, "authorization: expected 'Bearer <token>'")
        raise ClientError(401, "authorization: missing bearer token (header 'Authorization: Bearer <token>')")
    token = cred.credentials.strip()
    key = hash_token(token)
    state = request.app.state
    state.rate_limit.take(key)
    who = ledger.cached_principal(key)
    if who is None:
        address = request.client.host if request.client else "?"
        if ledger.recently_refused(key):  # no read: the same refusal, then 429 past the token's own budget
            state.refused_token.take(key)
            raise ClientError(401, "authorization: unknown or revoked token")
        try:
            state.unknown_tokens.check(address)
            over = False
        except ClientError:
            over = True
        if over:  # this address sent many failing tokens: its new ones are looked up one at a time
            async with state.unknown_lookups:
                who = await run_in_threadpool(ledger.authenticate, token)
        else:
            who = await run_in_threadpool(ledger.authenticate, token)
        if who is None:
            state.unknown_tokens.take(address)
            raise ClientError(401, "authorization: unknown or revoked token")
    if who.role not in state.roles:
        raise ClientError(
            403, f"authorization: {ROLE_REFUSAL.get(who.role, 'this token is not accepted here')}"
        )
    return who


# why a known token of another API's principals is refused (install_auth's `roles`)
ROLE_REFUSAL = {
    CALLER: "this is a walla serve caller's token; the market's API takes agents' and the operator's tokens",
    AGENT: "this is a market agent's token; walla serve takes callers' tokens (`walla market add-agent NAME "
    "--caller`) and the operator's",
}


CurrentPrincipal = Annotated[Principal, Depends(current_principal)]


async def require_operator(who: CurrentPrincipal) -> Principal:
    if not who.is_operator:
        raise ClientError(403, "authorization: this endpoint needs the operator's token")
    return who


Operator = Annotated[Principal, Depends(require_operator)]

# a round id in the path: plain decimal digits, 1..MAX_ID (PostgreSQL int4); anything else ('+1', '1.0',
# 2**31) is an unknown round (404)
RoundId = Annotated[int, Path(ge=1, le=MAX_ID, description="a round's id"), DIGITS]
# an id or a count in the query string: plain decimal digits too (a 400 naming the parameter otherwise)
AfterId = Annotated[int, Query(ge=0, le=MAX_ID, description="only ids above this one"), DIGITS]
