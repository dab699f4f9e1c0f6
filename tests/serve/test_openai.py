"""/v1/chat/completions with the official `openai` package: the pool's answer and log-probabilities."""

from __future__ import annotations

import math

import httpx
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
