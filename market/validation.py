"""Request bodies -> checked values. Every refusal is one ClientError naming the field and what was expected.

Limits (stated once, enforced here and by the server's body-size guard):
    probabilities   K finite numbers >= -SIMPLEX_ATOL summing to 1 within SIMPLEX_ATOL (1e-4, the tolerance
                    of walla.train.mechanism's own checks); stored exactly as sent
    wager           a finite number in [0, MAX_WAGER]
    options         2..MAX_OPTIONS distinct non-empty strings; question <= MAX_TEXT characters
    c1 finite; c2, c3 finite and > 0; variant I | II; pooling linear | log (walla.train.mechanism's names)
    resolution      exactly one of `label` (0-based option index) or `target` (a distribution over the options)
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass
from typing import Any

from walla.market.errors import ClientError, bad
from walla.train import mechanism
from walla.train.mechanism_checks import SIMPLEX_ATOL

MAX_OPTIONS = 26
MAX_TEXT = 10_000
MAX_WAGER = 1e6  # keeps w^2 in the payout finite; the mechanism itself puts no upper bound on wagers
NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


@dataclass(frozen=True)
class RoundSettings:
    """A round's mechanism settings (defaults: the paper's, as in WALLA's Config)."""

    variant: str = "I"
    c1: float = 1.0
    c2: float = 0.5
    c3: float = 0.5
    pooling: str = "linear"

    @property
    def deficit_bound(self) -> float:
        """Worst-case total net payout of one round: c2^2 / c3 (mechanism.deficit_bound)."""
        return mechanism.deficit_bound(self.c2, self.c3)

    def as_dict(self) -> dict:
        return asdict(self)


def parse_json(body: bytes) -> dict:
    """The request body as a JSON object (NaN/Infinity literals parse; the field checks refuse them)."""
    try:
        data = json.loads(body.decode("utf-8")) if body else None
    except (UnicodeDecodeError, ValueError) as e:
        raise bad("body", f"not valid JSON ({str(e).splitlines()[0]})") from None
    except RecursionError:
        raise bad("body", "JSON nested too deeply") from None
    if not isinstance(data, dict):
        raise bad("body", f"expected a JSON object, got {type(data).__name__}")
    return data


def only_fields(data: dict, allowed: tuple[str, ...], required: tuple[str, ...] = ()) -> None:
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise bad(unknown[0], f"unknown field (expected {', '.join(allowed)})")
    for key in required:
        if key not in data:
            raise bad(key, "missing")


def number(data: dict, key: str, default: float | None = None) -> float:
    """A finite real number (bool refused: JSON true is not a number)."""
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad(key, f"expected a number, got {json.dumps(value)[:40]}")
    value = float(value)
    if not math.isfinite(value):
        raise bad(key, f"must be finite, got {value}")
    return value


def text(data: dict, key: str, limit: int = MAX_TEXT) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value.strip():
        raise bad(key, "expected a non-empty string")
    if len(value) > limit:
        raise bad(key, f"longer than {limit} characters ({len(value)})")
    return value


def agent_name(name: Any) -> str:
    if not isinstance(name, str) or not NAME.match(name):
        raise bad("name", f"expected 1-64 characters of A-Z a-z 0-9 _ . -, got {json.dumps(name)[:70]}")
    return name


def settings(data: dict) -> RoundSettings:
    d = RoundSettings()
    variant = data.get("variant", d.variant)
    if variant not in mechanism.VARIANTS:
        raise bad("variant", f"expected one of {list(mechanism.VARIANTS)}, got {json.dumps(variant)[:40]}")
    pooling = data.get("pooling", d.pooling)
    if pooling not in mechanism.POOL_KINDS:
        raise bad("pooling", f"expected one of {list(mechanism.POOL_KINDS)}, got {json.dumps(pooling)[:40]}")
    c1, c2, c3 = number(data, "c1", d.c1), number(data, "c2", d.c2), number(data, "c3", d.c3)
    for key, value in (("c2", c2), ("c3", c3)):
        if value <= 0:
            raise bad(key, f"must be > 0, got {value}")
    return RoundSettings(variant, c1, c2, c3, pooling)


def round_body(data: dict, now: float) -> tuple[str, list[str], RoundSettings, float | None]:
    """POST /rounds: (question, options, settings, close_at)."""
    only_fields(
        data,
        ("question", "options", "variant", "c1", "c2", "c3", "pooling", "close_at"),
        ("question", "options"),
    )
    question = text(data, "question")
    options = data["options"]
    if not isinstance(options, list) or not 2 <= len(options) <= MAX_OPTIONS:
        raise bad("options", f"expected a list of 2..{MAX_OPTIONS} strings")
    for i, o in enumerate(options):
        if not isinstance(o, str) or not o.strip() or len(o) > 1000:
            raise bad(f"options[{i}]", "expected a non-empty string of <= 1000 characters")
    if len(set(options)) != len(options):
        raise bad("options", "must be distinct")
    close_at = None
    if data.get("close_at") is not None:
        close_at = number(data, "close_at")
        if close_at <= now:
            raise bad("close_at", f"must be in the future (unix seconds > {now:.0f}), got {close_at}")
    return question, list(options), settings(data), close_at


def distribution(value: Any, key: str, k: int) -> list[float]:
    """K finite numbers on the probability simplex (tolerance SIMPLEX_ATOL), returned as sent."""
    if not isinstance(value, list):
        raise bad(key, f"expected a list of {k} numbers")
    if len(value) != k:
        raise bad(key, f"expected {k} numbers (one per option), got {len(value)}")
    out = []
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise bad(f"{key}[{i}]", f"expected a number, got {json.dumps(v)[:40]}")
        if not math.isfinite(v):
            raise bad(f"{key}[{i}]", f"must be finite, got {v}")
        if v < -SIMPLEX_ATOL:
            raise bad(f"{key}[{i}]", f"negative probability {v}")
        out.append(float(v))
    total = math.fsum(out)
    if abs(total - 1.0) > SIMPLEX_ATOL:
        raise bad(key, f"sums to {total:.6g}, expected 1 within {SIMPLEX_ATOL:g}")
    return out


def report_body(data: dict, k: int) -> tuple[list[float], float]:
    """PUT /rounds/{id}/report: (probabilities, wager)."""
    only_fields(data, ("probabilities", "wager"), ("probabilities", "wager"))
    probs = distribution(data["probabilities"], "probabilities", k)
    wager = number(data, "wager")
    if wager < 0:
        raise bad("wager", f"must be >= 0, got {wager}")
    if wager > MAX_WAGER:
        raise bad("wager", f"must be <= {MAX_WAGER:g}, got {wager}")
    return probs, wager


def resolution_body(data: dict, k: int) -> tuple[int | None, list[float]]:
    """POST /rounds/{id}/resolve: (label or None, target distribution [K])."""
    only_fields(data, ("label", "target"))
    if ("label" in data) == ("target" in data):
        raise bad("label", "give exactly one of 'label' (an option index) or 'target' (a distribution)")
    if "label" in data:
        label = data["label"]
        if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < k:
            raise bad("label", f"expected an option index in 0..{k - 1}, got {json.dumps(label)[:40]}")
        return label, [1.0 if j == label else 0.0 for j in range(k)]
    return None, distribution(data["target"], "target", k)


def positive_id(value: str, key: str = "round") -> int:
    try:
        out = int(value)
    except (TypeError, ValueError):
        raise ClientError(404, f"{key}: no such id {value!r}") from None
    if not 1 <= out < 2**62:  # beyond any id, and beyond a database integer
        raise ClientError(404, f"{key}: no such id {value!r}")
    return out
