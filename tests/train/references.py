"""Reference implementations the training tests compare production code against (not used by production).

clip_slices_(params, 1.0)          # per-slice clipping at once, through SliceClip on a plain SGD
load_seed(net, 0, ref)             # SeedStackedGen slice s := a reference StackedNet's parameters
deficit_bound_w(wagers, c2, c3)    # the deficit proposition's wager-dependent bound
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from walla.train.engine import SliceClip, TrainEnv, make_fabric
from walla.train.mechanism_checks import as_float, check_consts, check_values


def clip_slices_(params: Sequence[torch.nn.Parameter], max_norm: float | None) -> torch.Tensor:
    """Clip each slice along axis 0 of `params`' gradients alone, the way training does (clipping.SliceClip,
    both halves at once); returns the pre-clip norms [1, S]."""
    clip = SliceClip(make_fabric(TrainEnv()), torch.optim.SGD(params, lr=0.1), max_norm)
    clip.apply_(bool(clip.clips))
    return clip.norms


@torch.no_grad()
def load_seed(net, s: int, ref) -> None:
    """Slice s of a stacked_gen.SeedStackedGen := a reference stacked_gen.StackedNet's parameters."""
    pairs = [(net.mlp_w, net.mlp_b, ref.mlp)]
    if net.proj_w is not None:
        pairs.append((net.proj_w, net.proj_b, ref.proj))
    for ws, bs, layers in pairs:
        for w, b, lin in zip(ws, bs, layers, strict=True):
            w[s] = lin.weight.T
            b[s] = lin.bias


def deficit_bound_w(wagers: torch.Tensor, c2: float = 0.5, c3: float = 0.5) -> torch.Tensor:
    """First, wager-dependent inequality of the paper's deficit proposition: ``wagers[..., M]`` -> ``[...]``.

    sum_i pi_i <= ((s_max - s_min) / W - c3) sum_i w_i^2, with the Brier score s_max - s_min = 2 c2 and
    W = sum_i w_i; 0 when W = 0 (then every payout is 0).
    """
    w = as_float(wagers)
    check_consts(c2=c2, c3=c3)
    check_values(nonneg=[("wagers", w)])
    total = w.sum(-1)  # [...]
    sq = (w * w).sum(-1)  # [...]
    safe = torch.where(total > 0, total, torch.ones_like(total))
    return torch.where(total > 0, (2.0 * c2 / safe - c3) * sq, torch.zeros_like(total))
