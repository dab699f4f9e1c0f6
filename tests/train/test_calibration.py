"""Adaptive temperature calibration (SPEC §9): fitted on train + val, per context role, lowers NLL."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from synthetic import make_private_context_scenario
from walla.manifests.validate import build
from walla.train.calibration import (
    CalibrationConfig,
    apply_calibration,
    fit_calibration,
    temperatures,
)
from walla.train.engine import TrainEnv
from walla.train.methods import walla

FAST = {"lr": 1e-2, "epochs": 15}
ENV = TrainEnv()


def _cal(raw: dict) -> CalibrationConfig:
    return build(CalibrationConfig, raw, "test")


def _sharpen(probs: np.ndarray, factor: float) -> np.ndarray:
    z = np.log(np.clip(probs, 1e-30, 1)) * factor
    z -= z.max(-1, keepdims=True)
    e = np.exp(z)
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


def _nll(probs: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Per-agent mean NLL [M]: probs [n, M, K], target [n, K]."""
    return -np.log(np.clip((probs * target[:, None, :]).sum(-1), 1e-10, 1)).mean(0)


@pytest.fixture(scope="module")
def overconfident():
    data = make_private_context_scenario(n=800, m=3, k=3, h=[16, 24, 16], seed=4, min_options=2)
    data.probs[:, 0] = _sharpen(data.probs[:, 0], 4.0)  # agent 0: deliberately over-confident
    return data


def test_calibration_lowers_heldout_nll_of_overconfident_agent(overconfident):
    data = overconfident
    state = fit_calibration(data, _cal(FAST))
    assert state["agent"] == [0, 0, 1, 1, 2, 2] and state["role"] == [0, 1] * 3  # per context role
    assert all(state["fitted"])
    test = data.split_index("test")
    raw, cal = (
        _nll(data.probs[test], data.target[test]),
        _nll(apply_calibration(state, data, test), data.target[test]),
    )
    assert cal[0] < 0.6 * raw[0]  # the over-confident agent improves a lot on unseen rows
    temps = temperatures(state, data, test)
    assert temps[:, 0].mean() > 1.5  # ... by being cooled down
    before, after = zip(*state["holdout_nll"], strict=True)
    assert all(a <= b + 1e-6 for a, b in zip(after, before, strict=True))  # best state restored


def test_calibration_uses_the_training_view_only(overconfident):
    """train + val rows (SPEC §9: the reference's train_val partition) decide the fit; test rows do not."""
    data = overconfident
    a = fit_calibration(data, _cal({**FAST, "epochs": 2}))
    changed = make_private_context_scenario(n=800, m=3, k=3, h=[16, 24, 16], seed=4, min_options=2)
    changed.probs[:, 0] = data.probs[:, 0]
    held = np.flatnonzero(changed.split == "test")
    changed.probs[held] = changed.probs[held][:, ::-1]  # scramble val/test predictions
    changed.hidden[0][held] = 0.0
    b = fit_calibration(changed, _cal({**FAST, "epochs": 2}))
    torch.testing.assert_close(a["params"][0], b["params"][0])
    val = np.flatnonzero(changed.split == "val")
    changed.hidden[0][val] = 0.0  # val rows are training rows of the calibration heads
    c = fit_calibration(changed, _cal({**FAST, "epochs": 2}))
    assert not torch.allclose(a["params"][0], c["params"][0])


def test_subset_of_agents_and_identity_at_init(overconfident):
    data = overconfident
    state = fit_calibration(data, _cal({**FAST, "agents": [0], "by_role": "no", "epochs": 1, "lr": 1e-12}))
    assert state["agent"] == [0] and state["role"] == [-1]
    rows = np.arange(50)
    out = apply_calibration(state, data, rows)
    np.testing.assert_allclose(
        out[:, 1:], data.probs[rows, 1:], atol=1e-6
    )  # uncalibrated agents pass through
    np.testing.assert_allclose(out[:, 0], data.probs[rows, 0], atol=1e-4)  # T ~ t0 = 1 at (near) init
    absent = np.broadcast_to(~data.option_mask[rows][:, None, :], out.shape)
    assert absent.any() and out[absent].max() == 0.0  # absent options stay at probability 0
    with pytest.raises(ValueError, match="calibration agents \\[5\\] out of range"):
        fit_calibration(data, _cal({"agents": [5]}))


def test_walla_calibrated_outputs_agent_probs(overconfident):
    data = overconfident
    raw = {"lr": 3e-3, "epochs": 1, "calibrated": True, "calibration": {**FAST, "epochs": 3}}
    cfg = build(walla.Config, {**raw, "projection_dim": None, "hidden": [16, 8]}, "test")
    (state,) = walla.fit(data, cfg, [18], ENV, [None])
    rows = data.split_index("test")
    out = walla.predict(state, data, rows, ENV)
    expect = apply_calibration(state["calibration"], data, rows)
    np.testing.assert_allclose(out.extras["agent_probs"], expect, atol=1e-6)
    assert not np.allclose(out.extras["agent_probs"], data.probs[rows], atol=1e-3)


def test_each_head_trains_as_if_alone_and_resting_heads_never_move(overconfident):
    """Heads with different row counts rest in the tail of every epoch, some stop early (patience 1),
    unfitted ones never train: torch's AdamW (weight decay on) must leave a resting head untouched."""
    data = overconfident
    raw = {**FAST, "epochs": 6, "patience": 1, "weight_decay": 0.1}
    both = fit_calibration(data, _cal({**raw, "agents": [0, 2]}))
    alone = fit_calibration(data, _cal({**raw, "agents": [0]}))
    assert both["agent"] == [0, 0, 2, 2] and alone["agent"] == [0, 0]
    for a, b in zip(both["params"], alone["params"], strict=True):
        torch.testing.assert_close(a[:2], b, atol=1e-6, rtol=1e-6)  # agent 0's heads, either way
    n_rows = [int((data.variant[:, 0] == r).sum()) for r in (1, 0)]  # the two roles' sizes
    threshold = (min(n_rows) + max(n_rows)) // 2
    some = fit_calibration(data, _cal({**raw, "agents": [0], "min_rows": threshold}))
    none = fit_calibration(data, _cal({**raw, "agents": [0], "min_rows": 10**6}))
    assert sorted(some["fitted"]) == [False, True] and none["fitted"] == [False, False]
    for g, fitted in enumerate(some["fitted"]):
        same = all(torch.equal(a[g], b[g]) for a, b in zip(some["params"], none["params"], strict=True))
        assert same != fitted  # the unfitted head is exactly its init, the fitted one moved
