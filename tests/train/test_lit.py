"""train/lit.py: the one Lightning wrapper and its plain-loop twin run the same steps."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from walla.train.lit import fit_module, row_batches, seeded

X = torch.randn(300, 6, generator=torch.Generator().manual_seed(0))
Y = (X[:, 0] > 0).long()


def _net() -> torch.nn.Module:
    with seeded(3):
        return torch.nn.Sequential(
            torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(16, 2)
        )


def _loss(net, rows):
    return torch.nn.functional.cross_entropy(net(X[rows]), Y[rows]), {
        "acc": float((net(X[rows]).argmax(1) == Y[rows]).float().mean())
    }


def _val(net):
    return float(torch.nn.functional.cross_entropy(net(X[250:]), Y[250:]))


def test_engines_identical_and_best_state_restored(tmp_path):
    batches = row_batches(np.arange(250), 50, seed=1)
    results, logs = {}, {}
    for engine in ("loop", "lightning"):
        logs[engine] = []
        results[engine] = fit_module(
            _net(),
            _loss,
            batches,
            val_fn=_val,
            lr=5e-2,
            epochs=4,
            patience=10,
            seed=5,
            log=logs[engine].append,
            engine=engine,
            log_dir=tmp_path / engine,
        )
    a, b = results["loop"], results["lightning"]
    for p, q in zip(a.module.parameters(), b.module.parameters(), strict=True):
        torch.testing.assert_close(p, q)
    assert logs["loop"] == logs["lightning"] and len(logs["loop"]) == 20
    assert logs["loop"][-1]["n_seen"] == 1000 and "acc" in logs["loop"][0]
    assert a.best_val == pytest.approx(min(h["val"] for h in a.history))
    with torch.no_grad():
        assert _val(a.module.eval()) == pytest.approx(a.best_val, abs=1e-6)  # best state restored, eval mode
    assert (tmp_path / "lightning" / "metrics.csv").exists()  # CSV logger by default


def test_patience_and_online_stop():
    batches = row_batches(np.arange(250), 50, seed=1)
    res = fit_module(_net(), _loss, batches, val_fn=lambda net: 1.0, epochs=20, patience=2, engine="loop")
    assert res.stopped_early and res.epochs_run == 3 and res.best_epoch == 0
    res = fit_module(
        _net(), _loss, batches, on_step=lambda step, row: step >= 7, epochs=20, engine="lightning"
    )
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
        engine="lightning",
    )
    assert seen == [0, 1] and res.steps == 4
    for p, q in zip(before, net.parameters(), strict=True):
        torch.testing.assert_close(p, q)  # every step skipped: nothing moved


def test_bad_arguments():
    with pytest.raises(ValueError, match="engine must be one of"):
        fit_module(_net(), _loss, [np.arange(5)], engine="jax")
    with pytest.raises(ValueError, match="optimizer must be one of"):
        fit_module(_net(), _loss, [np.arange(5)], optimizer="lbfgs")
    with pytest.raises(FloatingPointError, match="non-finite training loss"):
        fit_module(_net(), lambda net, rows: torch.tensor(float("nan"), requires_grad=True), [np.arange(5)])
    assert [len(b) for b in row_batches(np.arange(7), 3, seed=None)] == [3, 3, 1]
