"""/v1/chat/completions with the official `openai` package: the pool's answer and log-probabilities."""

from __future__ import annotations

import json
import math

import httpx
import numpy as np
import pytest

openai = pytest.importorskip(
    "openai", reason="the OpenAI-compatibility test needs the openai package (dev extra)"
)

QUESTION = "Box 6 holds keys. Does box 6 hold keys?"


def test_openai_client_gets_the_pooled_answer(serving):
    client = openai.OpenAI(base_url=serving.url + "/v1", api_key=serving.caller_token, max_retries=0)
    (model,) = client.models.list().data
    assert model.id == serving.fc.pool.model_id
    resp = client.chat.completions.create(
        model=model.id,
        messages=[
            {"role": "system", "content": "Answer."},
            {"role": "user", "content": f"{QUESTION}\nA. Yes\nB. No"},
        ],
        logprobs=True,
        top_logprobs=2,
    )
    choice = resp.choices[0]
    top = choice.logprobs.content[0].top_logprobs
    assert [t.token for t in top] == ["Yes", "No"]
    probs = [math.exp(t.logprob) for t in top]
    assert abs(sum(probs) - 1) < 1e-9
    assert choice.message.content == ["Yes", "No"][probs.index(max(probs))]
    # the same question through /v1/forecast pools the same numbers
    direct = httpx.post(
        serving.url + "/v1/forecast",
        json={"question": QUESTION, "options": ["Yes", "No"]},
        headers=serving.auth,
    ).json()
    assert [math.log(p) for p in direct["probabilities"]] == [t.logprob for t in top]
    assert resp.usage.prompt_tokens == sum(a["prompt_tokens"] for a in direct["agents"]) > 0
    # options in the extension block instead of the message
    ext = client.chat.completions.create(
        model=model.id,
        messages=[{"role": "user", "content": QUESTION}],
        extra_body={"walla": {"options": ["Yes", "No"]}},
    )
    assert ext.choices[0].message.content == choice.message.content


def test_openai_client_sees_errors_as_openai_errors(serving):
    client = openai.OpenAI(base_url=serving.url + "/v1", api_key=serving.caller_token, max_retries=0)
    with pytest.raises(openai.NotFoundError, match="unknown model"):
        client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "Q?\nA. x\nB. y"}]
        )
    with pytest.raises(openai.BadRequestError, match="no options"):
        client.chat.completions.create(
            model=serving.fc.pool.model_id, messages=[{"role": "user", "content": "Q?"}]
        )
    bad = openai.OpenAI(base_url=serving.url + "/v1", api_key="not-a-token-of-this-ledger", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_openai_client_streams_the_answer(serving):
    """issue 45 item 5: `stream=True` is a valid SSE stream: one chunk with the answer and its logprobs, then
    [DONE], read by the official client's streaming call."""
    client = openai.OpenAI(base_url=serving.url + "/v1", api_key=serving.caller_token, max_retries=0)
    messages = [{"role": "user", "content": f"{QUESTION}\nA. Yes\nB. No"}]
    whole = client.chat.completions.create(model=serving.fc.pool.model_id, messages=messages, logprobs=True)
    chunks = list(
        client.chat.completions.create(
            model=serving.fc.pool.model_id, messages=messages, logprobs=True, stream=True
        )
    )
    assert len(chunks) == 1 and chunks[0].object == "chat.completion.chunk"
    (choice,) = chunks[0].choices
    assert choice.delta.role == "assistant" and choice.delta.content == whole.choices[0].message.content
    assert choice.finish_reason == "stop"
    top = [(t.token, t.logprob) for t in choice.logprobs.content[0].top_logprobs]
    assert top == [(t.token, t.logprob) for t in whole.choices[0].logprobs.content[0].top_logprobs]


def test_tools_and_n_are_refused_response_format_names_the_options(serving):
    """issue 45 item 5: a body with `tools` (an agent loop) or n > 1 is a 400 OpenAI error, not silently
    ignored; a JSON-schema `enum` in response_format gives the options, and the content is that JSON."""
    client = openai.OpenAI(base_url=serving.url + "/v1", api_key=serving.caller_token, max_retries=0)
    model, messages = serving.fc.pool.model_id, [{"role": "user", "content": f"{QUESTION}\nA. Yes\nB. No"}]
    tool = {
        "type": "function",
        "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}},
    }
    with pytest.raises(
        openai.BadRequestError, match="tools: the pool answers multiple-choice questions only"
    ):
        client.chat.completions.create(model=model, messages=messages, tools=[tool])
    with pytest.raises(openai.BadRequestError, match="n: the pool gives one answer"):
        client.chat.completions.create(model=model, messages=messages, n=2)
    plain = client.chat.completions.create(model=model, messages=messages).choices[0].message.content
    schema = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {"enum": ["Yes", "No"]}}}
    resp = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": QUESTION}], response_format=schema
    )
    assert json.loads(resp.choices[0].message.content) == plain
    with pytest.raises(openai.BadRequestError, match="response_format"):
        bad = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}
        client.chat.completions.create(model=model, messages=messages, response_format=bad)


