"""LENS (train/methods/lens.py, beyond the paper): per-agent linear confidence predictors on the agent's own
features, trained on its own correctness, used as pooling weights."""

from __future__ import annotations

import dataclasses

import numpy as np
from walla.train.engine import TrainEnv
from walla.train.golden import golden_scenario
from walla.train.methods import REGISTRY, lens


def test_lens_weights_pool_by_predicted_correctness_and_stay_decentralized():
    data = golden_scenario()
    cfg = lens.Config()
    states = lens.fit(data, cfg, [18, 19], TrainEnv(), [None, None])
    test = data.split_index("test")
    out = lens.predict(states[0], data, test, TrainEnv())
    assert np.allclose(out.weights.sum(-1), 1, atol=1e-6) and np.all(out.weights > 0)
    conf = out.extras["confidence"]
    assert conf.shape == (len(test), data.n_agents) and np.all((conf > 0) & (conf < 1))
    again = lens.predict(states[1], data, test, TrainEnv())  # every seed: the same convex fit from zero
    np.testing.assert_array_equal(out.weights, again.weights)
    # the informed agent (its option probs peak on the label) is predicted right more often than not
    train = data.split_index("train")
    c_train = lens.confidences(states[0], data, train)
    right = lens.correct(np.asarray(data.probs[train]), np.asarray(data.target[train]))
    assert np.corrcoef(c_train.ravel(), right.ravel())[0, 1] > 0.3
    # decentralized: another agent's hidden states do not move agent 0's confidence
    other = dataclasses.replace(data, hidden=[data.hidden[0], data.hidden[1][::-1].copy(), data.hidden[2]])
    moved = lens.fit(other, cfg, [18], TrainEnv(), [None])[0]
    np.testing.assert_allclose(
        lens.confidences(moved, other, test)[:, 0], lens.confidences(states[0], data, test)[:, 0], rtol=1e-9
    )
    assert (
        REGISTRY["lens"].display == "LENS (beyond the paper)" and REGISTRY["lens"].group == "learning_based"
    )
