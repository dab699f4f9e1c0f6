"""The serving API: the pool as a model, a forecast as a ledger round, outcomes paid by the mechanism."""

from __future__ import annotations

import httpx
import numpy as np
import torch
from walla.train import mechanism

QUESTION = {"question": "Box 3 holds pens. Does box 3 hold cups?", "options": ["Yes", "No"]}


def test_models_lists_the_pool_with_identities_and_tiers(serving):
    r = httpx.get(serving.url + "/v1/models", headers=serving.auth)
    assert r.status_code == 200, r.text
    (card,) = r.json()["data"]
    pool = serving.fc.pool
    assert card["id"] == pool.model_id and pool.model_id.startswith(
        f"walla:{pool.choice.scenario}/walla-i/seed18@"
    )
    agents = card["walla"]["agents"]
    assert len(agents) == 3 and {a["tier"] for a in agents} == {"bitwise"}
    assert agents[0]["identity"]["dtype"] == "bfloat16" and agents[0]["identity_differs"] is None
    assert card["walla"]["head_version"] == "0.0.0"


def test_forecast_pools_the_agents_reports_and_records_a_round(serving):
    r = httpx.post(serving.url + "/v1/forecast", json=QUESTION, headers=serving.auth)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["options"] == ["Yes", "No"] and len(out["agents"]) == 3 and out["failed_agents"] == []
    p = torch.tensor([a["probabilities"] for a in out["agents"]], dtype=torch.float64)
    w = torch.tensor([a["wager"] for a in out["agents"]], dtype=torch.float64)
    pool = mechanism.pool(p, w, serving.fc.pool.settings.pooling)
    assert np.allclose(out["probabilities"], pool.numpy(), atol=1e-15)
    assert out["choice"] == int(np.argmax(out["probabilities"]))
    assert np.allclose([a["weight"] for a in out["agents"]], mechanism.pool_weights(w).numpy())
    rnd = serving.ledger.get_round(out["round"])
    assert rnd["status"] == "closed" and rnd["n_reports"] == 3 and rnd["publish_pool"] == "operator"
    assert rnd["source"].endswith("caller alice")
    reports = serving.ledger.round_reports(out["round"])
    assert [x["wager"] for x in reports] == [a["wager"] for a in out["agents"]]


def test_forecasts_answers_a_batch(serving):
    body = {"forecasts": [QUESTION, {"question_id": str(serving.fc.pool.choice.table.question_id[0])}]}
    r = httpx.post(serving.url + "/v1/forecasts", json=body, headers=serving.auth)
    assert r.status_code == 200, r.text
    a, b = r.json()["forecasts"]
    assert a["round"] != b["round"] and b["question_id"] == body["forecasts"][1]["question_id"]


def test_forecasts_need_a_token_outcomes_the_operators(serving):
    assert httpx.post(serving.url + "/v1/forecast", json=QUESTION).status_code == 401
    rid = httpx.post(serving.url + "/v1/forecast", json=QUESTION, headers=serving.auth).json()["round"]
    r = httpx.post(serving.url + "/v1/outcomes", json={"round": rid, "label": 0}, headers=serving.auth)
    assert r.status_code == 403 and "operator" in r.json()["error"]


def test_outcomes_pay_every_agent_what_the_mechanism_pays(serving):
    out = httpx.post(serving.url + "/v1/forecast", json=QUESTION, headers=serving.auth).json()
    r = httpx.post(serving.url + "/v1/outcomes", json={"round": out["round"], "label": 1}, headers=serving.op)
    assert r.status_code == 200, r.text
    paid = r.json()
    s = serving.fc.pool.settings
    p = torch.tensor([a["probabilities"] for a in out["agents"]], dtype=torch.float64)
    w = torch.tensor([a["wager"] for a in out["agents"]], dtype=torch.float64)
    q = torch.tensor([0.0, 1.0], dtype=torch.float64)
    want = mechanism.net_payout(p, w, q, s.variant, s.c1, s.c2, s.c3)
    got = [paid["payouts"][a["name"]] for a in out["agents"]]
    assert np.allclose(got, want.numpy(), rtol=0, atol=1e-12)
    assert abs(paid["total_payout"] - float(want.sum())) < 1e-12
    again = httpx.post(
        serving.url + "/v1/outcomes", json={"round": out["round"], "label": 1}, headers=serving.op
    )
    assert again.json()["resolved_now"] is False  # the ledger's idempotent resolution
    other = httpx.post(
        serving.url + "/v1/outcomes", json={"round": out["round"], "label": 0}, headers=serving.op
    )
    assert other.status_code == 409


def test_open_server_needs_no_token_for_forecasts(served_pool, tmp_path):
    from serve_fixtures import start_serving

    srv, s = start_serving(served_pool, tmp_path, open_access=True)
    try:
        r = httpx.post(s.url + "/v1/forecast", json=QUESTION)
        assert r.status_code == 200, r.text
        assert s.ledger.get_round(r.json()["round"])["source"].endswith("caller open")
        assert httpx.post(s.url + "/v1/outcomes", json={"round": 1, "label": 0}).status_code == 401
    finally:
        srv.__exit__()
        s.fc.stop()
        s.ledger.close()
