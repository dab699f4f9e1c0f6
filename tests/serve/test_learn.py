"""--learn: an outcome moves each agent's head by walla-train's own step on its own advantage (AgentHead.update,
as the market's learning agents take it), and /v1/models shows the new head version."""

from __future__ import annotations

import httpx
import torch
from serve_fixtures import fresh_heads, start_serving
from walla.market.head import AgentHead
from walla.train import mechanism

QUESTION = {"question": "The cup on desk 4 is full. Is the cup on desk 4 empty?", "options": ["Yes", "No"]}


def _params(head: AgentHead) -> list[torch.Tensor]:
    return [p.detach().clone() for p in head.heads.parameters()]


def test_learn_moves_each_head_by_trains_step(served_pool, tmp_path):
    pool = fresh_heads(served_pool)
    before = [_params(a.head) for a in pool.agents]
    srv, s = start_serving(pool, tmp_path, learn=True)
    try:
        out = httpx.post(s.url + "/v1/forecast", json=QUESTION, headers=s.auth).json()
        hidden = list(s.fc.hidden[out["round"]])  # the features each head wagered on
        r = httpx.post(s.url + "/v1/outcomes", json={"round": out["round"], "label": 1}, headers=s.op)
        assert r.status_code == 200, r.text
        assert r.json()["learned"] == [a.name for a in pool.agents]
        card = httpx.get(s.url + "/v1/models", headers=s.auth).json()["data"][0]["walla"]
        assert card["head_version"] == "1.1.1" and card["learning"] is True
    finally:
        srv.__exit__()
        s.fc.stop()
        s.ledger.close()
    st = pool.settings
    p = torch.tensor([a["probabilities"] for a in out["agents"]], dtype=torch.float64)
    w = torch.tensor([a["wager"] for a in out["agents"]], dtype=torch.float64)
    adv = mechanism.advantage(p, w, torch.tensor([0.0, 1.0], dtype=torch.float64), st.variant, st.c1, st.c2)
    for a, h, old, own in zip(pool.agents, hidden, before, adv.tolist(), strict=True):
        ref = AgentHead.from_run(pool.run_dir, a.slot)  # the run's head, one step of train's own update
        ref.update([(h, own)])
        new = _params(a.head)
        assert any(not torch.equal(x, y) for x, y in zip(new, old, strict=True))  # it moved
        for x, y in zip(new, _params(ref), strict=True):
            assert torch.equal(x, y)  # by exactly train's step on its own advantage
