"""Learning-free baselines against their SPEC §6 formulas, and StackedGen (batched seeds) on private context."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from method_runs import brier, config_of, informed_mrr, run, run_seeds
from references import load_seed
from scipy.stats import entropy
from synthetic import make_private_context_scenario
from walla.manifests.validate import ConfigError
from walla.store.scenario import ScenarioData
from walla.train.engine import TrainEnv
from walla.train.methods import self_certainty, stacked_gen


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
    _, out = run("uniform", hand, rows=np.arange(2))
    np.testing.assert_allclose(out.weights, 0.5)
    np.testing.assert_allclose(out.agg_probs, hand.probs.mean(1), atol=1e-6)


def test_self_certainty_matches_kl_to_uniform_softmax(hand):
    _, out = run("self-certainty", hand, rows=np.arange(2))
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
    _, out = run("packllm", hand, rows=np.arange(2))
    inv_ppl = 1.0 / np.exp(hand.prompt_nll.astype(np.float64))  # [N, M]
    np.testing.assert_allclose(out.weights, inv_ppl / inv_ppl.sum(1, keepdims=True), rtol=1e-5)
    assert out.weights[0, 0] > out.weights[0, 1]  # lower prompt perplexity -> more weight


def test_option_mask_respected_with_variable_options():
    data = make_private_context_scenario(n=200, m=3, k=5, h=8, seed=1, min_options=3)
    rows = np.arange(200)
    for name in ("uniform", "self-certainty", "packllm"):
        _, out = run(name, data, rows=rows)
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
    _, sc = run("self-certainty", data)
    _, un = run("uniform", data)
    assert brier(sc, data, test) > brier(un, data, test) + 0.02
    assert informed_mrr(sc, data, test) < informed_mrr(un, data, test)


def test_bad_config_keys_and_values():
    with pytest.raises(ConfigError, match="tempreature: unknown key"):
        config_of("self-certainty", {"tempreature": 2.0})
    with pytest.raises(ConfigError, match="lr: unknown key"):
        config_of("uniform", {"lr": 1e-3})
    with pytest.raises(ConfigError, match="tau must be > 0"):
        config_of("packllm", {"tau": 0.0})
    with pytest.raises(ConfigError, match="epochs"):
        config_of("stacked-gen", {"epochs": "many"})
    # YAML reads 5e-7 as a string (SPEC §10.21): accepted as a number
    assert config_of("stacked-gen", {"lr": "5e-7"}).lr == 5e-7
    # the reference parametrization is the default (SPEC §6): per-agent Linear(H -> 4096), MLP [512, 256]
    c = config_of("stacked-gen")
    assert (c.projection_dim, c.hidden, c.batch_size, c.epochs) == (4096, (512, 256), 100, 50)


# ------------------------------------------------------------------------------- StackedGen


@pytest.fixture(scope="module")
def private():
    return make_private_context_scenario(n=600, m=3, k=3, h=16, seed=0)


SG = {"lr": 3e-3, "epochs": 8, "projection_dim": None}  # tests: small, projection-free


def test_stacked_gen_learns_private_context(private):
    test = private.split_index("test")
    state, out = run("stacked-gen", private, SG)
    _, un = run("uniform", private)
    assert informed_mrr(out, private, test) >= 0.9
    assert brier(out, private, test) < brier(un, private, test) - 0.1
    np.testing.assert_allclose(out.weights.sum(1), 1.0, atol=1e-5)
    assert state["best_epoch"] is not None  # validation early stopping tracked a best epoch


def test_stacked_gen_same_seed_same_weights(private):
    cfg = {**SG, "epochs": 3}
    _, a = run("stacked-gen", private, cfg, seed=18)
    _, b = run("stacked-gen", private, cfg, seed=18)
    _, c = run("stacked-gen", private, cfg, seed=19)
    np.testing.assert_array_equal(a.weights, b.weights)
    assert not np.allclose(a.weights, c.weights)


def test_stacked_gen_state_survives_torch_save(private, tmp_path):
    state, out = run("stacked-gen", private, {**SG, "epochs": 1})
    torch.save(state, tmp_path / "state.pt")
    loaded = torch.load(tmp_path / "state.pt", weights_only=False)
    again = stacked_gen.predict(loaded, private, private.split_index("test"), TrainEnv())
    np.testing.assert_array_equal(again.weights, out.weights)


def test_stacked_gen_projection_and_normalize_options(private):
    _, out = run("stacked-gen", private, {**SG, "epochs": 2, "projection_dim": 8, "normalize_hidden": True})
    assert out.weights.shape == (len(private.split_index("test")), 3)
    assert np.isfinite(out.agg_probs).all()


def test_early_stopping_real_vs_reference(private):
    # real early stopping: hidden states carry no signal, so validation stalls while training overfits;
    # the fit stops `patience` epochs after the best one and restores it
    noise = make_private_context_scenario(n=300, m=3, k=3, h=16, seed=4, marker_strength=0.0)
    state, _ = run("stacked-gen", noise, {**SG, "lr": 1e-2, "epochs": 60, "patience": 2})
    assert state["epochs_run"] == state["best_epoch"] + 3 < 60
    # reference (SPEC §10.2): hard targets train every epoch and keep the last state
    state, _ = run("stacked-gen", private, {**SG, "epochs": 4, "reference_early_stopping": True})
    assert state["epochs_run"] == 4 and state["best_epoch"] is None
    # ...but soft-target datasets did select the best epoch by validation KL
    soft = make_private_context_scenario(n=300, m=3, k=2, h=8, seed=2, informed_less_confident=True)
    state, _ = run("stacked-gen", soft, {**SG, "epochs": 4, "reference_early_stopping": True})
    assert state["best_epoch"] is not None


def test_stacked_gen_logs_every_batch(private):
    rows: list[list[dict]] = [[], []]
    run_seeds(
        "stacked-gen",
        private,
        {**SG, "epochs": 2, "batch_size": 100},
        (18, 19),
        logs=[r.append for r in rows],
    )
    n_train = len(private.split_index("train"))
    for r in rows:  # one row per batch and seed, with that seed's own loss
        assert len(r) == 2 * -(-n_train // 100)
        assert {"step", "epoch", "n_seen", "loss", "grad_norm"} <= set(r[0])
    assert rows[0][0]["loss"] != rows[1][0]["loss"]


def test_stacked_gen_seeds_batched_equal_seeds_alone(private):
    """Each seed of a batched fit follows exactly the trajectory of fitting it alone (init, order,
    dropout, per-seed clipping, per-seed early stopping), with and without the per-agent projection."""
    hetero = make_private_context_scenario(n=300, m=3, k=3, h=[8, 12, 6], seed=5)
    for cfg in (
        {**SG, "epochs": 6, "patience": 1, "clip": 0.05, "lr": 1e-2},
        {**SG, "epochs": 3, "projection_dim": 16, "normalize_hidden": True, "clip": 0.05},
    ):
        together, outs = run_seeds("stacked-gen", hetero, cfg, (18, 19, 20))
        alone, solo = run_seeds("stacked-gen", hetero, cfg, (19,))
        assert together[1]["epochs_run"] == alone[0]["epochs_run"]
        assert together[1]["best_epoch"] == alone[0]["best_epoch"]
        for k, v in alone[0]["params"].items():
            torch.testing.assert_close(together[1]["params"][k], v, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(outs[1].weights, solo[0].weights, rtol=1e-5, atol=1e-6)
        assert not np.allclose(outs[0].weights, outs[1].weights)


def test_stacked_gen_projection_is_the_reference_head(private):
    """The projected parametrization: per-agent Linear(H_i -> P) then the MLP on the concatenation."""
    c = config_of("stacked-gen", {**SG, "projection_dim": 8})
    sizes = [16, 16, 16]
    with torch.no_grad():
        torch.manual_seed(0)
        ref = stacked_gen.StackedNet(sizes, c)
        net = stacked_gen.SeedStackedGen(sizes, 1, c)
        load_seed(net, 0, ref)
        xs = [torch.randn(1, 5, 16) for _ in sizes]
        h = torch.cat([lin(x[0]) for lin, x in zip(ref.proj, xs, strict=True)], dim=-1)  # [5, 3*8]
        for j, lin in enumerate(ref.mlp):
            h = lin(h) if j == len(ref.mlp) - 1 else torch.relu(lin(h))
        torch.testing.assert_close(net(xs)[0], h)
