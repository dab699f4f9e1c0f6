"""The paper's routers fine-tune their encoder: tiny random BERT / DeBERTa-v2 built offline in the test."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from method_runs import config_of, run_seeds, tiny_encoder_dir
from synthetic import make_private_context_scenario
from walla.train.methods import encoders, get_method
from walla.train.methods import routing as routers


@pytest.fixture(scope="module")
def small():
    return make_private_context_scenario(n=40, m=2, k=2, h=4, seed=1)


@pytest.mark.parametrize(
    ("name", "kind", "pooling"),
    [("route-llm-ctx", "bert", "pooler"), ("nirt-router", "bert", "pooler"), ("router-dc", "deberta", "cls")],
)
def test_finetuning_moves_the_encoder_with_the_configured_lr_groups(
    small, tmp_path, monkeypatch, name, kind, pooling
):
    path = str(tiny_encoder_dir(tmp_path, kind))
    cfg = {"encoder": path, "pooling": pooling, "max_len": 32, "epochs": 1, "batch_size": 16, "lr": 1e-2}
    cfg["encoder_lr_mult"] = 0.5
    seen = []
    real = routers.fit_module

    def spy(module, *args, **kw):
        seen.append([(g["lr"], sum(p.numel() for p in g["params"])) for g in kw["param_groups"]])
        return real(module, *args, **kw)

    monkeypatch.setattr(routers, "fit_module", spy)
    states, outs = run_seeds(name, small, cfg, (18,))
    (head_lr, _), (enc_lr, enc_n) = seen[0]
    assert head_lr == 1e-2 and enc_lr == 0.5e-2  # encoder group at lr * encoder_lr_mult
    _, original = encoders.load_encoder(path, config_of(name, cfg).truncation_side)
    assert enc_n == sum(p.numel() for p in original.parameters())
    tuned = {k.removeprefix("encoder.model."): v for k, v in states[0]["params"].items() if ".model." in k}
    diffs = [
        float((tuned[k] - v).abs().max()) for k, v in original.state_dict().items() if v.is_floating_point()
    ]
    assert max(diffs) > 0  # gradients reached the encoder
    width = 16 * (2 if name.endswith("-ctx") else 1)
    assert states[0]["d_in"] == width and outs[0].weights.shape == (len(small.split_index("test")), 2)
    np.testing.assert_allclose(outs[0].weights.sum(1), 1.0, atol=1e-5)
    # predict from the saved state alone (a fresh encoder, loaded with the tuned weights) agrees
    again = get_method(name)[1].predict(
        torch.load(_save(states[0], tmp_path), weights_only=False), small, small.split_index("test"), _env()
    )
    np.testing.assert_allclose(again.weights, outs[0].weights, rtol=1e-5, atol=1e-6)


def test_truncation_side_reaches_the_tokenizer(tmp_path):
    path = str(tiny_encoder_dir(tmp_path, "bert"))
    spec = routers.encoder_spec(config_of("nirt-router", {"encoder": path, "max_len": 8}))
    enc = encoders.TextEncoder(spec, ["a b c d e f g h i j k l"])
    tokenizer = enc.tokenizer
    assert tokenizer.truncation_side == "left" and len(enc.ids[0]) == 8
    assert tokenizer.convert_ids_to_tokens(enc.ids[0].tolist())[-2] == "l"  # the end survives


def _save(state, tmp_path):
    torch.save(state, tmp_path / "state.pt")
    return tmp_path / "state.pt"


def _env():
    from walla.train.engine import TrainEnv

    return TrainEnv()
