"""mixed_adam.MasterAdam (bf16-mixed on the CPU: fp32 masters, bf16 gradients, one fused pass) equals the
autocast recipe it replaces (fp32 .grad, clip multiply, torch's fused Adam, bf16 cast); 32-true keeps
torch.optim.Adam(fused=True)."""

from __future__ import annotations

import pytest
import torch
from synthetic import make_private_context_scenario
from walla.manifests.validate import build
from walla.train import mixed_adam
from walla.train.engine import TrainEnv, seeded
from walla.train.heads import StackedHeads
from walla.train.methods import walla

needs_kernel = pytest.mark.skipif(
    bool(mixed_adam.unavailable("bf16-mixed", torch.device("cpu"))),
    reason=f"MasterAdam unavailable: {mixed_adam.unavailable('bf16-mixed', torch.device('cpu'))}",
)


def _heads() -> StackedHeads:
    with seeded(0):
        return StackedHeads([12, 9, 12], hidden=(8, 4), projection_dim=16)


@needs_kernel
def test_master_adam_step_equals_torch_fused_adam():
    heads, ref = _heads(), _heads()
    opt = mixed_adam.MasterAdam(heads, lr=1e-2)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2, fused=True)
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        coef = torch.rand(3, generator=gen) + 0.1
        heads.grad_coef = coef.clamp(max=1.0)
        for p, q in zip(heads.parameters(), ref.parameters(), strict=True):
            g16 = opt.low[p][1]
            g16.copy_(torch.randn(p.shape, generator=gen) * 1e-2)
            q.grad = g16.float() * heads.grad_coef.view(-1, *([1] * (p.dim() - 1)))
        opt.step()
        ref_opt.step()
    for p, q in zip(heads.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-7, rtol=1e-6)
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(opt.state[p][key], ref_opt.state[q][key], atol=1e-9, rtol=1e-6)
        assert torch.equal(opt.low[p][0], p.detach().bfloat16())  # the working copy is p cast to bf16


@needs_kernel
def test_working_copy_follows_torch_writes():
    """A change made through torch (load_rows) reaches the bf16 working copy the next forward reads."""
    heads, other = _heads(), StackedHeads([12, 9, 12], hidden=(8, 4), projection_dim=16)
    mixed_adam.MasterAdam(heads, lr=1e-2)
    heads.load_rows(slice(None), other.state_rows(slice(None)))
    x = torch.randn(3, 5, 12)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = heads(x, write_grads=True)
        want = other(x, write_grads=True)
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def _train(precision: str, enabled: bool, monkeypatch) -> walla.TrainedHeads:
    monkeypatch.setattr(mixed_adam, "ENABLED", enabled)
    data = make_private_context_scenario(n=300, m=3, k=2, h=[8, 12, 8], seed=3)
    raw = {"lr": 1e-3, "epochs": 2, "hidden": [8, 4], "projection_dim": 16, "clip": 0.05}
    cfg = walla.resolve(build(walla.Config, raw, "test"), data)
    return walla.train_heads(data, cfg, [18, 19], TrainEnv(precision=precision))


@needs_kernel
def test_bf16_training_equals_autocast_recipe(monkeypatch):
    """Six steps of two seeds x 3 agents with clipping active (clip 0.05): same parameters up to float32
    rounding (the kernel's arithmetic order differs from torch's vector code by at most an ulp or so)."""
    built = []

    class Spy(mixed_adam.MasterAdam):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(mixed_adam, "MasterAdam", Spy)
    new = _train("bf16-mixed", True, monkeypatch)
    assert built and built[0].heads.grad_coef is not None and bool((built[0].heads.grad_coef < 1).any())
    old = _train("bf16-mixed", False, monkeypatch)
    assert len(built) == 1  # switched off: the autocast recipe
    for a, b in zip(old.last + old.best, new.last + new.best, strict=True):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5)


def test_32_true_keeps_torch_fused_adam(monkeypatch):
    heads = _heads()
    opt = mixed_adam.stacked_adam(heads, 1e-3, "32-true", torch.device("cpu"))
    assert type(opt) is torch.optim.Adam and opt.defaults["fused"] and not heads.master
    on, off = _train("32-true", True, monkeypatch), _train("32-true", False, monkeypatch)
    for a, b in zip(on.last, off.last, strict=True):
        assert torch.equal(a, b)


def test_without_a_compiler_bf16_keeps_the_autocast_recipe(monkeypatch, tmp_path):
    monkeypatch.setenv("WALLA_CACHE", str(tmp_path))
    monkeypatch.setattr(mixed_adam.shutil, "which", lambda _name: None)
    mixed_adam._kernel.cache_clear()
    try:
        why = mixed_adam.unavailable("bf16-mixed", torch.device("cpu"))
        heads = _heads()
        opt = mixed_adam.stacked_adam(heads, 1e-3, "bf16-mixed", torch.device("cpu"))
    finally:
        mixed_adam._kernel.cache_clear()
    assert "no C compiler" in why
    assert type(opt) is torch.optim.Adam and not heads.master
