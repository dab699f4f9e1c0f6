"""What every part of the ledger shares: its constants, the principal, tokens, and small row helpers.

who = Principal(3, "alice", "agent")      # who sent a request (deps.current_principal)
key = hash_token(token)                    # only this sha256 is stored
"""

from __future__ import annotations

import hashlib
import json
import math
import secrets
from dataclasses import dataclass

from walla.market.api import MAX_ID, ClientError, RoundSettings

OPERATOR = "operator"
AGENT = "agent"  # reports on the market's rounds (the market's API)
CALLER = "caller"  # asks walla serve for forecasts; the market's API refuses its token (issue 45)
ROLES = (AGENT, CALLER, OPERATOR)
# a round's publish_pool when the round is the operator's alone: no agent endpoint lists, shows, pools or
# reports on it (walla serve's forecasts); before this value, served rounds were "never" rounds with a
# source starting with SERVED_SOURCE, and those are the operator's alone too
OPERATOR_ONLY = "operator"
SERVED_SOURCE = "walla serve "
OPEN_STATES = ("open", "closed")  # a round whose reports are not yet paid (or voided)
RETRIES = 5  # a write that lost a race (unique key, deadlock, serialization) is retried from scratch
SAME_ANSWER_ATOL = 1e-12
# how long a token found valid is trusted without a database read; a revoke or rotation by this process
# takes effect at once, one by another process (a second server on the same database) within this long
AUTH_TTL_S = 2.0
# what every round's opening event records: its question and the mechanism's settings, walla's version
ROUND_STAMP = (
    "question",
    "options",
    "settings",
    "deficit_bound",
    "close_at",
    "publish_pool",
    "max_wager",
    "criteria",
    "source",
    "walla_version",
)


class LedgerInvariantError(RuntimeError):
    """A write that would break a money invariant (a non-finite score, payout or bound): refused and rolled
    back. The API's types make it unreachable from a client; reaching it is a bug, answered 500."""


def check_finite(what: str, values) -> None:
    """Raise LedgerInvariantError unless every value is a finite float (called inside the writing txn)."""
    for i, v in enumerate(values):
        if not math.isfinite(v):
            raise LedgerInvariantError(f"{what}[{i}]: {v} is not finite; nothing was written")


def walla_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("walla")
    except PackageNotFoundError:  # a source checkout that was never installed
        return "unknown"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def token_check(token_hash: str) -> str:
    """What the event log records of a token: sha256 of its stored hash (the hash itself never leaves the
    agents table), so the audit can prove every agents.token_hash from the events."""
    return hashlib.sha256(token_hash.encode("utf-8")).hexdigest()


def new_token() -> str:
    return "wm_" + secrets.token_urlsafe(32)


@dataclass(frozen=True)
class Principal:
    """Who sent a request: an agent or the operator."""

    id: int
    name: str
    role: str
    max_wager: float | None = None
    floor: float | None = None
    token_hash: str | None = None  # of the token it authenticated with: a write checks it is still the row's

    @property
    def is_operator(self) -> bool:
        return self.role == OPERATOR


def dumps(values: list) -> str:
    return json.dumps(values, separators=(",", ":"))  # floats as repr: exact round trip


def same(old: list[float], new: list[float]) -> bool:
    return len(old) == len(new) and all(abs(a - b) <= SAME_ANSWER_ATOL for a, b in zip(old, new, strict=True))


def settings_of(row) -> RoundSettings:
    return RoundSettings.model_construct(  # stored values: checked when they were written
        variant=row.variant, c1=row.c1, c2=row.c2, c3=row.c3, pooling=row.pooling
    )


def ids_used_up(table: str) -> ClientError:
    """409: a row of `table` would take an id past MAX_ID, where the ledger's integer columns end."""
    return ClientError(
        409,
        f"id: this ledger's {table} ids are used up (its id columns end at {MAX_ID}); nothing was written: "
        "export it (walla market export) and start a new ledger",
    )


def checked_id(table: str, new_id: int) -> int:
    """`new_id` of a row just inserted into `table`, or ids_used_up (raised inside the transaction, so the
    row is rolled back): SQLite's ids go on past MAX_ID, where the API could no longer name the row."""
    if new_id > MAX_ID:
        raise ids_used_up(table)
    return new_id
