"""Learning-free baselines against their SPEC §6 formulas, and StackedGen on synthetic private context."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import entropy
from synthetic import make_private_context_scenario
from walla.store.scenario import ScenarioData
from walla.train.mechanism import brier_loss
from walla.train.methods import get_method, packllm, self_certainty, stacked_gen, uniform

FAST = {"engine": "loop"}


def _hand_scenario(probs: np.ndarray, mask: np.ndarray, label: np.ndarray, nll: np.ndarray) -> ScenarioData:
    """A scenario straight from arrays: probs [N, M, K], option mask [N, K], labels [N], prompt NLL [N, M]."""
    n, m, k = probs.shape
    return ScenarioData(
        name="hand",
        dataset="hand",
        agents=[f"a{i}" for i in range(m)],
        question_id=np.array([f"q{j}" for j in range(n)]),
        split=np.array(["test"] * n),
        question=[f"question {j}" for j in range(n)],
        prompts=None,
        n_options=mask.sum(1).astype(np.int64),
        option_mask=mask,
        probs=probs.astype(np.float32),
        label=label,
        target=np.eye(k, dtype=np.float32)[label],
        soft_target=False,
        prompt_nll=nll.astype(np.float32),
        variant=np.zeros((n, m), dtype=np.int8),
        hidden=[np.zeros((n, 2), dtype=np.float32) for _ in range(m)],
    )


def _run(name: str, data: ScenarioData, cfg: dict | None = None, seed: int = 18, rows=None):
    info, mod = get_method(name)
    state = mod.fit(data, {**info.defaults, **(cfg or {})}, seed)
    rows = data.split_index("test") if rows is None else rows
    return state, mod.predict(state, data, rows)


def _brier(out, data, rows) -> float:
    return float(brier_loss(torch.tensor(out.agg_probs), torch.tensor(data.target[rows])).mean())


def _informed_mrr(out, data, rows) -> float:
    """MRR of the informed (context-holding) agent in a stable descending sort of the weights."""
    order = np.argsort(-out.weights, axis=1, kind="stable")
    rank = np.argmax(order == data.meta["informed"][rows][:, None], axis=1) + 1
    return float((1.0 / rank).mean())


# ------------------------------------------------------------------------------- learning-free


@pytest.fixture
def hand():
    probs = np.array(
        [
            [[0.7, 0.2, 0.1], [0.4, 0.35, 0.25]],  # 3 real options
            [[0.9, 0.1, 0.0], [0.5, 0.5, 0.0]],  # 2 real options (K_q = 2), third masked
        ]
    )
    mask = np.array([[True, True, True], [True, True, False]])
    nll = np.array([[1.0, 2.0], [0.5, 0.1]])
    return _hand_scenario(probs, mask, np.array([0, 1]), nll)


def test_uniform_is_plain_average(hand):
    _, out = _run("uniform", hand, rows=np.arange(2))
    np.testing.assert_allclose(out.weights, 0.5)
    np.testing.assert_allclose(out.agg_probs, hand.probs.mean(1), atol=1e-6)


def test_self_certainty_matches_kl_to_uniform_softmax(hand):
    _, out = _run("self-certainty", hand, rows=np.arange(2))
    for j in range(2):
        kq = int(hand.n_options[j])
        u = np.full(kq, 1.0 / kq)
        c = np.array([entropy(u, hand.probs[j, i, :kq].astype(np.float64)) for i in range(2)])  # KL(U||p)
        c = np.maximum(c, 0) + 1e-8
        w = np.exp(c) / np.exp(c).sum()  # softmax across agents (SPEC §10.8), not c / sum(c)
        np.testing.assert_allclose(out.weights[j], w, rtol=1e-5)
        np.testing.assert_allclose(out.agg_probs[j], (w[:, None] * hand.probs[j]).sum(0), atol=1e-6)
    # the more confident agent gets more weight, but not proportionally
    assert out.weights[0, 0] > out.weights[0, 1]
    assert not np.allclose(out.weights[0], c / c.sum())
    assert out.agg_probs[1, 2] == 0.0  # masked option stays empty


def test_packllm_inverse_perplexity(hand):
    _, out = _run("packllm", hand, rows=np.arange(2))
    inv_ppl = 1.0 / np.exp(hand.prompt_nll.astype(np.float64))  # [N, M]
    np.testing.assert_allclose(out.weights, inv_ppl / inv_ppl.sum(1, keepdims=True), rtol=1e-5)
    assert out.weights[0, 0] > out.weights[0, 1]  # lower prompt perplexity -> more weight


def test_option_mask_respected_with_variable_options():
    data = make_private_context_scenario(n=200, m=3, k=5, h=8, seed=1, min_options=3)
    rows = np.arange(200)
    for mod in (uniform, self_certainty, packllm):
        out = mod.predict(mod.fit(data, {}, 18), data, rows)
        assert out.weights.shape == (200, 3) and out.agg_probs.shape == (200, 5)
        np.testing.assert_allclose(out.weights.sum(1), 1.0, atol=1e-5)
        np.testing.assert_allclose(out.agg_probs.sum(1), 1.0, atol=1e-5)
        assert (out.agg_probs[~data.option_mask] == 0).all()
    # SelfCertainty's KL runs over each question's real options only: -log K_q - mean log p
    conf = self_certainty.confidence(
        torch.tensor(data.probs, dtype=torch.float64), torch.tensor(data.option_mask)
    )
    j = int(np.flatnonzero(data.n_options == 3)[0])
    p = data.probs[j, 0, :3].astype(np.float64)
    assert conf[j, 0].item() == pytest.approx(entropy(np.full(3, 1 / 3), p), rel=1e-5)


def test_bayesx_like_self_certainty_worse_than_uniform():
    """Informed agent less confident but right: confidence weighting picks the wrong agents (paper)."""
    data = make_private_context_scenario(n=400, m=4, k=2, h=8, seed=3, informed_less_confident=True)
    test = data.split_index("test")
    _, sc = _run("self-certainty", data)
    _, un = _run("uniform", data)
    assert _brier(sc, data, test) > _brier(un, data, test) + 0.02
    assert _informed_mrr(sc, data, test) < _informed_mrr(un, data, test)


def test_bad_config_keys_and_values(hand):
    with pytest.raises(ValueError, match="unknown config key 'tempreature'"):
        self_certainty.fit(hand, {"tempreature": 2.0}, 18)
    with pytest.raises(ValueError, match="unknown config key 'lr'"):
        uniform.fit(hand, {"lr": 1e-3}, 18)
    with pytest.raises(ValueError, match="'tau' must be > 0"):
        packllm.fit(hand, {"tau": 0.0}, 18)
    with pytest.raises(ValueError, match="'epochs': expected an integer"):
        stacked_gen.fit(hand, {"epochs": "many"}, 18)
    # YAML reads 5e-7 as a string (SPEC §10.21): accepted as a number
    assert stacked_gen.build_config(stacked_gen.StackedGenConfig, {"lr": "5e-7"}, "x").lr == 5e-7


# ------------------------------------------------------------------------------- StackedGen


@pytest.fixture(scope="module")
def private():
    return make_private_context_scenario(n=600, m=3, k=3, h=16, seed=0)


SG = {"lr": 3e-3, "epochs": 8, **FAST}


def test_stacked_gen_learns_private_context(private):
    test = private.split_index("test")
    state, out = _run("stacked-gen", private, SG)
    _, un = _run("uniform", private)
    assert _informed_mrr(out, private, test) >= 0.9
    assert _brier(out, private, test) < _brier(un, private, test) - 0.1
    np.testing.assert_allclose(out.weights.sum(1), 1.0, atol=1e-5)
    assert state["best_epoch"] is not None  # validation early stopping tracked a best epoch


def test_stacked_gen_same_seed_same_weights(private):
    cfg = {**SG, "epochs": 3}
    _, a = _run("stacked-gen", private, cfg, seed=18)
    _, b = _run("stacked-gen", private, cfg, seed=18)
    _, c = _run("stacked-gen", private, cfg, seed=19)
    np.testing.assert_array_equal(a.weights, b.weights)
    assert not np.allclose(a.weights, c.weights)


def test_stacked_gen_projection_and_normalize_options(private):
    _, out = _run("stacked-gen", private, {**SG, "epochs": 2, "projection_dim": 8, "normalize_hidden": True})
    assert out.weights.shape == (len(private.split_index("test")), 3)
    assert np.isfinite(out.agg_probs).all()


def test_early_stopping_real_vs_reference(private):
    # real early stopping: hidden states carry no signal, so validation stalls while training overfits;
    # the fit stops `patience` epochs after the best one and restores it
    noise = make_private_context_scenario(n=300, m=3, k=3, h=16, seed=4, marker_strength=0.0)
    state, _ = _run("stacked-gen", noise, {**SG, "lr": 1e-2, "epochs": 60, "patience": 2})
    assert state["epochs_run"] == state["best_epoch"] + 3 < 60
    # reference (SPEC §10.2): hard targets train every epoch and keep the last state
    state, _ = _run("stacked-gen", private, {**SG, "epochs": 4, "reference_early_stopping": True})
    assert state["epochs_run"] == 4 and state["best_epoch"] is None
    # ...but soft-target datasets did select the best epoch by validation KL
    soft = make_private_context_scenario(n=300, m=3, k=2, h=8, seed=2, informed_less_confident=True)
    state, _ = _run("stacked-gen", soft, {**SG, "epochs": 4, "reference_early_stopping": True})
    assert state["best_epoch"] is not None


def test_stacked_gen_logs_every_batch(private):
    rows = []
    info, mod = get_method("stacked-gen")
    mod.fit(private, {**SG, "epochs": 2, "batch_size": 100}, 18, log=rows.append)
    n_train = len(private.split_index("train"))
    assert len(rows) == 2 * -(-n_train // 100)
    assert {"step", "epoch", "n_seen", "loss"} <= set(rows[0])
