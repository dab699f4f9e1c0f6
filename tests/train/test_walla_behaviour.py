"""WALLA learns whom to trust on synthetic private-context scenarios (no LLM).

(a) one informed, confident agent per question: WALLA I and II wager on it (MRR >= 0.9), wagers track
    realized advantages (Pearson r >= 0.5), and the pooled prediction beats UniformAvg and SelfCertainty.
(b) BayesX-like: the informed agent is LESS confident but right; WALLA still beats UniformAvg.
(f) same seed -> identical outputs, different seed -> different outputs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from synthetic import make_private_context_scenario
from walla.manifests.validate import ConfigError, build
from walla.train import mechanism
from walla.train.engine import TrainEnv
from walla.train.methods import walla

FAST = {"lr": 3e-3, "epochs": 6, "patience": 1000, "projection_dim": None}  # learnable fast, small heads
ENV = TrainEnv()


def _fit(data, raw: dict, seed: int, log=None) -> dict:
    return walla.fit(data, build(walla.Config, raw, "test"), [seed], ENV, [log])[0]


def _predict(state, data, rows):
    return walla.predict(state, data, rows, ENV)


def _brier(p: np.ndarray, y: np.ndarray) -> float:
    return float(mechanism.brier_loss(torch.from_numpy(p), torch.from_numpy(y)).mean())


def _kl(p: np.ndarray, y: np.ndarray) -> float:
    return float((y * (np.log(y + 1e-10) - np.log(np.clip(p, 1e-10, 1)))).sum(-1).mean())


def _uniform(probs: np.ndarray) -> np.ndarray:
    return mechanism.pool(torch.from_numpy(probs), torch.ones(probs.shape[:2])).numpy()


def _self_certainty(probs: np.ndarray) -> np.ndarray:
    """SPEC §6 SelfCertainty: weights = softmax over agents of max(KL(U || p_i), 0) + 1e-8."""
    p = np.clip(probs, 1e-12, None)
    k = p.shape[-1]
    c = np.maximum(-np.log(k) - np.log(p).mean(-1), 0) + 1e-8  # [n, M]
    w = np.exp(c - c.max(1, keepdims=True))
    return mechanism.pool(torch.from_numpy(probs), torch.from_numpy(w / w.sum(1, keepdims=True))).numpy()


def _mrr(wagers: np.ndarray, probs: np.ndarray, target: np.ndarray) -> float:
    """SPEC §8: best = argmin per-agent Brier (lowest index on ties), stable descending sort of wagers."""
    best = ((probs - target[:, None, :]) ** 2).sum(-1).argmin(1)
    order = np.argsort(-wagers, axis=1, kind="stable")
    rank = (order == best[:, None]).argmax(1) + 1
    return float((1.0 / rank).mean())


@pytest.fixture(scope="module")
def private():
    return make_private_context_scenario(n=1200, m=4, k=2, h=32, seed=1)


@pytest.fixture(scope="module")
def bayesx():
    return make_private_context_scenario(n=1000, m=4, k=2, h=32, seed=2, informed_less_confident=True)


@pytest.mark.parametrize("variant", ["I", "II"])
def test_private_context_walla_wagers_on_the_informed_agent(private, variant):
    data = private
    state = _fit(data, {**FAST, "variant": variant}, 18)
    test = data.split_index("test")
    out = _predict(state, data, test)
    probs, y = data.probs[test], data.target[test]
    w = out.extras["wagers"]
    assert out.weights.shape == w.shape == (len(test), 4)
    np.testing.assert_allclose(out.weights.sum(1), 1.0, rtol=1e-5)
    assert _mrr(w, probs, y) >= 0.9
    r = np.corrcoef(w.ravel(), out.extras["advantage"].ravel())[0, 1]
    assert r >= 0.5
    walla_brier = _brier(out.agg_probs, y)
    assert walla_brier < _brier(_uniform(probs), y)
    assert walla_brier < _brier(_self_certainty(probs), y)
    # payouts are the mechanism's net payout of the eval wagers
    np.testing.assert_allclose(out.extras["payouts"], w * (out.extras["advantage"] - 0.5 * w), atol=1e-6)


def test_bayesx_like_less_confident_informed_agent(bayesx):
    data = bayesx
    state = _fit(data, {**FAST, "variant": "I"}, 18)
    test = data.split_index("test")
    out = _predict(state, data, test)
    probs, y = data.probs[test], data.target[test]
    uni = _uniform(probs)
    assert state["cfg"]["stop_metric"] == "kl"
    assert _brier(out.agg_probs, y) < _brier(uni, y)
    assert _kl(out.agg_probs, y) < _kl(uni, y)
    # confidence weighting is fooled here, WALLA is not
    assert _kl(out.agg_probs, y) < _kl(_self_certainty(probs), y)


def test_log_pooling_and_diagnostics_outputs(bayesx):
    data = bayesx
    state = _fit(data, {**FAST, "epochs": 1, "pooling": "log", "diagnostics": True}, 18)
    rows = np.arange(len(data.split))
    out = _predict(state, data, rows)
    assert set(out.extras) >= {"wagers", "payouts", "advantage", "pred_score", "pred_baseline"}
    expect = mechanism.pool(
        torch.from_numpy(data.probs), torch.from_numpy(out.extras["wagers"]), "log"
    ).numpy()
    np.testing.assert_allclose(out.agg_probs, expect, atol=1e-6)
    assert np.all((out.extras["pred_score"] > 0) & (out.extras["pred_score"] < 1))


def test_same_seed_identical_different_seed_different(private):
    data = private
    cfg = {**FAST, "epochs": 1}
    rows = data.split_index("test")
    a = _predict(_fit(data, cfg, 21), data, rows)
    b = _predict(_fit(data, cfg, 21), data, rows)
    c = _predict(_fit(data, cfg, 22), data, rows)
    np.testing.assert_array_equal(a.weights, b.weights)
    np.testing.assert_array_equal(a.agg_probs, b.agg_probs)
    assert np.abs(a.weights - c.weights).max() > 1e-4


def test_training_log_per_batch(private):
    logs: list[dict] = []
    _fit(private, {**FAST, "epochs": 2, "window": 3}, 18, logs.append)
    n_train = len(private.split_index("train"))
    assert len(logs) == 2 * int(np.ceil(n_train / 100))
    assert [r["step"] for r in logs] == list(range(1, len(logs) + 1))
    assert logs[-1]["n_seen"] == 2 * n_train
    assert np.isnan(logs[0]["window_metric"]) and np.isfinite(logs[3]["window_metric"])
    assert {"loss", "stop_metric", "wager_0", "advantage_3"} <= set(logs[0])


def test_bad_config_is_one_clear_error(private):
    with pytest.raises(ConfigError, match="lrr: unknown key.*did you mean 'lr'"):
        build(walla.Config, {"lrr": 1e-3}, "walla")
    with pytest.raises(ConfigError, match="variant must be 'I' or 'II', got 'III'"):
        build(walla.Config, {"variant": "III"}, "walla")


def test_spec_defaults_are_the_reference_parametrization():
    c = walla.Config()
    assert (c.lr, c.epochs, c.patience, c.batch_size, c.temperature, c.clip) == (
        5e-7,
        50,
        10_000,
        100,
        2.0,
        1.0,
    )
    assert (c.hidden, c.dropout, c.projection_dim, c.c1, c.c2, c.c3) == ((512, 256), 0.1, 4096, 1.0, 0.5, 0.5)
