"""Serve = offline: the scenario's test questions asked by question_id give walla-train's stored pool."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from walla.cli.lazy import run
from walla.cli.main import app as root
from walla.serve.check import TOLERANCE


def test_served_pool_equals_the_runs_stored_pool(serving):
    pool = serving.fc.pool
    table, record = pool.choice.table, pool.choice.seeds[pool.seed]
    body = {"forecasts": [{"question_id": str(q)} for q in table.question_id]}
    r = httpx.post(serving.url + "/v1/forecasts", json=body, headers=serving.auth, timeout=120)
    assert r.status_code == 200, r.text
    served = np.array([f["probabilities"] for f in r.json()["forecasts"]])  # [N, K]
    wagers = np.array([[a["wager"] for a in f["agents"]] for f in r.json()["forecasts"]])  # [N, M]
    assert np.abs(served - record.agg_probs[:, : served.shape[1]]).max() <= TOLERANCE
    assert np.abs(wagers - record.extras["wagers"]).max() <= TOLERANCE
    # not vacuous: the agents disagree, so the pool depends on the wagers
    assert np.ptp(wagers, axis=1).max() > 1e-3


def test_check_prints_the_max_difference(tiny_pool, capsys):
    args = ["serve", "--runs", str(tiny_pool["runs"]), "--scenario", tiny_pool["scenario"]]
    args += ["--store", str(tiny_pool["store"]), "--check", "--limit", "6"]
    assert run(root, args, "walla") == 0
    out = capsys.readouterr().out
    assert "6 test questions: max |served - offline| pooled probabilities" in out, out


def test_another_identity_is_refused_naming_the_field(served_pool):
    from walla.serve.loading import ServeError, open_model

    a = served_pool.agents[0]
    other = {**a.llm.recorded, "torch": "0.0.1"}  # as if the set had been extracted with another torch
    with pytest.raises(ServeError, match=r"torch: '0.0.1' != ") as e:
        open_model(a.model, served_pool.dataset, other, None, other=False)
    assert "\n" not in str(e.value)
    slot = open_model(a.model, served_pool.dataset, other, None, other=True)  # labelled instead
    try:
        assert slot.differs.startswith("torch: '0.0.1' != ")
    finally:
        slot.backend.close()


def test_a_head_built_while_a_model_loads_elsewhere_is_float32(served_pool):
    """A model loading in another thread sets torch's default dtype for the whole process (transformers'
    from_pretrained, bf16 here); a head built meanwhile must still be the float32 head walla train saved."""
    import torch
    from walla.market.head import AgentHead

    agent = served_pool.agents[0]
    hidden = np.random.default_rng(0).standard_normal(agent.head.in_dim).astype(np.float32)
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        head = AgentHead.from_run(served_pool.run_dir, agent.slot)
    finally:
        torch.set_default_dtype(before)
    assert {p.dtype for p in head.heads.parameters()} == {torch.float32}
    assert head.wager(hidden) == agent.head.wager(hidden)
