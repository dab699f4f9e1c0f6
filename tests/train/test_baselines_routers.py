"""Text routers (RouteLLM, RouterDC, NIRTRouter): losses on hand cases, context learning, finetune mode."""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np
import pytest
import torch
from method_runs import HASHING, brier, config_of, informed_mrr, run, run_seeds
from synthetic import make_private_context_scenario
from walla.manifests.validate import ConfigError
from walla.train.methods import embedding_cache
from walla.train.methods.nirt_router import Config as NIRTConfig
from walla.train.methods.nirt_router import NIRTHead, PosLinear
from walla.train.methods.router_dc import contrastive_loss

FAST = {**HASHING, "lr": 3e-2}  # frozen model-free encoder, a head lr for a fresh linear layer
LRS = {"route-llm": 3e-2, "router-dc": 5e-2, "nirt-router": 1e-2}


def _fast(name: str) -> dict:
    return {**HASHING, "lr": LRS[name.removesuffix("-ctx")]}


@pytest.fixture(scope="module")
def private():
    return make_private_context_scenario(n=600, m=3, k=3, h=8, seed=0)


# ------------------------------------------------------------------------------- hand cases


def test_router_dc_contrastive_loss_hand_case():
    logits = torch.tensor([[0.5, 0.2, -0.1], [0.3, 0.1, -0.4], [0.2, 0.0, 0.1]])
    p_gold = torch.tensor(
        [
            [0.9, 0.3, 0.05],  # plain case
            [0.6, 0.55, 0.005],  # agent 1 is no negative (p > 0.5)
            [0.008, 0.004, 0.001],
        ]
    )  # every positive below 0.01: contributes 0
    loss = contrastive_loss(logits, p_gold, top_k=2, last_k=2)

    def nll(pos: float, negs: list[float]) -> float:
        return -(pos - math.log(sum(math.exp(v) for v in [pos, *negs])))

    # rank 0 positive = best agent; negatives = 2 worst (never the positive itself, never p > 0.5)
    r0 = [nll(0.5, [0.2, -0.1]), nll(0.3, [-0.4]), 0.0]
    # rank 1 positive = second agent; it is also among the 2 worst, so it is dropped from its negatives
    r1 = [nll(0.2, [-0.1]), nll(0.1, [-0.4]), 0.0]
    expected = (np.mean(r0) + np.mean(r1)) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    # top_k / last_k larger than M are clamped
    assert torch.isfinite(contrastive_loss(logits, p_gold, top_k=5, last_k=5))


def test_nirt_head_probabilities_and_pos_linear():
    c = NIRTConfig()
    torch.manual_seed(0)
    head = NIRTHead(d_in=6, n_agents=4, c=c).eval()
    with torch.no_grad():
        head.l1.weight.fill_(-0.3)  # raw weights negative: the effective weight is still |W| >= 0
        p = torch.sigmoid(head(torch.randn(32, 6) * 10))
    assert p.shape == (32, 4) and (p > 0).all() and (p < 1).all()
    assert (head.l1.effective_weight() >= 0).all() and (head.l2.effective_weight() >= 0).all()
    lin = PosLinear(3, 1)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[-1.0, 2.0, -0.5]]))
    x = torch.zeros(1, 3)
    for j in range(3):  # monotone non-decreasing in every input
        assert lin(x + torch.eye(3)[j]).item() >= lin(x).item()
    assert len(head.reg_layers()) == 6


# ------------------------------------------------------------------------------- learning


@pytest.mark.parametrize("name", ["route-llm", "router-dc"])
def test_context_routers_find_the_informed_agent(private, name):
    _, un = run("uniform", private)
    _, with_ctx = run(f"{name}-ctx", private, _fast(name))
    _, no_ctx = run(name, private, _fast(name))
    assert informed_mrr(with_ctx, private) >= 0.9
    assert brier(with_ctx, private) < brier(un, private) - 0.02
    # the no-context prompt carries no hint of who holds the context
    assert informed_mrr(no_ctx, private) < 0.75
    assert brier(no_ctx, private) > brier(un, private) - 0.02


def test_nirt_router_fits_and_weights_are_distributions(private):
    state, out = run("nirt-router-ctx", private, {**_fast("nirt-router"), "epochs": 2})
    assert out.weights.shape == (len(private.split_index("test")), 3)
    np.testing.assert_allclose(out.weights.sum(1), 1.0, atol=1e-5)
    assert np.isfinite(out.agg_probs).all() and state["epochs_run"] <= 2


