"""The serving API's request types: the market's constrained types (market/api/_models.py) for every text and
number, plus what a forecast adds. FastAPI checks them at the door; /openapi.json states them.

Options are compared for duplicates after NFKC normalization and removal of invisible (format, Cf)
characters, so "Yes" and "Ｙｅｓ" or "Y\u200bes" are one option twice (400).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from walla.market.api import MAX_OPTIONS, Id, Line, Note, Question, ResolutionIn
from walla.market.text import check_distinct

MAX_BATCH = 64  # forecasts in one POST /v1/forecasts
MAX_MESSAGES = 64
QuestionId = Annotated[str, Field(min_length=1, max_length=200)]
ModelId = Annotated[str, Field(min_length=1, max_length=300)]
Options = Annotated[list[Line], Field(min_length=2, max_length=MAX_OPTIONS)]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Probability = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]


class ForecastOptions(_In):
    abstain_below: Probability | None = None  # the pool abstains when its top probability is below this


class ForecastIn(_In):
    """POST /v1/forecast: a new question with its options (and an optional context), or a stored one."""

    model: ModelId | None = None  # the pool's id (GET /v1/models); None: the one served
    question: Question | None = None
    options: Options | None = None
    context: Note | None = None
    question_id: QuestionId | None = None  # a stored question of the scenario's dataset
    walla: ForecastOptions | None = None  # {"abstain_below": p}

    @model_validator(mode="after")
    def _one(self) -> ForecastIn:
        if self.question_id is not None:
            if self.question is not None or self.options is not None or self.context is not None:
                raise ValueError("question_id: give either question_id or question + options, not both")
            return self
        if self.question is None or self.options is None:
            raise ValueError("question: give question and options (or a stored question_id)")
        check_distinct(list(self.options), "options")
        return self


class ForecastsIn(_In):
    """POST /v1/forecasts: up to MAX_BATCH forecasts, answered together."""

    model: ModelId | None = None
    forecasts: Annotated[list[ForecastIn], Field(min_length=1, max_length=MAX_BATCH)]


class OutcomeIn(ResolutionIn):
    """POST /v1/outcomes (the operator's token): the answer to an earlier forecast's round."""

    round: Id


class WallaExtension(_In):
    options: Options | None = None
    context: Note | None = None
    abstain_below: Probability | None = None


class ChatIn(BaseModel):
    """POST /v1/chat/completions: OpenAI's body; other OpenAI fields (temperature, logprobs, ...) are accepted
    and ignored: the answer is the pool's choice, never sampled."""

    model_config = ConfigDict(extra="allow", frozen=True)

    model: ModelId
    messages: Annotated[list[dict[str, Any]], Field(min_length=1, max_length=MAX_MESSAGES)]
    walla: WallaExtension | None = None
    stream: bool | None = None
    n: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None


def schema_options(response_format: dict | None) -> list[str] | None:
    """The options a `response_format` names: a JSON schema whose `enum` lists strings (OpenAI's
    {"type": "json_schema", "json_schema": {"schema": {"enum": [...]}}}); None for any other format.

    Raises:
        ValueError: a json_schema format whose schema is not an enum of strings (names the field).
    """
    if not response_format or response_format.get("type") != "json_schema":
        return None
    schema = (response_format.get("json_schema") or {}).get("schema")
    enum = schema.get("enum") if isinstance(schema, dict) else None
    if not isinstance(enum, list) or not all(isinstance(x, str) for x in enum):
        raise ValueError(
            "response_format: the pool answers with one of the options: give a json_schema whose schema is "
            '{"enum": [the options, as strings]}'
        )
    return list(enum)


OPTION_LINE = re.compile(r"^\s*\(?([A-Z])[.):]\s+(\S.*)$")


def message_text(message: dict) -> str:
    """The text of one chat message (a string, or OpenAI's list of text parts)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if parts and all(isinstance(t, str) for t in parts):
            return "\n".join(parts)
    raise ValueError("messages: the last user message needs text content (a string or text parts)")


def split_options(text: str) -> tuple[str, list[str]]:
    """'question\\nA. first\\nB. second' -> ('question', ['first', 'second']): the trailing block of lines
    lettered A, B, C, ... in order (ValueError when there is none)."""
    lines = text.rstrip().split("\n")
    options: list[str] = []
    i = len(lines)
    while i > 0:
        m = OPTION_LINE.match(lines[i - 1])
        if not m:
            break
        options.insert(0, m.group(2).strip())
        i -= 1
        if m.group(1) == "A":
            break
    letters = [chr(65 + j) for j in range(len(options))]
    got = [OPTION_LINE.match(line).group(1) for line in lines[i:]] if options else []
    if len(options) < 2 or got != letters:
        raise ValueError(
            "messages: no options: give walla.options, or end the last user message with lines "
            "'A. ...', 'B. ...'"
        )
    question = "\n".join(lines[:i]).strip()
    if not question:
        raise ValueError("messages: the last user message has options but no question before them")
    return question, options
