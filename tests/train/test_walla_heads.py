"""StackedHeads' write_grads path (gradients written in place into persistent .grad) equals autograd's."""

from __future__ import annotations

import torch
from walla.train.engine import seeded
from walla.train.heads import StackedHeads


def _heads() -> StackedHeads:
    with seeded(0):
        return StackedHeads([12, 9, 12], hidden=(8, 4), projection_dim=16)


def _grads(heads: StackedHeads, x, masks, write: bool, autocast: bool = False) -> list[torch.Tensor]:
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        r = heads(x, masks, write_grads=write)
    (r.float() ** 2).sum().backward()
    return [p.grad.clone() for p in heads.parameters()]


def test_write_grads_equals_autograd_and_overwrites():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, 5, 12, generator=gen)
    x[1, :, 9:] = 0  # zero padding of the 9-wide head
    masks = [(torch.rand(3, 5, w, generator=gen) > 0.1).float() for w in (8, 4)]
    ref = _grads(_heads(), x, masks, write=False)
    heads = _heads()
    first = _grads(heads, x, masks, write=True)
    again = _grads(heads, x, masks, write=True)  # a second backward overwrites, never accumulates
    for a, b, c in zip(ref, first, again, strict=True):
        torch.testing.assert_close(b, a, atol=0, rtol=0)
        torch.testing.assert_close(c, a, atol=0, rtol=0)
    bf16 = _grads(_heads(), x, masks, write=True, autocast=True)
    auto = _grads(_heads(), x, masks, write=False, autocast=True)
    for a, b, c in zip(ref, bf16, auto, strict=True):
        assert b.dtype == torch.float32
        torch.testing.assert_close(b, c, atol=2e-2, rtol=2e-2)  # same bf16 GEMMs as autocast's
        torch.testing.assert_close(b, a, atol=5e-2, rtol=5e-2)
