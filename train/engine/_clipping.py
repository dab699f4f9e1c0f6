"""Gradient-norm clipping: one definition, torch.nn.utils.clip_grad_norm_'s, in three scopes.

    norms = clip_gradients(fabric, opt, max_norm=1.0, scope="slice")   # pre-clip norms [n_groups, S]
    opt.step()

The coefficient is clip_grad_norm_'s (coef = max_norm / (norm + 1e-6), capped at 1), applied in one of
three scopes: each optimizer param group alone, every parameter jointly, or each SLICE along axis 0 alone.
The last is for modules that batch independent models (agents, seeds) into stacked parameters [S, ...]:
slice s is clipped exactly as its model would be alone, so with an elementwise optimizer (Adam) each
model's update is the one it would get alone. Every gradient-trained loop (engine/loop.py, wagers/training.py,
calibration/temperature.py) clips here, after undoing a 16-mixed loss scale (Lightning's precision plugin).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

CLIP_SCOPES = ("group", "all", "slice")
CLIP_EPS = 1e-6  # clip_grad_norm_'s: coef = max_norm / (norm + CLIP_EPS)


@torch.no_grad()
def _clip_group_(params: Sequence[torch.Tensor], max_norm: float) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_ over the parameters that have a gradient: the pre-clip norm []."""
    with_grad = [p for p in params if p.grad is not None]
    if not with_grad:
        return torch.zeros((), device=params[0].device)
    return nn.utils.clip_grad_norm_(with_grad, max_norm).float()


@torch.no_grad()
def slice_clip_coefs(params: Sequence[torch.Tensor], max_norm: float) -> tuple[torch.Tensor, torch.Tensor]:
    """clip_grad_norm_'s pre-clip norm and coefficient of each slice along axis 0 alone: ([S], [S]).

    As clip_grad_norm_: norm = the norm of the per-tensor norms, coef = max_norm / (norm + CLIP_EPS)
    capped at 1. Computed on the parameters' device; nothing is read back.
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        norm = torch.zeros(params[0].shape[0], device=params[0].device)
        return norm, torch.ones_like(norm)
    per_tensor = torch.stack([torch.linalg.vector_norm(g.flatten(1), dim=1) for g in grads])  # [T, S]
    norm = torch.linalg.vector_norm(per_tensor, dim=0)  # [S]
    return norm, (max_norm / (norm + CLIP_EPS)).clamp(max=1.0)  # [S], [S]


@torch.no_grad()
def scale_slices_(params: Sequence[torch.Tensor], coef: torch.Tensor) -> None:
    """Multiply slice s of every gradient by coef[s], in place."""
    for g in (p.grad for p in params if p.grad is not None):
        g.mul_(coef.view(-1, *([1] * (g.dim() - 1))))


def clip_grad_norms_(groups: Sequence[Sequence[torch.Tensor]], max_norm: float | None) -> torch.Tensor:
    """Clip each group of parameters' gradients in place, as clip_grad_norm_ on that group alone.

    `max_norm=None` only measures. Parameters without a gradient are left out (a group with none has
    norm 0); empty groups are skipped. Returns the pre-clip norms [n_groups], float32 on the parameters'
    device. Per-slice clipping is SliceClip.
    """
    limit = max_norm if max_norm is not None else math.inf
    return torch.stack([_clip_group_(params, limit) for params in groups if len(params)])


def clip_gradients(fabric, optimizer, max_norm: float | None, scope: str = "group") -> torch.Tensor:
    """Undo a 16-mixed loss scale, then clip the optimizer's parameters in `scope` (module docstring).

    scope "group": each param group alone -> norms [n_groups]; "all": every parameter jointly -> [1];
    "slice": each slice along axis 0 of each group alone -> [n_groups, S]. `optimizer` may be the
    Fabric-wrapped one.
    """
    if scope not in CLIP_SCOPES:
        raise ValueError(f"clip scope must be one of {CLIP_SCOPES}, got {scope!r}")
    if scope == "slice":
        clip = SliceClip(fabric, optimizer, max_norm)
        clip.apply_(bool(clip.clips))
        return clip.norms
    raw = getattr(optimizer, "optimizer", optimizer)
    fabric.strategy.precision.unscale_gradients(raw)
    groups = [g["params"] for g in raw.param_groups]
    if scope == "all":
        groups = [[p for g in groups for p in g]]
    return clip_grad_norms_(groups, max_norm)


class SliceClip:
    """Per-slice clipping (scope "slice") in two halves, so the host need not wait for the device in between.

        clip = SliceClip(fabric, opt, max_norm)   # unscale; each slice's norm and coefficient, on the device
        flag = HostRead({"clips": clip.clips})    # read with whatever else the step reads back
        clip.apply_(bool(flag.result()["clips"]))  # scale the gradients only when some slice clips
        opt.step()

    Each slice of each group gets clip_grad_norm_'s coefficient for that slice alone; a slice whose
    coefficient is 1 is left as it is (x * 1.0 == x), so scaling every group when any slice clips changes
    no other bit.
    """

    def __init__(self, fabric, optimizer, max_norm: float | None) -> None:
        raw = getattr(optimizer, "optimizer", optimizer)
        fabric.strategy.precision.unscale_gradients(raw)
        limit = max_norm if max_norm is not None else math.inf
        self.groups = [g["params"] for g in raw.param_groups if len(g["params"])]
        pairs = [slice_clip_coefs(params, limit) for params in self.groups]
        self.norms = torch.stack([norm for norm, _ in pairs]).float()  # [n_groups, S] pre-clip norms
        self.coefs = [coef for _, coef in pairs]
        self.clips = torch.stack([(coef < 1.0).any() for coef in self.coefs]).any()  # [] bool, on the device

    def apply_(self, clips: bool) -> None:
        """Scale each slice's gradients by its coefficient when `clips` (the host's read of `self.clips`)."""
        if clips:
            for params, coef in zip(self.groups, self.coefs, strict=True):
                scale_slices_(params, coef)
