"""Options mean what they say (issue 48, item 1): where the template scores fixed option strings (facts:
" Yes", " No"), each option given is scored as the string it reads as, in any order; an option the
template cannot score is refused with one line; a template listing the options scores their letters."""

from __future__ import annotations

import dataclasses

import httpx
import pytest
from walla.extract.prompts import get_template
from walla.market.api import ClientError

QUESTION = "Box 6 holds keys. Does box 6 hold keys?"


def ask(serving, options: list[str]) -> httpx.Response:
    return httpx.post(
        serving.url + "/v1/forecast", json={"question": QUESTION, "options": options}, headers=serving.auth
    )


def test_options_in_another_order_are_scored_by_their_text(serving):
    yes_no, no_yes = ask(serving, ["Yes", "No"]).json(), ask(serving, ["No", "Yes"]).json()
    assert no_yes["options"] == ["No", "Yes"]
    assert no_yes["probabilities"] == yes_no["probabilities"][::-1]
    assert no_yes["answer"] == yes_no["answer"]
    for a, b in zip(yes_no["agents"], no_yes["agents"], strict=True):
        assert b["probabilities"] == a["probabilities"][::-1] and b["wager"] == a["wager"]
    assert ask(serving, ["yes", "NO"]).json()["probabilities"] == yes_no["probabilities"]  # any case


def test_options_the_template_cannot_score_are_refused(serving):
    for options in (["Red", "Blue"], ["Yes", "Maybe"], ["No", "Yes", "Maybe"]):
        r = ask(serving, options)
        assert r.status_code == 400, r.text
        assert "\n" not in r.text and r.json()["error"].startswith("options: the facts template scores"), (
            r.text
        )
        assert "'Yes', 'No'" in r.json()["error"]


def test_chat_options_in_another_order_answer_by_text(serving):
    forward = ask(serving, ["Yes", "No"]).json()
    body = {
        "model": serving.fc.pool.model_id,
        "messages": [{"role": "user", "content": f"{QUESTION}\nA. No\nB. Yes"}],
    }
    r = httpx.post(serving.url + "/v1/chat/completions", json=body, headers=serving.auth)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["choices"][0]["message"]["content"] == forward["answer"]
    assert out["walla"]["probabilities"] == forward["probabilities"][::-1]
    body["messages"][0]["content"] = f"{QUESTION}\nA. Red\nB. Blue"
    r = httpx.post(serving.url + "/v1/chat/completions", json=body, headers=serving.auth)
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("options:"), r.text


def test_a_stored_question_names_its_options(serving):
    qid = str(serving.fc.pool.choice.table.question_id[0])
    r = httpx.post(serving.url + "/v1/forecast", json={"question_id": qid}, headers=serving.auth)
    assert r.status_code == 200 and r.json()["options"] == ["Yes", "No"], r.text


@pytest.mark.parametrize("options", [["Paris", "Rome"], ["Rome", "Paris", "Oslo"]])
def test_a_template_listing_the_options_scores_their_letters(served_pool, options):
    from walla.serve.forecast import scored_strings  # issue 48's: imported here so the others run without it

    pool = dataclasses.replace(served_pool, template=get_template("mc"), option_tokens=None, dataset="mmlu")
    assert scored_strings(pool, options) == ["A", "B", "C"][: len(options)]
    with pytest.raises(ClientError, match="options:"):
        scored_strings(pool, [str(i) for i in range(27)])
