"""Per-agent standardisation of hidden states (issue: demo wagers collapsing on unnormalised inputs)."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from synthetic import make_private_context_scenario
from walla.train.engine import TrainEnv
from walla.train.methods import walla
from walla.train.methods.walla import Config, hidden_stats


def _scaled(scale: float, shift: float):
    """Synthetic hidden states at LLM-like scale: x20, and two "massive activation" dimensions ~300."""
    data = make_private_context_scenario(n=600, m=3, k=2, h=16, seed=4, marker_strength=3.0)
    rng = np.random.default_rng(0)
    hidden = []
    for h in data.hidden:
        h = h * scale + shift
        h[:, :2] += 300.0 + 30.0 * rng.standard_normal((len(h), 2))
        hidden.append(h)
    return dataclasses.replace(data, hidden=hidden)


def _test_wagers(data, cfg: Config) -> tuple[np.ndarray, np.ndarray]:
    (state,) = walla.fit(data, cfg, [18], TrainEnv(), [None])
    test = data.split_index("test")
    w = walla.predict(state, data, test, TrainEnv()).extras["wagers"]  # [n, M]
    informed = data.meta["informed"][test]
    mask = np.zeros_like(w, dtype=bool)
    mask[np.arange(len(test)), informed] = True
    return w[mask], w[~mask]


def test_stats_are_each_agents_own_train_rows():
    data = _scaled(20.0, 5.0)
    train = data.split_index("train")
    mean, std = hidden_stats(data, train)
    for i, h in enumerate(data.hidden):
        np.testing.assert_allclose(mean[i].numpy(), h[train].astype(np.float64).mean(0), atol=1e-5)
        np.testing.assert_allclose(std[i].numpy(), h[train].astype(np.float64).std(0), rtol=1e-5)


def test_standardised_heads_keep_wagers_alive_on_large_inputs():
    """At LLM-like input scale and a demo-sized step, raw inputs saturate the sigmoid; standardised ones
    keep every wager above 1e-3 while the informed agent still wagers >= 10x the others."""
    data = _scaled(20.0, 5.0)
    base = Config(lr=5e-4, epochs=10, batch_size=50, projection_dim=None, hidden=(512, 256), patience=10_000)
    inf_raw, oth_raw = _test_wagers(data, base)
    inf_std, oth_std = _test_wagers(data, dataclasses.replace(base, standardize=True))
    assert oth_raw.mean() < 1e-3  # collapse without standardisation
    assert oth_std.mean() >= 1e-3 and inf_std.mean() >= 10 * oth_std.mean()


def test_predict_applies_the_training_statistics():
    data = _scaled(3.0, -2.0)
    cfg = Config(lr=1e-3, epochs=1, batch_size=50, projection_dim=None, hidden=(8,), standardize=True)
    (state,) = walla.fit(data, cfg, [18], TrainEnv(), [None])
    assert state["hidden_stats"] is not None
    shifted = dataclasses.replace(data, hidden=[h + 0.0 for h in data.hidden])
    a = walla.predict(state, data, np.arange(10), TrainEnv()).weights
    b = walla.predict(state, shifted, np.arange(10), TrainEnv()).weights
    np.testing.assert_array_equal(a, b)
    assert torch.is_tensor(state["hidden_stats"][0])
