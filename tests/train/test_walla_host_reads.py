"""A WALLA training step reads the device only through two queued device_memory.HostRead copies (issue 31).

On CUDA any other read (.item(), float(t), bool(t), a blocking .cpu()) waits for the device's queue to drain
and leaves the GPU idle while the host catches up; before issue 31 a step had two such waits (the stopping
summary, and per-head clipping's "does any head clip"). The CPU check: every scalar read of a tensor during
train_heads is of a HostRead's host copy, and each step waits on exactly two of them (the summary, the clip
flag). The `gpu` checks: the loop runs under torch.cuda.set_sync_debug_mode("error") (any implicit
synchronization raises), and a CUDA fit from the CPU's initial parameters (same masks, same order) ends at
the CPU's predictions up to float rounding.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from synthetic import make_private_context_scenario
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from walla.manifests.validate import build
from walla.train.engine import HostRead, SliceClip, TrainEnv, make_fabric, to_host
from walla.train.engine import _memory as device_memory
from walla.train.methods import walla
from walla.train.wagers import _training as wager_training
from walla.train.wagers import init_heads, train_heads

RAW = {"lr": 1e-2, "epochs": 2, "batch_size": 30, "hidden": [8, 4], "projection_dim": 16, "clip": 0.05}
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


class _Reads(TorchDispatchMode):
    """Scalar reads (.item(), float(t), bool(t)) of tensors that are neither a HostRead's host copy nor
    computed from such copies alone (the stopping bookkeeping's means). Every tensor marked host is kept
    alive, so no device tensor can reuse its memory and pass for it."""

    def __init__(self, host_storages: set[int]) -> None:
        super().__init__()
        self.host = host_storages
        self.kept: list[torch.Tensor] = []
        self.foreign: list[str] = []

    def _is_host(self, t: torch.Tensor) -> bool:
        return t.untyped_storage().data_ptr() in self.host

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        if func is torch.ops.aten._local_scalar_dense.default and not self._is_host(args[0]):
            self.foreign.append(f"{func} of {tuple(args[0].shape)} {args[0].dtype}")
        out = func(*args, **(kwargs or {}))
        if inputs and all(self._is_host(t) for t in inputs):
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self.host.add(t.untyped_storage().data_ptr())
                    self.kept.append(t)
        return out


def test_each_step_waits_on_two_host_reads_and_reads_nothing_else(monkeypatch):
    data = make_private_context_scenario(n=150, m=3, k=2, h=[8, 12, 8], seed=3)
    cfg = walla.resolve(build(walla.Config, {**RAW, "diagnostics": True}, "test"), data)
    storages: set[int] = set()
    waits: list[str] = []
    alive: list[HostRead] = []

    class Counted(HostRead):
        def __init__(self, tensors):
            super().__init__(tensors)
            storages.add(self.flat.untyped_storage().data_ptr())
            alive.append(self)  # its memory is never reused by a device tensor during the test
            self.keys = ",".join(tensors)

        def result(self):
            waits.append(self.keys)
            return super().result()

    monkeypatch.setattr(wager_training, "HostRead", Counted)
    logs = [[], []]
    reads = _Reads(storages)
    with reads:
        th = train_heads(data, cfg, [18, 19], TrainEnv(), [logs[0].append, logs[1].append])
    assert reads.foreign == [], reads.foreign[:5]
    assert th.steps == 2 * -(-len(data.split_index("train")) // cfg.batch_size) and len(logs[0]) == th.steps
    assert waits == ["mse,metric,wager,adv,payout", "clips"] * th.steps


def test_the_loop_does_not_read_back_through_to_host(monkeypatch):
    """to_host waits at once; the loop must queue its copies (HostRead) and wait later."""
    data = make_private_context_scenario(n=80, m=3, k=2, h=8, seed=1)
    cfg = walla.resolve(build(walla.Config, RAW, "test"), data)
    monkeypatch.setattr(
        device_memory, "to_host", lambda *a: pytest.fail("device_memory.to_host called in the loop")
    )
    th = train_heads(data, cfg, [18], TrainEnv(), [None])
    assert th.steps > 0


@pytest.mark.parametrize("device", DEVICES)
def test_host_read_equals_to_host(device):
    parts = {
        "mse": torch.tensor([[1.5, 2.25], [3.0, -4.0]], dtype=torch.float64, device=device),
        "metric": torch.tensor(0.1, dtype=torch.float32, device=device),
        "flag": torch.tensor(True, device=device),
        "none": torch.zeros(0, device=device),
    }
    read = HostRead(parts)
    back, again = read.result(), to_host(parts)
    assert list(back) == list(parts) and {t.device.type for t in back.values()} == {"cpu"}
    assert all(torch.equal(back[k], again[k]) for k in parts) and bool(back["flag"]) is True
    assert back["mse"].shape == (2, 2) and float(back["metric"]) == float(torch.tensor(0.1))
    assert read.result()["mse"].tolist() == [[1.5, 2.25], [3.0, -4.0]]  # waits once, reads again
    assert HostRead({}).result() == {}


@pytest.mark.parametrize("max_norm", [None, 1e-3, 1e6])
def test_slice_clip_in_two_halves_equals_clipping_at_once(max_norm):
    gen = torch.Generator().manual_seed(5)
    a = [torch.nn.Parameter(torch.zeros(3, 4, 2)), torch.nn.Parameter(torch.zeros(3, 2))]
    for p in a:
        p.grad = torch.randn(p.shape, generator=gen)
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    for p, q in zip(a, b, strict=True):
        q.grad = p.grad.clone()
    ref = _clip_each_slice_alone(a, max_norm)
    clip = SliceClip(make_fabric(TrainEnv()), torch.optim.SGD(b, lr=0.1), max_norm)
    clip.apply_(bool(clip.clips))
    torch.testing.assert_close(clip.norms, ref, rtol=1e-6, atol=0)
    assert bool(clip.clips) is (max_norm == 1e-3)
    for p, q in zip(a, b, strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-6, atol=0)
        if max_norm != 1e-3:
            assert torch.equal(q.grad, p.grad)  # nothing clips: the gradients are not touched


def _clip_each_slice_alone(params, max_norm) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_ on slice s of every parameter alone, in place; pre-clip norms [1, S]."""
    norms = []
    for s in range(params[0].shape[0]):
        alone = [torch.nn.Parameter(p.detach()[s].clone()) for p in params]
        for q, p in zip(alone, params, strict=True):
            q.grad = p.grad[s].clone()
        norms.append(torch.nn.utils.clip_grad_norm_(alone, math.inf if max_norm is None else max_norm))
        for q, p in zip(alone, params, strict=True):
            p.grad[s] = q.grad
    return torch.stack(norms)[None].float()


@pytest.mark.gpu
def test_cuda_steps_never_synchronize_implicitly(monkeypatch):
    """From the first forward pass to the end of the loop no op may synchronize (HostRead's event waits are
    explicit and allowed): torch raises on the first implicit one."""
    data = make_private_context_scenario(n=150, m=3, k=2, h=[8, 12, 8], seed=3)
    cfg = walla.resolve(build(walla.Config, {**RAW, "diagnostics": True}, "test"), data)
    forward = wager_training._WagerTraining.forward

    def strict(self, *args, **kwargs):
        torch.cuda.set_sync_debug_mode("error")
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(wager_training._WagerTraining, "forward", strict)
    try:
        th = train_heads(data, cfg, [18, 19], TrainEnv(device="cuda"), [[].append, [].append])
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert th.steps > 0 and th.best[0].device.type == "cuda"


def _fit_from_cpu_init(data, device: str):
    """WALLA I from the CPU's init of seed 18 (passed as `initial`), no early stop: predictions of all rows."""
    cfg = walla.resolve(build(walla.Config, {**RAW, "lr": 1e-3, "stop_metric": "none"}, "test"), data)
    dims = [int(h.shape[1]) for h in data.hidden]
    init = [p.detach().clone() for p in init_heads([18], dims, cfg, 1, "cpu").parameters()]
    env = TrainEnv(device=device)
    (state,) = walla.fit(data, cfg, [18], env, [None], initial=[[t.to(device) for t in init]])
    return walla.predict(state, data, np.arange(len(data.split)), env)


def test_a_fit_from_its_own_init_passed_as_initial_is_the_default_fit():
    """The premise of the CUDA comparison below: on the CPU, `initial` = the seed's own init changes nothing."""
    data = make_private_context_scenario(n=200, m=3, k=2, h=[8, 12, 8], seed=4)
    cfg = walla.resolve(build(walla.Config, {**RAW, "lr": 1e-3, "stop_metric": "none"}, "test"), data)
    (state,) = walla.fit(data, cfg, [18], TrainEnv(), [None])
    default = walla.predict(state, data, np.arange(len(data.split)), TrainEnv())
    given = _fit_from_cpu_init(data, "cpu")
    assert np.array_equal(given.weights, default.weights) and np.array_equal(
        given.agg_probs, default.agg_probs
    )


@pytest.mark.gpu
def test_a_cuda_fit_from_the_cpus_init_ends_at_the_cpus_predictions():
    """Same initial parameters (the CPU's init, passed as `initial`), the same host-drawn dropout masks and
    order: the CUDA trajectory is the CPU's up to GEMM rounding (TF32 off: torch's float32 default), which
    Adam may amplify a little. On the CPU this fit moves the weights by up to 7e-3 from an untrained fit's,
    and another seed's (other init, masks, order) differ by up to 0.076: 1e-3 tells them apart."""
    data = make_private_context_scenario(n=200, m=3, k=2, h=[8, 12, 8], seed=4)
    cpu, cuda = _fit_from_cpu_init(data, "cpu"), _fit_from_cpu_init(data, "cuda")
    np.testing.assert_allclose(cuda.weights, cpu.weights, atol=1e-3)
    np.testing.assert_allclose(cuda.agg_probs, cpu.agg_probs, atol=1e-3)
