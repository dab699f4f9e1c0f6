"""Dynamic batching: an answer does not depend on which requests it was batched with (tier `bitwise`)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
from serve_fixtures import start_serving

N = 64


def questions() -> list[dict]:
    """64 distinct questions in the facts dataset's form."""
    colors = ["red", "blue", "green", "white"]
    return [
        {
            "question": f"The lamp in room {i} is {colors[i % 4]}. Is the lamp in room {i} {colors[(i // 4) % 4]}?",
            "options": ["Yes", "No"],
        }
        for i in range(N)
    ]


def _numbers(out: dict) -> tuple:
    return out["probabilities"], [(a["probabilities"], a["wager"], a["weight"]) for a in out["agents"]]


def test_64_concurrent_answers_equal_each_asked_alone(served_pool, tmp_path):
    assert {a.llm.tier for a in served_pool.agents} == {"bitwise"}
    srv, s = start_serving(served_pool, tmp_path, max_wait=0.2)  # wait long enough for the batch to gather
    try:
        with httpx.Client(base_url=s.url, headers=s.auth, timeout=120) as client:
            with ThreadPoolExecutor(N) as ex:
                together = list(ex.map(lambda q: client.post("/v1/forecast", json=q), questions()))
            assert all(r.status_code == 200 for r in together), together[0].text
            (batcher,) = s.fc.batchers.values()
            assert batcher.stats.largest >= 8, batcher.stats  # they were batched
            passes = batcher.stats.passes
            alone = [client.post("/v1/forecast", json=q) for q in questions()]
            assert batcher.stats.passes == passes + N  # one pass each
        for t, a in zip(together, alone, strict=True):
            assert _numbers(t.json()) == _numbers(a.json())  # bit for bit: floats compared exactly
        # distinct answers (the tiny tokenizer reads most numbers as one unknown word)
        assert len({tuple(t.json()["probabilities"]) for t in together}) >= 8
    finally:
        srv.__exit__()
        s.fc.stop()
        s.ledger.close()
