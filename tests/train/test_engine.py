"""train/engine.py: Fabric-driven fit_module, device/precision resolution, checkpoints."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from walla.train.engine import (
    TrainEnv,
    fit_module,
    load_checkpoint,
    resolve_device,
    resolve_precision,
    row_batches,
    save_checkpoint,
    seeded,
)

X = torch.randn(300, 6, generator=torch.Generator().manual_seed(0))
Y = (X[:, 0] > 0).long()


def _net() -> torch.nn.Module:
    with seeded(3):
        return torch.nn.Sequential(
            torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(16, 2)
        )


def _loss(net, rows):
    out = net(X[rows])
    return torch.nn.functional.cross_entropy(out, Y[rows]), {
        "acc": float((out.argmax(1) == Y[rows]).float().mean())
    }


def _val(net):
    return float(torch.nn.functional.cross_entropy(net(X[250:]), Y[250:]))


def _plain_loop(net, batches, epochs, lr, seed):
    """The same steps by hand: Adam, clip 1.0, dropout from a forked RNG seeded with `seed`."""
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    with seeded(seed):
        net.train()
        for _ in range(epochs):
            for rows in batches:
                opt.zero_grad()
                torch.nn.functional.cross_entropy(net(X[rows]), Y[rows]).backward()
                torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
                opt.step()
    return net


def test_fabric_fit_equals_plain_loop_and_restores_best():
    batches = row_batches(np.arange(250), 50, seed=1)
    log = []
    res = fit_module(_net(), _loss, batches, lr=5e-2, epochs=4, seed=5, log=log.append)
    ref = _plain_loop(_net(), batches, 4, 5e-2, 5)
    for p, q in zip(res.module.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q)
    assert len(log) == 20 and log[-1]["n_seen"] == 1000 and "acc" in log[0]

    res = fit_module(_net(), _loss, batches, val_fn=_val, lr=5e-2, epochs=4, patience=10, seed=5)
    assert res.best_val == pytest.approx(min(h["val"] for h in res.history))
    with torch.no_grad():
        assert _val(res.module.eval()) == pytest.approx(res.best_val, abs=1e-6)  # best checkpoint restored
    assert not res.module.training


def test_patience_and_online_stop():
    batches = row_batches(np.arange(250), 50, seed=1)
    res = fit_module(_net(), _loss, batches, val_fn=lambda net: 1.0, epochs=20, patience=2)
    assert res.stopped_early and res.epochs_run == 3 and res.best_epoch == 0
    res = fit_module(_net(), _loss, batches, on_step=lambda step, row: step >= 7, epochs=20)
    assert res.stopped_early and res.steps == 7


def test_skip_step_and_per_epoch_batches():
    net = _net()
    before = [p.detach().clone() for p in net.parameters()]
    seen = []
    res = fit_module(
        net,
        _loss,
        lambda epoch: seen.append(epoch) or row_batches(np.arange(100), 50, seed=epoch),
        epochs=2,
        skip_grad_norm_above=0.0,
    )
    assert seen == [0, 1] and res.steps == 4
    for p, q in zip(before, net.parameters(), strict=True):
        torch.testing.assert_close(p, q)  # every step skipped: nothing moved


def test_precision_64_and_bf16():
    batches = row_batches(np.arange(250), 50, seed=1)
    res = fit_module(_net(), _loss, batches, env=TrainEnv(precision="64-true"), lr=5e-2, epochs=1)
    assert all(p.dtype == torch.float64 for p in res.module.parameters())
    res = fit_module(_net(), _loss, batches, env=TrainEnv(precision="bf16-mixed"), lr=5e-2, epochs=1)
    assert all(p.dtype == torch.float32 for p in res.module.parameters())  # mixed: fp32 master weights


def test_resolve_device_and_precision():
    assert resolve_device("cpu") == "cpu" and resolve_device("auto") in ("cpu", "cuda", "mps")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available") as err:
            resolve_device("cuda")
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="device must be"):
        resolve_device("tpu")
    assert resolve_precision("32", "cpu") == "32-true" and resolve_precision("bf16", "cpu") == "bf16-mixed"
    assert resolve_precision("auto", "cpu") in ("32-true", "bf16-mixed")
    with pytest.raises(ValueError, match="precision must be"):
        resolve_precision("8", "cpu")


def test_checkpoint_roundtrip(tmp_path):
    state = {"params": [torch.arange(6.0).view(2, 3)], "rows": np.arange(4), "cfg": {"lr": 1e-3}}
    save_checkpoint(tmp_path / "ckpt" / "state.pt", state)
    back = load_checkpoint(tmp_path / "ckpt" / "state.pt")
    torch.testing.assert_close(back["params"][0], state["params"][0])
    assert back["cfg"] == {"lr": 1e-3} and back["rows"].tolist() == [0, 1, 2, 3]
    assert [p.name for p in (tmp_path / "ckpt").iterdir()] == ["state.pt"]  # no temporary left behind


def test_bad_arguments():
    with pytest.raises(ValueError, match="optimizer must be one of"):
        fit_module(_net(), _loss, [np.arange(5)], optimizer="lbfgs")
    with pytest.raises(FloatingPointError, match="non-finite training loss"):
        fit_module(_net(), lambda net, rows: torch.tensor(float("nan"), requires_grad=True), [np.arange(5)])
    assert [len(b) for b in row_batches(np.arange(7), 3, seed=None)] == [3, 3, 1]
