"""Text routers (RouteLLM, RouterDC, NIRTRouter): losses on hand cases, context learning, finetune mode."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from synthetic import make_private_context_scenario
from walla.train import encoders
from walla.train.mechanism import brier_loss
from walla.train.methods import get_method
from walla.train.methods.nirt_router import NIRTConfig, NIRTHead, PosLinear
from walla.train.methods.router_dc import contrastive_loss

FAST = {"encoder": "hashing", "engine": "loop"}


def _run(name: str, data, cfg: dict | None = None, seed: int = 18):
    info, mod = get_method(name)
    state = mod.fit(data, {**info.defaults, **(cfg or {})}, seed)
    return state, mod.predict(state, data, data.split_index("test"))


def _brier(out, data) -> float:
    rows = data.split_index("test")
    return float(brier_loss(torch.tensor(out.agg_probs), torch.tensor(data.target[rows])).mean())


def _informed_mrr(out, data) -> float:
    order = np.argsort(-out.weights, axis=1, kind="stable")
    rank = np.argmax(order == data.meta["informed"][data.split_index("test")][:, None], axis=1) + 1
    return float((1.0 / rank).mean())


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
    _, un = _run("uniform", private)
    _, with_ctx = _run(f"{name}-ctx", private, FAST)
    _, no_ctx = _run(name, private, FAST)
    assert _informed_mrr(with_ctx, private) >= 0.9
    assert _brier(with_ctx, private) < _brier(un, private) - 0.02
    # the question text alone carries no hint of who holds the context
    assert _informed_mrr(no_ctx, private) < 0.75
    assert _brier(no_ctx, private) > _brier(un, private) - 0.02


def test_nirt_router_fits_and_weights_are_distributions(private):
    state, out = _run("nirt-router-ctx", private, {**FAST, "epochs": 2})
    assert out.weights.shape == (len(private.split_index("test")), 3)
    np.testing.assert_allclose(out.weights.sum(1), 1.0, atol=1e-5)
    assert np.isfinite(out.agg_probs).all() and state["epochs_run"] <= 2


@pytest.mark.parametrize("name", ["route-llm-ctx", "router-dc", "nirt-router"])
def test_same_seed_same_weights(private, name):
    cfg = {**FAST, "epochs": 2}
    _, a = _run(name, private, cfg, seed=18)
    _, b = _run(name, private, cfg, seed=18)
    _, c = _run(name, private, cfg, seed=19)
    np.testing.assert_array_equal(a.weights, b.weights)
    assert not np.array_equal(a.weights, c.weights)


def test_frozen_embeddings_are_encoded_once(private, monkeypatch, tmp_path):
    calls = []
    real = encoders._encode_uncached
    monkeypatch.setattr(
        encoders, "_encode_uncached", lambda t, s, b=64: calls.append(len(t)) or real(t, s, b)
    )
    encoders.clear_memory_cache()
    cfg = {**FAST, "epochs": 1, "embedding_cache": str(tmp_path)}
    for name in ("route-llm-ctx", "router-dc-ctx", "nirt-router-ctx"):
        for seed in (18, 19):
            _run(name, private, cfg, seed=seed)
    assert len(calls) == 1  # one text set, one encoder spec: encoded once for all methods and seeds
    assert len(list((tmp_path / "embeddings" / "hashing").glob("*.npy"))) == 1


def test_context_router_without_prompts_fails_clearly(private):
    import copy

    data = copy.copy(private)
    data.prompts = None
    with pytest.raises(ValueError, match="with_context routers need each agent's prompt"):
        _run("route-llm-ctx", data, FAST)
    with pytest.raises(ValueError, match="unknown config key 'top_k'"):
        _run("route-llm", private, {**FAST, "top_k": 2})


def test_finetune_mode_updates_a_tiny_bert(private, tmp_path):
    """Paper mode: gradients flow into the encoder (a tiny random BERT built from a config here)."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    AutoTokenizer.from_pretrained(encoders.minilm_dir()).save_pretrained(tmp_path)
    torch.manual_seed(0)
    BertModel(
        BertConfig(
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            max_position_embeddings=64,
        )
    ).save_pretrained(tmp_path)
    small = make_private_context_scenario(n=40, m=2, k=2, h=4, seed=1)
    cfg = {
        "encoder": str(tmp_path),
        "encoder_mode": "finetune",
        "pooling": "pooler",
        "max_len": 32,
        "epochs": 1,
        "batch_size": 16,
        "encoder_lr": 1e-2,
        "engine": "loop",
    }
    state, out = _run("route-llm-ctx", small, cfg)
    tuned = state["net"].encoder.model.state_dict()
    _, original = encoders.load_encoder(str(tmp_path), "right")
    diffs = [
        float((tuned[k] - v).abs().max()) for k, v in original.state_dict().items() if v.is_floating_point()
    ]
    assert max(diffs) > 0  # the encoder moved
    assert state["d_in"] == 2 * 16 and out.weights.shape == (len(small.split_index("test")), 2)
    np.testing.assert_allclose(out.weights.sum(1), 1.0, atol=1e-5)
