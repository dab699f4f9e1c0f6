"""WALLA and calibration put every parameter and tensor on env.device (issue 10 item 3).

Without a second device on the test machine, two checks make a method that ignores env.device fail:
    * the whole fit runs with torch's DEFAULT device set to "meta": a tensor created without the env's
      device lands on meta, and a recording TorchDispatchMode sees it (or the op mixing it fails);
    * every tensor any aten op reads or writes during fit / predict is recorded; all must be on env.device.
On a machine with CUDA the same test runs with env.device = "cuda" (parameters asserted there).
"""

from __future__ import annotations

import pytest
import torch
from synthetic import make_private_context_scenario
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from walla.manifests.validate import build
from walla.train.calibration import CalibrationConfig, fit_calibration
from walla.train.engine import TrainEnv, resolve_device
from walla.train.methods import walla


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


COMPUTE = ("bmm", "baddbmm", "_fused_adam", "sigmoid", "softplus", "matmul", "amax", "log_softmax")


def _devices() -> list[str]:
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", _devices())
def test_walla_and_calibration_stay_on_env_device(device):
    data = make_private_context_scenario(n=120, m=3, k=2, h=[8, 12, 8], seed=3)
    env = TrainEnv(device=device)
    raw = {"lr": 1e-3, "epochs": 1, "hidden": [8, 4], "projection_dim": 16, "calibrated": True}
    cfg = build(walla.Config, {**raw, "calibration": {"epochs": 1, "hidden": [4]}}, "test")
    rec = DeviceRecorder()
    torch.set_default_device("meta")
    try:
        with rec:
            (state,) = walla.fit(data, cfg, [18], env, [None])
            out = walla.predict(state, data, data.split_index("test"), env)
            cal = fit_calibration(data, build(CalibrationConfig, {"epochs": 1}, "test"), env)
    finally:
        torch.set_default_device(None)
    assert "meta" not in rec.devices, (
        f"ops on tensors created without env.device: {sorted(rec.devices['meta'])[:5]}"
    )
    want = torch.device(device).type
    # every matmul, optimizer step and mechanism formula ran on env.device (init is seeded on the host)
    compute = {op for ops in rec.devices.values() for op in ops if any(k in op for k in COMPUTE)}
    assert compute >= {"aten.baddbmm.default", "aten.bmm.default", "aten._fused_adam_.default"}
    stray = {d: ops & compute for d, ops in rec.devices.items() if d != want}
    assert not any(stray.values()), stray
    assert out.weights.shape == (len(data.split_index("test")), 3) and len(cal["params"]) == 6


def test_cuda_without_cuda_is_one_line():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError) as err:
        resolve_device("cuda")
    assert "\n" not in str(err.value) and "CUDA is not available" in str(err.value)
