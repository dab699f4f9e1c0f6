"""Bad input and faults: one-line 4xx errors, a full queue (429 + Retry-After), a caller that leaves, a failing
agent (`failed_agents`), every agent failing (503)."""

from __future__ import annotations

import dataclasses
import threading
import time

import httpx
import pytest
import torch
from serve_fixtures import start_serving
from walla.train import mechanism

QUESTION = {"question": "Box 3 holds pens. Does box 3 hold cups?", "options": ["Yes", "No"]}


class Gated:
    """A backend whose score() waits for `gate` (and can fail): the tests hold the batcher in a pass."""

    def __init__(self, backend, fail: bool = False) -> None:
        self.inner, self.fail = backend, fail
        self.gate, self.entered = threading.Event(), threading.Event()
        self.prompts = 0
        self.gate.set()

    def score(self, prompts, token_ids, *a, **k):
        self.entered.set()
        self.gate.wait(30)
        if self.fail:
            raise RuntimeError("the model's worker died")
        self.prompts += len(prompts)
        return self.inner.score(prompts, token_ids, *a, **k)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.fixture
def gated(served_pool, tmp_path):
    srv, s = start_serving(served_pool, tmp_path, max_queue=1)
    (batcher,) = s.fc.batchers.values()
    batcher.backend = gate = Gated(batcher.backend)
    yield s, gate
    gate.gate.set()
    srv.__exit__()
    s.fc.stop()
    s.ledger.close()


@pytest.mark.parametrize(
    "body, status, field",
    [
        ({"question": "Q?", "options": []}, 400, "options"),
        ({"question": "Q?", "options": ["Yes", "Ｙｅｓ"]}, 400, "options"),  # the same after NFKC
        ({"question": "Q?", "options": ["Yes", "Y\u200bes"]}, 400, "options"),  # an invisible character
        ({"question": "Q?", "options": [str(i) for i in range(27)]}, 400, "options"),
        ({"question": "x" * 10_001, "options": ["Yes", "No"]}, 400, "question"),
        ({"question": "Q?", "options": ["a", "b", "c"]}, 400, "options"),  # the facts template scores 2
        ({"question": "Q?"}, 400, "question"),
        ({"question_id": "no-such-question"}, 404, "question_id"),
        ({"question_id": "x", "question": "Q?", "options": ["a", "b"]}, 400, "question_id"),
        ({"model": "walla:other/walla-i/seed1", **QUESTION}, 404, "model"),
        ({**QUESTION, "temperature": 0.5}, 400, "temperature"),
    ],
)
def test_bad_forecasts_are_one_line_4xx(serving, body, status, field):
    r = httpx.post(serving.url + "/v1/forecast", json=body, headers=serving.auth)
    assert r.status_code == status, r.text
    assert "\n" not in r.text and r.json()["error"].startswith(field), r.text


def test_non_finite_numbers_and_bad_json_are_400(serving):
    for raw in (b'{"round": 1, "target": [NaN, 1.0]}', b'{"round": 1, "target": [Infinity, 0]}', b"{"):
        r = httpx.post(
            serving.url + "/v1/outcomes",
            content=raw,
            headers={**serving.op, "content-type": "application/json"},
        )
        assert r.status_code == 400 and "\n" not in r.text, r.text
    r = httpx.post(serving.url + "/v1/outcomes", json={"round": 999, "label": 0}, headers=serving.op)
    assert r.status_code == 404, r.text


def test_a_full_queue_answers_429_with_retry_after(gated):
    s, gate = gated
    gate.gate.clear()
    results = {}

    def ask(i):
        results[i] = httpx.post(s.url + "/v1/forecast", json=QUESTION, headers=s.auth, timeout=60)

    first = threading.Thread(target=ask, args=(1,))
    first.start()
    assert gate.entered.wait(30)  # the worker is in the first pass
    second = threading.Thread(target=ask, args=(2,))
    second.start()
    (batcher,) = s.fc.batchers.values()
    deadline = time.monotonic() + 10
    while batcher.queued < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    r = httpx.post(s.url + "/v1/forecast", json=QUESTION, headers=s.auth)
    assert r.status_code == 429 and r.headers["retry-after"] == "1", r.text
    gate.gate.set()
    first.join(60), second.join(60)
    assert results[1].status_code == results[2].status_code == 200


