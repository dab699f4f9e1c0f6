"""No client input causes a 5xx on any /v1 endpoint: hypothesis generates bodies (well-formed, nearly so and
not at all), tokens and raw bytes; every answer is a 2xx or a 4xx with one JSON line.

In-process (the ASGI app through starlette's TestClient), bounded and derandomized; the counts of answers per
status are printed (pytest -s).
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from serve_fixtures import OP_TOKEN
from starlette.testclient import TestClient
from walla.market.ledger import CALLER, Ledger
from walla.serve.app import create_serve_app
from walla.serve.forecast import Forecaster

MAX_EXAMPLES = 300
ENDPOINTS = [
    ("GET", "/v1/models"),
    ("POST", "/v1/forecast"),
    ("POST", "/v1/forecasts"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/outcomes"),
]
FIELDS = ["model", "question", "options", "context", "question_id", "forecasts", "round", "label", "target"]
FIELDS += ["note", "messages", "walla", "stream", "role", "content"]

text = st.text(max_size=40) | st.sampled_from(
    ["Yes", "No", "Ｙｅｓ", "Y\u200bes", "A. Yes\nB. No", "\x00", "\ud800"]
)
scalar = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | text
)
json_value = st.recursive(
    scalar,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(text, inner, max_size=4),
    max_leaves=12,
)


@st.composite
def body(draw, pool):
    """A body near a valid one: the right keys with random, plausible or valid values."""
    model = draw(st.sampled_from([pool.model_id, "walla:x/y/seed1", ""]))
    question = draw(text | st.just("Box 3 holds pens. Does box 3 hold cups?"))
    options = draw(st.lists(text, max_size=4) | st.just(["Yes", "No"]))
    qid = draw(st.sampled_from([str(pool.choice.table.question_id[0]), "nope", ""]))
    forecast = draw(
        st.fixed_dictionaries(
            {},
            optional={
                "model": st.just(model),
                "question": st.just(question),
                "options": st.just(options),
                "context": text,
                "question_id": st.just(qid),
            },
        )
    )
    chat = {
        "model": model,
        "messages": [
            {
                "role": draw(st.sampled_from(["user", "system", 3])),
                "content": draw(text | st.just(f"{question}\nA. Yes\nB. No")),
            }
        ],
    }
    if draw(st.booleans()):
        chat["walla"] = {"options": options}
    outcome = draw(
        st.fixed_dictionaries(
            {},
            optional={
                "round": st.integers(-1, 5) | json_value,
                "label": st.integers(-1, 3) | json_value,
                "target": st.lists(st.floats(allow_nan=True), max_size=3) | json_value,
            },
        )
    )
    extra = draw(st.dictionaries(st.sampled_from(FIELDS), json_value, max_size=3))
    choice = draw(st.sampled_from(["forecast", "forecasts", "chat", "outcome", "extra", "raw"]))
    if choice == "forecasts":
        return {"forecasts": [forecast] * draw(st.integers(0, 3))}
    return {"forecast": forecast, "chat": chat, "outcome": outcome, "extra": {**forecast, **extra}}.get(
        choice, draw(json_value)
    )


@pytest.fixture(scope="module")
def client(served_pool, tmp_path_factory):
    ledger = Ledger.open(str(tmp_path_factory.mktemp("fuzz") / "serve.db"))
    ledger.ensure_operator(OP_TOKEN)
    token = ledger.add_agent("alice", role=CALLER)
    fc = Forecaster(served_pool, ledger).start()
    with TestClient(create_serve_app(fc), raise_server_exceptions=False) as c:
        yield c, token
    fc.stop()
    ledger.close()


def test_no_input_gets_a_5xx(client, served_pool):
    c, token = client
    counts: Counter = Counter()
    tokens = st.sampled_from([token, OP_TOKEN, "garbage-token", "", None])

    @settings(
        max_examples=MAX_EXAMPLES, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck)
    )
    @given(st.sampled_from(ENDPOINTS), body(served_pool), tokens, st.booleans())
    def one(endpoint, payload, tok, raw):
        method, path = endpoint
        headers = {"Authorization": f"Bearer {tok}"} if tok is not None else {}
        if raw:  # not JSON at all, or JSON with NaN / huge numbers, as sent
            content = json.dumps(payload, allow_nan=True, default=str).encode("utf-8", "surrogatepass")[:-1]
        else:
            content = json.dumps(payload, allow_nan=True, default=str).encode("utf-8", "surrogatepass")
        r = c.request(method, path, content=content, headers={**headers, "content-type": "application/json"})
        counts[r.status_code] += 1
        assert r.status_code < 500, (method, path, payload, r.text)
        assert "\n" not in r.text
        if r.status_code >= 400:
            assert "error" in r.json()

    one()
    print(f"\nstatus counts over {sum(counts.values())} requests: {dict(sorted(counts.items()))}")
    assert counts[200] > 0 and sum(v for k, v in counts.items() if 400 <= k < 500) > 0
