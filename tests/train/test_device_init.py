"""Parameters are initialised where they train (engine.init_generator / linear_init_, issue 22).

On the CPU the in-place draws are bit for bit what `with seeded(seed): nn.Linear(...)` drew before (so CPU
results never changed); on CUDA they come from a device generator: no host draw, no host RNG touched, and
each seed's init independent of the other seeds of its module. The properties are asserted on every device
the machine has (the CUDA cases are `gpu`-marked: skipped, with the reason, without a GPU).
"""

from __future__ import annotations

import pytest
import torch
from references import load_seed
from torch import nn
from walla.manifests.validate import build
from walla.train.calibration import CalibrationConfig, TempHeads
from walla.train.engine import init_generator, linear_init_, seeded
from walla.train.methods import stacked_gen, walla
from walla.train.wagers import StackedHeads, WagerHead, init_heads

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
CFG = build(walla.Config, {"hidden": [8, 4], "projection_dim": 16}, "test")


def _legacy_heads(seeds, in_dims, cfg, n_kinds) -> StackedHeads:
    """The init before issue 22: a WagerHead per head under seeded(seed), copied into the stacked module."""
    m = len(in_dims)
    heads = StackedHeads(
        in_dims * (n_kinds * len(seeds)), cfg.hidden, cfg.dropout, cfg.projection_dim, init=False
    )
    for s, seed in enumerate(seeds):
        with seeded(seed):
            for k in range(n_kinds):
                for i, d in enumerate(in_dims):
                    heads.load_head(
                        (s * n_kinds + k) * m + i, WagerHead(d, cfg.hidden, cfg.dropout, cfg.projection_dim)
                    )
    return heads


def _equal(a, b) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a, b, strict=True))


def test_linear_init_on_the_cpu_is_nn_linear_under_seeded():
    w, b = torch.zeros(12, 5), torch.zeros(5)  # stored transposed: [in, out]
    linear_init_(w, b, init_generator(7, "cpu"))
    with seeded(7):
        ref = nn.Linear(12, 5)
    assert torch.equal(w, ref.weight.T) and torch.equal(b, ref.bias)
    assert 0.2 < float(w.abs().max()) <= 1 / 12**0.5  # U(-1/sqrt(in), 1/sqrt(in))


@pytest.mark.parametrize("n_kinds", [1, 3])
def test_walla_heads_on_the_cpu_equal_the_seeded_host_init(n_kinds):
    dims = [6, 10, 8]  # heterogeneous: padded rows
    new, old = init_heads([18, 21], dims, CFG, n_kinds, "cpu"), _legacy_heads([18, 21], dims, CFG, n_kinds)
    assert _equal(new.parameters(), old.parameters())


def test_stacked_gen_and_calibration_on_the_cpu_equal_the_seeded_host_init():
    c = build(stacked_gen.Config, {"projection_dim": 8, "hidden": [8, 4]}, "test")
    sizes = [6, 10, 8]
    net = stacked_gen.init_net(sizes, [18, 19], c, "cpu")
    ref = stacked_gen.SeedStackedGen(sizes, 2, c)
    for s, seed in enumerate([18, 19]):
        with seeded(seed):
            load_seed(ref, s, stacked_gen.StackedNet(sizes, c))
    assert _equal(net.parameters(), ref.parameters())

    cal = build(CalibrationConfig, {"hidden": [6, 3]}, "test")
    heads = TempHeads([6, 10], cal.hidden, cal.t0, cal.t_min, cal.t_max, cal.seed, "cpu")
    for g, (head, d) in enumerate(zip(heads.heads, [6, 10], strict=True)):
        with seeded(cal.seed + g):
            layers = [nn.Linear(d, 6), nn.Linear(6, 3)]
        assert torch.equal(head.weights[0][:d], layers[0].weight.T) and not head.weights[0][d:].any()
        assert torch.equal(head.weights[1], layers[1].weight.T) and torch.equal(
            head.biases[1], layers[1].bias
        )
        assert not head.weights[2].any()  # last layer zero: T starts at t0


@pytest.mark.parametrize("device", DEVICES)
def test_init_on_the_device_is_seeded_per_seed_and_leaves_the_host_rng_alone(device):
    dims = [6, 10, 8]
    host_rng = torch.get_rng_state()
    both = init_heads([18, 19], dims, CFG, 1, device)
    assert torch.equal(torch.get_rng_state(), host_rng)  # no draw from torch's global CPU generator
    assert {p.device.type for p in both.parameters()} == {device}
    alone = init_heads([19], dims, CFG, 1, device)
    diag = init_heads([19], dims, CFG, 3, device)
    for p, q, r in zip(both.parameters(), alone.parameters(), diag.parameters(), strict=True):
        assert torch.equal(p[3:], q)  # seed 19's init does not depend on seed 18 sharing the module
        assert torch.equal(q, r[:3])  # nor on the diagnostic heads drawn after its wager heads
    first = both.weights[
        0
    ].detach()  # [G, Hmax, P]: head g's real rows carry U(+-1/sqrt(H_g)), padding rows 0
    for g, d in enumerate(dims * 2):
        assert 0.5 / d**0.5 < float(first[g, :d].abs().max()) <= 1 / d**0.5
        assert not first[g, d:].any()
    assert torch.equal(init_heads([19], dims, CFG, 1, device).weights[1], alone.weights[1])  # reproducible


@pytest.mark.gpu
def test_cuda_init_draws_on_the_device_generator():
    """Same seed, other generator: CUDA's Philox stream, not the CPU's (why the run key records the device)."""
    cpu = init_heads([18], [16], CFG, 1, "cpu").weights[0].detach()
    cuda = init_heads([18], [16], CFG, 1, "cuda").weights[0].detach()
    assert cuda.device.type == "cuda" and not torch.equal(cuda.cpu(), cpu)
