"""Every trained baseline trains and predicts on env.device (issue 10 item 3).

The engine is replaced by a stub that moves the module to env.device (as Fabric does), checks that
every float input of its forward lives there, and runs one training batch. With device "meta" a
tensor a method left on the CPU (hidden states, cached embeddings, probs/targets, dropout masks) fails
that check or the batch (device mismatch); a method that computed on the CPU yields a CPU loss. Predict is checked the same way: the weights it
pools must come from env.device.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
import torch
from method_runs import HASHING, config_of, tiny_encoder_dir
from synthetic import make_private_context_scenario
from walla.train.engine import TrainEnv
from walla.train.methods import embedding_cache, get_method, stacked_gen
from walla.train.methods import routing as routers

META = TrainEnv(device="meta")


class Reached(Exception):
    """The stub saw what it needed; stops the fit before it would read numbers back from "meta"."""


def _engine_stub(seen: list):
    def fit_module(module, loss_fn, train_batches, *, env, **kw):
        module = module.to(env.device)
        seen.append({p.device.type for p in module.parameters()})

        def inputs_on_device(_module, args):  # every float input (hidden states, embeddings, masks)
            flat = [a for x in args for a in (x if isinstance(x, list | tuple) else [x])]
            bad = {t.device.type for t in flat if isinstance(t, torch.Tensor) and t.is_floating_point()}
            assert bad <= {"meta"}, f"float inputs on {bad}"

        module.register_forward_pre_hook(inputs_on_device)
        batch = (train_batches(0) if callable(train_batches) else train_batches)[0]
        try:
            out = loss_fn(module, batch)
        except (NotImplementedError, RuntimeError) as e:
            # a value read back from a "meta" tensor (a logged metric, a transformers mask check): the
            # computation WAS on env.device; a device mismatch ("... not on the expected device") is not
            if "meta tensor" not in str(e):
                raise
            seen.append({"meta"})
            raise Reached from None
        loss = out if isinstance(out, torch.Tensor) else out[0]
        seen.append({loss.device.type})
        raise Reached

    return fit_module


@pytest.fixture(scope="module")
def data():
    return make_private_context_scenario(n=60, m=2, k=2, h=4, seed=3)


CASES = [
    ("stacked-gen", {"projection_dim": 8, "hidden": [4], "epochs": 1}, stacked_gen),
    ("route-llm-ctx", HASHING, routers),
    ("router-dc", HASHING, routers),
    ("nirt-router-ctx", HASHING, routers),
    ("route-llm", "bert", routers),
    ("router-dc-ctx", "deberta", routers),
    ("nirt-router", "bert", routers),
]


def _cfg(cfg, tmp_path):
    if isinstance(cfg, dict):
        return cfg
    pooling = "cls" if cfg == "deberta" else "pooler"
    return {"encoder": str(tiny_encoder_dir(tmp_path, cfg)), "pooling": pooling, "max_len": 16}


@pytest.mark.parametrize(("name", "cfg", "where"), CASES, ids=[f"{c[0]}-{c[1]}"[:40] for c in CASES])
def test_fit_runs_on_env_device(data, tmp_path, monkeypatch, name, cfg, where):
    seen: list = []
    monkeypatch.setattr(where, "fit_module", _engine_stub(seen))
    devices: list = []
    real = embedding_cache._encode_uncached
    monkeypatch.setattr(
        embedding_cache,
        "_encode_uncached",
        lambda t, s, d, b=64: devices.append(d) or real(t, s, "cpu", b),
    )
    monkeypatch.setattr(embedding_cache, "_MEMORY", OrderedDict())  # a fresh memory cache
    _, mod = get_method(name)
    with pytest.raises(Reached):
        mod.fit(data, config_of(name, _cfg(cfg, tmp_path)), [18], META, [None])
    assert seen == [{"meta"}, {"meta"}]  # parameters and the training loss live on env.device
    assert devices in ([], ["meta"])  # frozen embeddings were computed on env.device


@pytest.mark.filterwarnings("ignore:for .* copying from a non-meta parameter")  # loading into "meta"
@pytest.mark.parametrize("name", ["stacked-gen", "route-llm-ctx", "nirt-router"])
def test_predict_runs_on_env_device(data, monkeypatch, name):
    cfg = {"projection_dim": None, "hidden": [4], "epochs": 1} if name == "stacked-gen" else HASHING
    _, mod = get_method(name)
    state = mod.fit(data, config_of(name, cfg), [18], TrainEnv(), [None])[0]
    seen = []

    def pooled(data_, rows, weights, extras=None):
        seen.append(weights.device.type)
        raise Reached

    monkeypatch.setattr(stacked_gen if name == "stacked-gen" else routers, "pooled_output", pooled)
    with pytest.raises(Reached):
        mod.predict(state, data, np.arange(5), META)
    assert seen == ["meta"]