def test_a_caller_that_leaves_frees_its_place(gated):
    s, gate = gated
    gate.gate.clear()
    first = threading.Thread(
        target=lambda: httpx.post(s.url + "/v1/forecast", json=QUESTION, headers=s.auth, timeout=60)
    )
    first.start()
    assert gate.entered.wait(30)
    with pytest.raises(httpx.TimeoutException):  # the caller gives up while its request waits in the queue
        httpx.post(
            s.url + "/v1/forecast", json={**QUESTION, "question": "Another?"}, headers=s.auth, timeout=0.5
        )
    (batcher,) = s.fc.batchers.values()
    time.sleep(1.0)  # the server notices within POLL_S
    gate.gate.set()
    first.join(60)
    deadline = time.monotonic() + 10
    while batcher.queued and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    assert gate.prompts == 1  # the second request was never scored
    r = httpx.post(s.url + "/v1/forecast", json=QUESTION, headers=s.auth)  # and the queue has room
    assert r.status_code == 200


def test_a_caller_that_leaves_frees_its_place_while_the_model_is_busy(gated):
    s, gate = gated  # a queue of one place; the worker held in the first pass
    gate.gate.clear()
    results = {}

    def ask(i, question):
        results[i] = httpx.post(
            s.url + "/v1/forecast", json={**QUESTION, "question": question}, headers=s.auth, timeout=60
        )

    first = threading.Thread(target=ask, args=(1, QUESTION["question"]))
    first.start()
    assert gate.entered.wait(30)
    with pytest.raises(httpx.TimeoutException):  # the second caller gives up while it waits in the queue
        httpx.post(
            s.url + "/v1/forecast", json={**QUESTION, "question": "Another?"}, headers=s.auth, timeout=0.5
        )
    time.sleep(1.0)  # the server notices within POLL_S
    third = threading.Thread(target=ask, args=(3, "A third?"))
    third.start()  # its place is free although the worker is still busy
    third.join(2.0)
    assert 3 not in results, results[3].text  # waiting, not refused with 429
    gate.gate.set()
    first.join(60), third.join(60)
    assert results[1].status_code == results[3].status_code == 200, results[3].text


def test_a_batch_larger_than_the_queue_is_413_with_the_limit(gated):
    s, _ = gated  # --max-queue 1
    body = {"forecasts": [QUESTION, {**QUESTION, "question": "Another?"}]}
    r = httpx.post(s.url + "/v1/forecasts", json=body, headers=s.auth)
    assert r.status_code == 413 and "\n" not in r.text, r.text
    assert r.json()["error"] == (
        "forecasts: 2 forecasts in one request, more than this server queues (1, --max-queue)"
    )


def test_a_failing_agent_is_reported_and_the_others_pool(served_pool, tmp_path):
    a0, a1, a2 = served_pool.agents
    broken = dataclasses.replace(a1.llm, backend=Gated(a1.llm.backend, fail=True))  # its own model, failing
    pool = dataclasses.replace(served_pool, agents=[a0, dataclasses.replace(a1, llm=broken), a2])
    srv, s = start_serving(pool, tmp_path)
    try:
        r = httpx.post(s.url + "/v1/forecast", json=QUESTION, headers=s.auth)
        assert r.status_code == 200, r.text
        out = r.json()
        assert [f["name"] for f in out["failed_agents"]] == [a1.name]
        assert "worker died" in out["failed_agents"][0]["error"]
        assert [a["name"] for a in out["agents"]] == [a0.name, a2.name]
        p = torch.tensor([a["probabilities"] for a in out["agents"]], dtype=torch.float64)
        w = torch.tensor([a["wager"] for a in out["agents"]], dtype=torch.float64)
        assert out["probabilities"] == mechanism.pool(p, w, pool.settings.pooling).tolist()
        assert s.ledger.get_round(out["round"])["n_reports"] == 2
    finally:
        srv.__exit__()
        s.fc.stop()
        s.ledger.close()
    dead = dataclasses.replace(a0.llm, backend=Gated(a0.llm.backend, fail=True))
    pool = dataclasses.replace(
        served_pool, agents=[dataclasses.replace(a, llm=dead) for a in served_pool.agents]
    )
    (tmp_path / "all").mkdir()
    srv, s = start_serving(pool, tmp_path / "all")
    try:
        r = httpx.post(s.url + "/v1/forecast", json=QUESTION, headers=s.auth)
        assert r.status_code == 503 and r.json()["error"].startswith("agents: every agent failed"), r.text
        assert s.ledger.counts()["rounds"] == 0  # nothing half-written
    finally:
        srv.__exit__()
        s.fc.stop()
        s.ledger.close()
