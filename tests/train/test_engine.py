"""train/engine/_fabric.py, engine/clipping.py and engine/loop.py: device/precision resolution, the optimizer factory, the one
clipping function, checkpoints, and the Fabric-driven fit_module."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from references import clip_slices_
from walla.train.engine import (
    TrainEnv,
    clip_grad_norms_,
    fit_module,
    load_checkpoint,
    make_fabric,
    make_optimizer,
    resolve_device,
    resolve_precision,
    row_batches,
    save_checkpoint,
    seeded,
    to_device,
    to_host,
)

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
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
    res = fit_module(_net(), _loss, batches, on_step=lambda step, row, norms: step >= 7, epochs=20)
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
    # the very bytes a single-device Fabric's save writes (it buffers them in memory first); it reads them
    make_fabric(TrainEnv()).save(tmp_path / "fabric.pt", state)
    assert (tmp_path / "fabric.pt").read_bytes() == (tmp_path / "ckpt" / "state.pt").read_bytes()
    fab = load_checkpoint(tmp_path / "fabric.pt")
    assert fab["cfg"] == back["cfg"] and fab["rows"].tolist() == back["rows"].tolist()


@pytest.mark.gpu
def test_checkpoint_of_a_device_state_reads_back_on_the_host(tmp_path):
    """States of a CUDA fit live on the device until saved; the file holds host tensors (any machine reads
    it, market/head.py with a bare torch.load)."""
    state = {"params": [torch.arange(6.0, device="cuda")], "stats": (torch.ones(2, device="cuda"), None)}
    save_checkpoint(tmp_path / "state.pt", state)
    back = torch.load(tmp_path / "state.pt", weights_only=False)
    assert back["params"][0].device.type == "cpu" and back["params"][0].tolist() == [0, 1, 2, 3, 4, 5]
    assert back["stats"][0].device.type == "cpu" and back["stats"][1] is None
    assert state["params"][0].device.type == "cuda"  # the caller's state is left as it was


@pytest.mark.parametrize("device", DEVICES)
def test_to_device_and_to_host_keep_every_value(device):
    orders = np.arange(20).reshape(2, 10)[:, 3:7]  # a strided slice, as a step's batch indices [S, b]
    idx = to_device(orders, device)
    assert idx.device.type == device and idx.dtype == torch.int64 and idx.cpu().tolist() == orders.tolist()
    keep = to_device(np.array([[True, False, True]]), device)
    assert keep.dtype == torch.bool and keep.cpu().tolist() == [[True, False, True]]
    tenth = torch.tensor(0.1, dtype=torch.float32)
    parts = {
        "mse": torch.tensor([[1.5, 2.25], [3.0, -4.0]], dtype=torch.float64, device=device),
        "metric": tenth.to(device),
        "none": torch.zeros(0, device=device),
    }
    back = to_host(parts)  # one transfer for all of them
    assert list(back) == ["mse", "metric", "none"] and {t.device.type for t in back.values()} == {"cpu"}
    assert back["mse"].tolist() == [[1.5, 2.25], [3.0, -4.0]] and back["none"].shape == (0,)
    assert back["metric"].shape == () and float(back["metric"]) == float(tenth)  # float32 -> float64 exact
    assert to_host({}) == {}


def test_to_device_reads_arrays_on_the_host_whatever_the_default_device():
    torch.set_default_device("meta")  # torch.as_tensor would follow it; a batch's indices must not
    try:
        assert to_device(np.arange(3), "cpu").tolist() == [0, 1, 2]
    finally:
        torch.set_default_device(None)


def test_bad_arguments():
    with pytest.raises(ValueError, match="optimizer must be one of"):
        fit_module(_net(), _loss, [np.arange(5)], optimizer="lbfgs")
    with pytest.raises(FloatingPointError, match="non-finite training loss"):
        fit_module(_net(), lambda net, rows: torch.tensor(float("nan"), requires_grad=True), [np.arange(5)])
    assert [len(b) for b in row_batches(np.arange(7), 3, seed=None)] == [3, 3, 1]


def test_make_optimizer_is_torchs_own_fused_where_the_device_has_it():
    net = _net()
    opt = make_optimizer(net.parameters(), "adamw", lr=1e-3, weight_decay=0.1)
    assert type(opt) is torch.optim.AdamW and opt.defaults["fused"] is True
    assert opt.defaults["weight_decay"] == 0.1
    other = make_optimizer(net.parameters(), "adam", lr=1e-3, device="mps")  # no fused kernel assumed
    assert type(other) is torch.optim.Adam and other.defaults["fused"] is None
    groups = [{"params": [net[0].weight], "lr": 1e-2}, {"params": [net[0].bias]}]
    opt = make_optimizer(groups, "sgd", lr=1e-3)
    assert type(opt) is torch.optim.SGD and [g["lr"] for g in opt.param_groups] == [1e-2, 1e-3]
    with pytest.raises(ValueError, match="lr must be a positive finite number"):
        make_optimizer(net.parameters(), "adam", lr=0.0)


def _with_grads(*shapes) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(7)
    params = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)
    return params


def test_clip_scopes_group_and_all_equal_clip_grad_norm():
    a, b = _with_grads((4, 3), (5,)), _with_grads((4, 3), (5,))
    ref_a, ref_b = [[q.grad.clone() for q in ps] for ps in (a, b)]
    norms = clip_grad_norms_([a[:1], a[1:]], 1.0)  # "group": each group alone
    expect = [float(torch.linalg.vector_norm(g)) for g in ref_a]
    assert norms.tolist() == pytest.approx(expect, rel=1e-6)
    for p, g, n in zip(a, ref_a, expect, strict=True):
        torch.testing.assert_close(p.grad, g * min(1.0, 1.0 / (n + 1e-6)))
    joint = clip_grad_norms_([b], 1.0)  # "all": one group holding everything
    total = math.sqrt(sum(float(g.norm()) ** 2 for g in ref_b))
    assert joint.tolist() == pytest.approx([total], rel=1e-6)
    for p, g in zip(b, ref_b, strict=True):
        torch.testing.assert_close(p.grad, g / (total + 1e-6))


def test_clip_per_slice_and_measuring_only():
    params = _with_grads((3, 4, 2), (3, 2))
    grads = [p.grad.clone() for p in params]
    alone = [math.sqrt(sum(float(g[s].norm()) ** 2 for g in grads)) for s in range(3)]
    limit = sorted(alone)[1]
    norms = clip_slices_(params, None)  # measure only
    assert norms.shape == (1, 3) and norms[0].tolist() == pytest.approx(alone, rel=1e-6)
    assert all(torch.equal(p.grad, g) for p, g in zip(params, grads, strict=True))
    clip_slices_(params, limit)
    for s, n in enumerate(alone):
        for p, g in zip(params, grads, strict=True):
            torch.testing.assert_close(p.grad[s], g[s] * min(1.0, limit / (n + 1e-6)))


class _TwoSlices(torch.nn.Module):
    """Two independent 'seeds' in one stacked parameter; loss = |w|^2 / 2, so the gradient is w."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.tensor([[3.0, 4.0], [0.3, 0.4]]))

    def forward(self) -> torch.Tensor:
        return (self.weight**2).sum() / 2


def test_fit_module_clips_per_slice_and_reports_the_norms():
    seen = []

    def on_step(step, row, norms) -> bool:
        seen.append((row["grad_norm"], norms.clone()))
        return False

    res = fit_module(
        _TwoSlices(),
        lambda module, rows: module(),
        [np.arange(1)],
        optimizer="sgd",
        lr=1.0,
        clip=1.0,
        clip_scope="slice",
        on_step=on_step,
    )
    ((grad_norm, norms),) = seen
    assert norms.tolist() == [pytest.approx([5.0, 0.5])] and grad_norm == pytest.approx(5.0)
    # slice 0 clipped to norm 1 (its step is w / 5), slice 1 below the limit (its step is w): SGD, lr 1
    expect = torch.tensor([[3.0 - 0.6, 4.0 - 0.8], [0.0, 0.0]])
    torch.testing.assert_close(res.module.weight.detach(), expect, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="clip scope must be one of"):
        fit_module(_net(), _loss, [np.arange(5)], clip_scope="layer")
