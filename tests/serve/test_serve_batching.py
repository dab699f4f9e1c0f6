"""Dynamic batching: an answer depends on which requests it was batched with only as its tier promises: not
at all on a bitwise set, within the recorded bound on a tolerance set."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
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


@pytest.mark.parametrize("tier", ["bitwise", "tolerance"])
def test_64_concurrent_answers_keep_their_tiers_promise_against_each_asked_alone(request, tier, tmp_path):
    """bitwise (bf16, packed scoring): equal bit for bit; tolerance (float32, padded batches): each agent's
    option log-probabilities within twice the bound its feature set recorded (renormalized)."""
    pool = request.getfixturevalue("served_pool" if tier == "bitwise" else "tolerance_pool")
    assert {a.llm.tier for a in pool.agents} == {tier}
    srv, s = start_serving(pool, tmp_path, max_wait=0.2)  # wait long enough for the batch to gather
    try:
        with httpx.Client(base_url=s.url, headers=s.auth, timeout=120) as client:
            with ThreadPoolExecutor(N) as ex:
                together = list(ex.map(lambda q: client.post("/v1/forecast", json=q), questions()))
            assert all(r.status_code == 200 for r in together), together[0].text
            (batcher,) = s.fc.batchers.values()
            assert batcher.stats.largest >= 8, batcher.stats  # they were batched
            passes = batcher.stats.passes
            batcher.max_wait = 0.0  # asked one at a time: no batch to wait for (64 x 0.2 s of sleep)
            alone = [client.post("/v1/forecast", json=q) for q in questions()]
            assert batcher.stats.passes == passes + N  # one pass each
        assert {r.json()["promise"] for r in together} == {tier}
        if tier == "bitwise":
            for t, a in zip(together, alone, strict=True):
                assert _numbers(t.json()) == _numbers(a.json())  # bit for bit: floats compared exactly
        else:
            bound = 2 * pool.agents[0].llm.promise["bound"]["option_logprobs"]
            gap = max(
                float(np.abs(np.log(ta["probabilities"]) - np.log(aa["probabilities"])).max())
                for t, a in zip(together, alone, strict=True)
                for ta, aa in zip(t.json()["agents"], a.json()["agents"], strict=True)
            )
            print(f"\ntolerance set: max |d log p| together vs alone {gap:.3e} (promise {bound:.1e})")
            assert gap <= bound
        # distinct answers (the tiny tokenizer reads most numbers as one unknown word)
        assert len({tuple(t.json()["probabilities"]) for t in together}) >= 8
    finally:
        srv.__exit__()
        s.fc.stop()
        s.ledger.close()
