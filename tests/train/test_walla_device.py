"""WALLA, calibration, StackedGen and the routers put every parameter and tensor on env.device (issues 10, 22).

Without a second device on the test machine, two checks make a method that ignores env.device fail:
    * the whole fit runs with torch's DEFAULT device set to "meta": a tensor created without the env's
      device lands on meta, and a recording TorchDispatchMode sees it (or the op mixing it fails);
    * every tensor any aten op reads or writes during fit / predict is recorded; every compute op (matmuls,
      optimizer steps, the mechanism's and calibration's formulas) must have run on env.device.
The "cuda" cases are `gpu`-marked: collected everywhere, skipped with the reason where CUDA is absent.
"""

from __future__ import annotations

import pytest
import torch
from method_runs import HASHING, config_of
from synthetic import make_private_context_scenario
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from walla.manifests.validate import build
from walla.train.calibration import CalibrationConfig, fit_calibration
from walla.train.engine import TrainEnv, resolve_device
from walla.train.methods import get_method, walla


class DeviceRecorder(TorchDispatchMode):
    """Records the device of every tensor argument and result of every aten op."""

    def __init__(self) -> None:
        super().__init__()
        self.devices: dict[str, set[str]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten((args, kwargs, out))[0]:
            if isinstance(t, torch.Tensor) and t.dim() > 0:  # 0-dim: Python scalars wrapped by torch
                self.devices.setdefault(t.device.type, set()).add(str(func))
        return out


COMPUTE = (
    "bmm",
    "baddbmm",
    "addmm",
    "_fused_adam",
    "sigmoid",
    "softplus",
    "matmul",
    "amax",
    "log_softmax",
    "_softmax",
    "uniform_",
)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _recorded(run) -> tuple[dict[str, set[str]], object]:
    """Run `run()` with torch's default device "meta" under a DeviceRecorder: (devices -> ops, its result)."""
    rec = DeviceRecorder()
    torch.set_default_device("meta")
    try:
        with rec:
            out = run()
    finally:
        torch.set_default_device(None)
    assert "meta" not in rec.devices, (
        f"ops on tensors created without env.device: {sorted(rec.devices['meta'])[:5]}"
    )
    return rec.devices, out


def _stray(devices: dict[str, set[str]], device: str) -> tuple[set[str], dict[str, set[str]]]:
    """(every compute op seen, the compute ops that ran somewhere other than `device`)."""
    compute = {op for ops in devices.values() for op in ops if any(k in op for k in COMPUTE)}
    stray = {d: ops & compute for d, ops in devices.items() if d != torch.device(device).type}
    return compute, {d: ops for d, ops in stray.items() if ops}


@pytest.mark.parametrize("device", DEVICES)
def test_walla_and_calibration_stay_on_env_device(device):
    data = make_private_context_scenario(n=120, m=3, k=2, h=[8, 12, 8], seed=3)
    env = TrainEnv(device=device)
    raw = {"lr": 1e-3, "epochs": 1, "hidden": [8, 4], "projection_dim": 16, "calibrated": True}
    cfg = build(walla.Config, {**raw, "calibration": {"epochs": 1, "hidden": [4]}}, "test")

    def run():
        (state,) = walla.fit(data, cfg, [18], env, [None])
        out = walla.predict(state, data, data.split_index("test"), env)
        return out, fit_calibration(data, build(CalibrationConfig, {"epochs": 1}, "test"), env)

    devices, (out, cal) = _recorded(run)
    # every init draw, matmul, optimizer step, mechanism and calibration formula ran on env.device
    compute, stray = _stray(devices, device)
    assert compute >= {"aten.baddbmm.default", "aten.bmm.default", "aten._fused_adam_.default"}
    assert compute >= {"aten.uniform_.default", "aten._log_softmax.default"}  # init; apply_calibration
    assert not stray, stray
    assert out.weights.shape == (len(data.split_index("test")), 3) and len(cal["params"]) == 6


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("name", "cfg"),
    [
        ("stacked-gen", {"projection_dim": 8, "hidden": [8, 4], "epochs": 2, "lr": 1e-3}),
        ("route-llm-ctx", {**HASHING, "epochs": 2}),
        ("nirt-router", {**HASHING, "epochs": 2}),
    ],
)
def test_baselines_stay_on_env_device(device, name, cfg):
    """StackedGen and the routers (frozen embeddings): init, training, validation and the pooled output."""
    data = make_private_context_scenario(n=120, m=3, k=2, h=[8, 12, 8], seed=3)
    env = TrainEnv(device=device)
    _, mod = get_method(name)

    def run():
        (state,) = mod.fit(data, config_of(name, cfg), [18], env, [None])
        return mod.predict(state, data, data.split_index("test"), env)

    devices, out = _recorded(run)
    compute, stray = _stray(devices, device)
    assert {"aten._softmax.default", "aten.uniform_.default"} <= compute  # weights; the heads' init
    assert compute & {"aten._fused_adam_.default", "aten._fused_adamw_.default"}  # the optimizer step
    assert not stray, stray
    assert out.weights.shape == (len(data.split_index("test")), 3)


def test_cuda_without_cuda_is_one_line():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError) as err:
        resolve_device("cuda")
    assert "\n" not in str(err.value) and "CUDA is not available" in str(err.value)
