"""The API's types: pydantic request and response models whose fields carry every constraint (FastAPI parses
and checks them at the door; the OpenAPI schema at /openapi.json states them).

Limits, each chosen so that every stored number stays finite (payouts.py, ledger.py check it again inside
the transaction that writes it):
    probabilities   K finite numbers >= -SIMPLEX_ATOL summing to 1 within SIMPLEX_ATOL (1e-4, the tolerance
                    of walla.train.mechanism's own checks); stored exactly as sent
    wager           a finite number in [0, MAX_WAGER]
    c1              finite, |c1| <= C_MAX;  c2, c3 in [C_MIN, C_MAX]: the deficit bound c2^2/c3 <= 1e18 and
                    a payout |w (A - c3 w)| <= MAX_WAGER (2 c2 + c3 MAX_WAGER) <= 1e18 (|A| <= 2 c2)
    ids             1 .. MAX_ID (PostgreSQL's int4, the ledger's integer columns)
    ids in a URL    plain decimal digits ('+1', ' 1', '1.0' are not ids)
    text            no NUL, no control characters but newline and tab in a question, no lone surrogates
                    (PostgreSQL and UTF-8 refuse them), no bidirectional controls, something visible
                    (market/text.py); options distinct as a reader sees them (NFKC, invisible characters
                    dropped); agent names are matched whole and unique case-folded (the database's unique
                    index on lower(name))
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from walla.market.text import NAME_PATTERN, check_distinct, clean_text, plain_digits
from walla.train import mechanism
from walla.train.mechanism_checks import SIMPLEX_ATOL

MAX_OPTIONS = 26
MAX_TEXT = 10_000
MAX_OPTION_TEXT = 1000
MAX_WAGER = 1e6  # the mechanism itself puts no upper bound on wagers; w^2 c3 must stay finite
C_MAX = 1e6
C_MIN = 1e-6
MAX_ID = 2**31 - 1  # PostgreSQL int4: the ledger's id columns
MAX_TIME = 1e11  # unix seconds (year ~5138): any close time a market needs, and finite
PUBLISH = ("never", "close", "resolution")  # when agents may read a round's pooled forecast


def _question(value: str) -> str:
    return clean_text(value, newlines=True)


def _line(value: str) -> str:
    return clean_text(value, newlines=False)


Finite = Annotated[float, Field(strict=True, allow_inf_nan=False)]
Id = Annotated[int, Field(strict=True, ge=1, le=MAX_ID)]
# an id in a path or a query string: plain decimal digits (text.plain_digits), checked before the int's
# range (put it after Path/Query in an Annotated, so that the schema states the range as minimum/maximum)
DIGITS = BeforeValidator(plain_digits)
Question = Annotated[str, Field(min_length=1, max_length=MAX_TEXT), AfterValidator(_question)]
Line = Annotated[str, Field(min_length=1, max_length=MAX_OPTION_TEXT), AfterValidator(_line)]
Note = Annotated[str, Field(max_length=MAX_TEXT), AfterValidator(_question)]
AgentName = Annotated[str, Field(pattern=NAME_PATTERN, min_length=1, max_length=64)]
Wager = Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0.0, le=MAX_WAGER)]
Probability = Annotated[
    float, Field(strict=True, allow_inf_nan=False, ge=-SIMPLEX_ATOL, le=1.0 + SIMPLEX_ATOL)
]
Distribution = Annotated[list[Probability], Field(min_length=2, max_length=MAX_OPTIONS)]


def check_simplex(values: list[float], key: str) -> list[float]:
    total = math.fsum(values)
    if abs(total - 1.0) > SIMPLEX_ATOL:
        raise ValueError(f"{key}: sums to {total:.6g}, expected 1 within {SIMPLEX_ATOL:g}")
    return values


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RoundSettings(_In):
    """A round's mechanism settings (defaults: the paper's, as in WALLA's Config), bounded so that the deficit
    bound and every payout are finite."""

    variant: Literal[mechanism.VARIANTS] = "I"  # type: ignore[valid-type]
    c1: Annotated[float, Field(strict=True, allow_inf_nan=False, ge=-C_MAX, le=C_MAX)] = 1.0
    c2: Annotated[float, Field(strict=True, allow_inf_nan=False, ge=C_MIN, le=C_MAX)] = 0.5
    c3: Annotated[float, Field(strict=True, allow_inf_nan=False, ge=C_MIN, le=C_MAX)] = 0.5
    pooling: Literal[mechanism.POOL_KINDS] = "linear"  # type: ignore[valid-type]

    @property
    def deficit_bound(self) -> float:
        """Worst-case total net payout of one round: c2^2 / c3 (mechanism.deficit_bound)."""
        return mechanism.deficit_bound(self.c2, self.c3)

    def as_dict(self) -> dict:
        return self.model_dump()


class RoundIn(RoundSettings):
    """POST /rounds."""

    question: Question
    options: Annotated[list[Line], Field(min_length=2, max_length=MAX_OPTIONS)]
    close_at: Annotated[float, Field(strict=True, allow_inf_nan=False, gt=0, le=MAX_TIME)] | None = None
    publish_pool: Literal[PUBLISH] = "resolution"  # type: ignore[valid-type]
    max_wager: Wager | None = None  # the largest wager any report of this round may stake
    criteria: Note | None = None  # how the answer will be decided
    source: Note | None = None  # where the answer will come from

    @model_validator(mode="after")
    def _distinct(self) -> RoundIn:
        check_distinct(list(self.options), "options")
        return self

    @property
    def settings(self) -> RoundSettings:
        return RoundSettings(**{k: getattr(self, k) for k in RoundSettings.model_fields})


class ReportIn(_In):
    """PUT /rounds/{id}/report: a distribution over the round's options and a wager."""

    probabilities: Distribution
    wager: Wager

    @model_validator(mode="after")
    def _simplex(self) -> ReportIn:
        check_simplex(self.probabilities, "probabilities")
        return self