@pytest.mark.parametrize("name", ["route-llm-ctx", "router-dc", "nirt-router"])
def test_same_seed_same_weights(private, name):
    cfg = {**_fast(name.removesuffix("-ctx")), "epochs": 2}
    _, a = run(name, private, cfg, seed=18)
    _, b = run(name, private, cfg, seed=18)
    _, c = run(name, private, cfg, seed=19)
    np.testing.assert_array_equal(a.weights, b.weights)
    assert not np.array_equal(a.weights, c.weights)
    states, outs = run_seeds(name, private, cfg, (18, 19))  # several seeds in one call: the same fits
    np.testing.assert_array_equal(outs[0].weights, a.weights)
    np.testing.assert_array_equal(outs[1].weights, c.weights)


def test_frozen_embeddings_are_encoded_once(private, monkeypatch, tmp_path):
    from walla.train.engine import TrainEnv

    calls = []
    real = embedding_cache._encode_uncached
    monkeypatch.setattr(
        embedding_cache, "_encode_uncached", lambda t, s, d, b=64: calls.append(len(t)) or real(t, s, d, b)
    )
    monkeypatch.setattr(embedding_cache, "_MEMORY", OrderedDict())  # a fresh memory cache
    env = TrainEnv(store=tmp_path)
    for name in ("route-llm-ctx", "router-dc-ctx", "nirt-router-ctx"):
        cfg = {**_fast(name), "epochs": 1, "truncation_side": "left"}  # one spec for all three
        run_seeds(name, private, cfg, (18, 19), env=env)
    assert len(calls) == 1  # one text set, one encoder spec: encoded once for all methods and seeds
    assert len(list((tmp_path / "embeddings" / "hashing").glob("*.npy"))) == 1


def test_router_configs_fail_clearly(private):
    import copy

    data = copy.copy(private)
    data.prompts = None
    with pytest.raises(ValueError, match="ScenarioData.prompts is None"):
        run("route-llm-ctx", data, FAST)
    with pytest.raises(ConfigError, match="top_k: unknown key"):
        config_of("route-llm", {**FAST, "top_k": 2})
    with pytest.raises(ConfigError, match="encoder_lr_mult"):  # hashing has nothing to fine-tune
        config_of("route-llm", {"encoder": "hashing", "pooling": "none"})
    with pytest.raises(ConfigError, match="pooling"):
        config_of("router-dc", {"pooling": "max"})
    with pytest.raises(ConfigError, match="truncation_side"):
        config_of("nirt-router", {"truncation_side": "middle"})


PAPER = {  # SPEC §6
    "route-llm": {
        "encoder": "bert-base-uncased",
        "pooling": "pooler",
        "truncation_side": "right",
        "lr": 5e-5,
        "encoder_lr_mult": 1.0,
        "weight_decay": 0.01,
        "clip": 1.0,
        "batch_size": 50,
        "epochs": 5,
        "dropout": 0.1,
        "temperature": 2.0,
        "max_len": 512,
    },
    "router-dc": {
        "encoder": "microsoft/mdeberta-v3-base",
        "pooling": "cls",
        "truncation_side": "left",
        "lr": 1e-6,
        "encoder_lr_mult": 0.01,
        "clip": 0.5,
        "skip_grad_norm_above": 1000.0,
        "top_k": 3,
        "last_k": 3,
        "temperature": 1.0,
        "expert_init_std": 0.78,
        "epochs": 5,
    },
    "nirt-router": {
        "encoder": "bert-base-uncased",
        "pooling": "pooler",
        "truncation_side": "left",
        "lr": 1e-4,
        "encoder_lr_mult": 1.0,
        "weight_decay": 0.01,
        "clip": 1.0,
        "batch_size": 50,
        "ce_weight": 0.25,
        "reg_weight": 1e-4,
        "temperature": 1.0,
    },
}


@pytest.mark.parametrize("name", list(PAPER))
def test_paper_defaults(name):
    """Config defaults = SPEC §6 (the paper's routers); the demo overrides them in its manifests."""
    c = config_of(name)
    assert {k: getattr(c, k) for k in PAPER[name]} == PAPER[name]
    assert config_of(f"{name}-ctx").with_context and not c.with_context
