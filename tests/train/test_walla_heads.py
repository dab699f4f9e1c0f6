"""StackedHeads: each head's gradient (autograd's own backward) and per-slice clipping are those of the
same WagerHead trained alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from references import clip_slices_
from walla.train.engine import seeded
from walla.train.wagers import StackedHeads, stack_hidden

DIMS = [12, 9, 12]


def _heads() -> StackedHeads:
    with seeded(0):
        return StackedHeads(DIMS, hidden=(8, 4), projection_dim=16)


def _batch() -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, 5, 12, generator=gen)
    x[1, :, 9:] = 0  # zero padding of the 9-wide head
    masks = [(torch.rand(3, 5, w, generator=gen) > 0.1).float() for w in (8, 4)]
    goal = torch.rand(3, 5, generator=gen)
    return x, masks, goal


def _loss(r: torch.Tensor, goal: torch.Tensor) -> torch.Tensor:
    """Sum over heads of each head's own mean squared error: head g's gradient is its own loss's."""
    return ((torch.sigmoid(r.float() / 2) - goal) ** 2).mean(-1).sum()


def _alone_grads(heads: StackedHeads, g: int, x, masks, goal) -> list[torch.Tensor]:
    """Gradients of head g as a plain WagerHead on its own rows, in StackedHeads' layout."""
    head = heads.head(g)
    r = head(x[g, :, : DIMS[g]], [mk[g] for mk in masks])
    _loss(r[None], goal[g : g + 1]).backward()
    weights = [layer.weight.grad.T for layer in head.layers]  # [d_in, d_out] each
    return weights + [layer.bias.grad for layer in head.layers]


def test_each_heads_gradient_is_its_own():
    heads = _heads()
    x, masks, goal = _batch()
    _loss(heads(x, masks), goal).backward()
    for g in range(3):
        alone = _alone_grads(heads, g, x, masks, goal)
        for p, a in zip(heads.parameters(), alone, strict=True):
            torch.testing.assert_close(p.grad[g, : a.shape[0]], a, atol=1e-7, rtol=1e-6)
    pad = heads.weights[0].grad[1, 9:]
    assert torch.equal(pad, torch.zeros_like(pad))  # padded input rows get no gradient


def test_per_slice_clipping_equals_clip_grad_norm_alone():
    heads = _heads()
    x, masks, goal = _batch()
    _loss(heads(x, masks), goal).backward()
    raw = [[p.grad[g].clone() for p in heads.parameters()] for g in range(3)]
    alone = [torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(t) for t in r])) for r in raw]
    max_norm = float(sorted(alone)[1])  # the middle head sits at the limit, one is above, one below
    norms = clip_slices_(list(heads.parameters()), max_norm)  # [1, G]
    torch.testing.assert_close(norms[0], torch.stack(alone), atol=1e-7, rtol=1e-6)
    for g in range(3):
        params = [torch.nn.Parameter(torch.zeros_like(t)) for t in raw[g]]
        for p, t in zip(params, raw[g], strict=True):
            p.grad = t.clone()
        torch.nn.utils.clip_grad_norm_(params, max_norm)
        for p, q in zip(heads.parameters(), params, strict=True):
            torch.testing.assert_close(p.grad[g], q.grad, atol=1e-8, rtol=1e-6)
    biggest = int(torch.stack(alone).argmax())
    clipped = torch.linalg.vector_norm(torch.stack([p.grad[biggest].norm() for p in heads.parameters()]))
    norm = float(alone[biggest])
    assert norm > max_norm and float(clipped) == pytest.approx(max_norm * norm / (norm + 1e-6), rel=1e-6)


def test_bf16_autocast_gradients_follow_float32():
    x, masks, goal = _batch()
    ref = _heads()
    _loss(ref(x, masks), goal).backward()
    heads = _heads()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        r = heads(x, masks)
    assert r.dtype == torch.bfloat16
    _loss(r, goal).backward()
    for p, q in zip(heads.parameters(), ref.parameters(), strict=True):
        assert p.grad.dtype == torch.float32  # float32 parameters keep float32 gradients
        torch.testing.assert_close(p.grad, q.grad, atol=5e-2, rtol=5e-2)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("dtypes", [("float16", "float16"), ("float16", "float32", "float64")])
def test_stack_hidden_gathers_the_same_values_on_the_device_as_on_the_host(device, dtypes):
    """The CUDA path (each agent's array crossed whole, rows picked by index_select) forced on the CPU too."""
    gen = np.random.default_rng(3)
    hidden = [gen.normal(size=(9, 4 + i)).astype(d) for i, d in enumerate(dtypes)]  # heterogeneous H_i
    rows = np.array([7, 0, 3, 3, 8])
    host = stack_hidden(hidden, rows)
    moved = stack_hidden(hidden, rows, device, on_device=True)
    assert host.device.type == "cpu" and moved.device.type == device
    assert host.dtype == moved.dtype == (torch.float16 if len(set(dtypes)) == 1 else torch.float32)
    assert host.shape == (len(dtypes), 5, 3 + len(dtypes)) and torch.equal(moved.cpu(), host)
    assert host[1, :, :5].tolist() == torch.from_numpy(hidden[1][rows].astype(host.numpy().dtype)).tolist()
    assert (host[0, :, 4:] == 0).all()  # padding beyond agent 0's H
    assert stack_hidden(hidden, rows[:0], device, on_device=True).shape == (len(dtypes), 0, 3 + len(dtypes))