def test_the_pool_abstains_below_the_callers_threshold(serving):
    """issue 45 item 4: `"walla": {"abstain_below": p}`: below p the answer abstains (choice and answer null,
    the pool still given; in chat the content ABSTAIN); at or above p it answers."""
    body = {"question": QUESTION, "options": ["Yes", "No"]}
    url, auth = serving.url + "/v1/forecast", serving.auth
    plain = httpx.post(url, json=body, headers=auth).json()
    top = max(plain["probabilities"])
    below = httpx.post(
        url, json={**body, "walla": {"abstain_below": min(1.0, top + 1e-6)}}, headers=auth
    ).json()
    assert below["abstained"] is True and below["choice"] is None and below["answer"] is None
    assert below["probabilities"] == plain["probabilities"]
    above = httpx.post(url, json={**body, "walla": {"abstain_below": top}}, headers=auth).json()
    assert above["abstained"] is False and above["answer"] == plain["answer"]
    assert httpx.post(url, json={**body, "walla": {"abstain_below": 1.5}}, headers=auth).status_code == 400
    client = openai.OpenAI(base_url=serving.url + "/v1", api_key=serving.caller_token, max_retries=0)
    resp = client.chat.completions.create(
        model=serving.fc.pool.model_id,
        messages=[{"role": "user", "content": f"{QUESTION}\nA. Yes\nB. No"}],
        extra_body={"walla": {"abstain_below": 1.0}},
    )
    assert resp.choices[0].message.content == "ABSTAIN" and resp.choices[0].finish_reason == "stop"
    assert resp.model_extra["walla"]["abstained"] is True


def test_models_carry_the_runs_offline_accuracy_coverage(serving):
    """issue 45 item 4: /v1/models gives the run's accuracy-coverage table (its test questions, offline), so a
    caller chooses abstain_below from data; each row is the answered share and accuracy of walla train's pool."""
    card = httpx.get(serving.url + "/v1/models", headers=serving.auth).json()["data"][0]["walla"]["selective"]
    pool = serving.fc.pool
    record, table = pool.choice.seeds[pool.seed], pool.choice.table
    agg = np.asarray(record.agg_probs, dtype=np.float64)
    conf, right = agg.max(-1), agg.argmax(-1) == np.asarray(table.label)
    assert card["n"] == len(table.question_id) > 0
    for row in card["thresholds"]:
        answered = conf >= row["abstain_below"] - 1e-12
        assert row["coverage"] == pytest.approx(answered.mean())
        assert row["accuracy"] == (pytest.approx(right[answered].mean()) if answered.any() else None)
    assert [r["coverage"] for r in card["coverages"]] == [0.5, 0.8]
    assert all(0.0 <= r["accuracy"] <= 1.0 for r in card["coverages"])