class ResolutionIn(_In):
    """POST /rounds/{id}/resolve: exactly one of `label` (0-based option index) or `target` (a distribution)."""

    label: Annotated[int, Field(strict=True, ge=0, lt=MAX_OPTIONS)] | None = None
    target: Distribution | None = None
    note: Note | None = None  # recorded with the resolution

    @model_validator(mode="after")
    def _one(self) -> ResolutionIn:
        if (self.label is None) == (self.target is None):
            raise ValueError(
                "label: give exactly one of 'label' (an option index) or 'target' (a distribution)"
            )
        if self.target is not None:
            check_simplex(self.target, "target")
        return self

    def target_for(self, k: int) -> list[float]:
        """The outcome as a distribution over the round's k options (ValueError: label or length wrong)."""
        if self.label is not None:
            if self.label >= k:
                raise ValueError(f"label: expected an option index in 0..{k - 1}, got {self.label}")
            return [1.0 if j == self.label else 0.0 for j in range(k)]
        if len(self.target) != k:
            raise ValueError(f"target: expected {k} numbers (one per option), got {len(self.target)}")
        return list(self.target)


class VoidIn(_In):
    """POST /rounds/{id}/void."""

    reason: Annotated[str, Field(min_length=1, max_length=MAX_TEXT), AfterValidator(_question)]


class AgentIn(_In):
    """POST /agents."""

    name: AgentName
    max_wager: Wager | None = None  # the largest wager this agent may stake on one round
    floor: Annotated[float, Field(strict=True, allow_inf_nan=False, ge=-1e15, le=0.0)] | None = None


class AgentToken(BaseModel):
    name: str
    token: str


class RoundOut(BaseModel):
    id: int
    question: str
    options: list[str]
    settings: dict
    deficit_bound: float
    status: str
    close_at: float | None
    created_at: float
    closed_at: float | None
    n_reports: int | None  # None for agents until the round is resolved (privacy)
    publish_pool: str
    max_wager: float | None
    criteria: str | None
    source: str | None
    walla_version: str
    resolution: dict | None


class ReportOut(BaseModel):
    round: int
    agent: str
    probabilities: list[float]
    wager: float
    version: int
    submitted_at: float | None = None


class PoolOut(BaseModel):
    round: int
    probabilities: list[float]
    choice: int
    n_reports: int
    pooling: str
    weights: list[float] | None = None  # the operator's only: per-report weights reveal reports


class ResolutionOut(BaseModel):
    round: int
    resolved_now: bool
    total_payout: float
    deficit_bound: float
    n_reports: int
    payouts: dict[str, float]


class PayoutOut(BaseModel):
    round: int
    seq: int  # the resolution entry: 1, then corrections
    kind: str  # pay | reverse
    wager: float
    score: float
    baseline: float
    advantage: float
    payout: float


class MeOut(BaseModel):
    id: int
    name: str
    role: str
    balance: float
    n_reports: int
    n_payouts: int


class AgentOut(BaseModel):
    id: int
    name: str
    balance: float
    n_reports: int
    n_payouts: int
