"""Input checks of the mechanism formulas (train/mechanism.py): dtypes, shapes, simplex and range checks.

Every check raises ValueError naming the argument and the first offending value; the fast path folds all
value checks into one flag vector (one device sync when all is well).
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import torch

Tensor = torch.Tensor

SIMPLEX_ATOL = (
    1e-4  # tolerated |sum - 1| and negativity of probabilities (float32 softmax: ~1e-7; fp16: K ulp)
)


def as_float(x: object) -> Tensor:
    """Tensor view of an array-like; integer/bool input (e.g. a one-hot target) becomes float."""
    t = x if isinstance(x, Tensor) else torch.as_tensor(x)
    return t if t.is_floating_point() else t.to(torch.get_default_dtype())


def simplex_atol(k: int, *originals: Tensor) -> float:
    """SIMPLEX_ATOL, widened to the rounding of half-precision inputs (float16 sums are off by ~K ulp)."""
    eps = max((torch.finfo(t.dtype).eps for t in originals if t.is_floating_point()), default=0.0)
    return max(SIMPLEX_ATOL, k * eps)


def common_dtype(*tensors: Tensor) -> torch.dtype:
    """Promoted float dtype of the inputs; half precision is computed in float32 (scores need the bits)."""
    dtype = None
    for t in tensors:
        if t.is_floating_point():
            dtype = t.dtype if dtype is None else torch.promote_types(dtype, t.dtype)
    if dtype is None or dtype not in (torch.float32, torch.float64):
        return torch.float32
    return dtype


def _where(bad: Tensor) -> str:
    """First offending index of a bool tensor, as a readable tuple."""
    idx = tuple(int(i) for i in torch.nonzero(bad)[0])
    return str(idx[0] if len(idx) == 1 else idx) if idx else "()"


def check_values(
    simplex: Sequence[tuple[str, Tensor]] = (),
    nonneg: Sequence[tuple[str, Tensor]] = (),
    masks: Sequence[tuple[str, Tensor]] = (),
    atol: float = SIMPLEX_ATOL,
) -> None:
    """Raise ValueError naming the argument and offending value; one device sync when all is well.

    Fast path: a handful of reductions folded into one flag vector. NaN fails every comparison and
    +-inf breaks the row sums, so the sum check also catches non-finite probabilities.
    """
    flags = []
    for _, p in simplex:
        if p.numel():
            flags += [~((p.sum(-1) - 1).abs().amax() <= atol), p.amin() < -atol]
    for _, w in nonneg:
        if w.numel():
            flags += [~(w.amin() >= 0), w.amax() == float("inf")]
    for _, m in masks:
        if m.numel():
            flags.append(~m.any(-1).all())
    if not flags or not bool(torch.stack(flags).any()):
        return
    # slow path: find the first problem and describe it
    for name, p in simplex:
        bad = ~torch.isfinite(p)
        if bad.any():
            raise ValueError(f"{name}: non-finite value {p[bad][0].item()} at index {_where(bad)}")
        bad = p < -atol
        if bad.any():
            raise ValueError(f"{name}: negative probability {p[bad][0].item():.6g} at index {_where(bad)}")
        sums = p.sum(-1)
        bad = (sums - 1).abs() > atol
        if bad.any():
            raise ValueError(
                f"{name}: not a probability vector over the last axis at index {_where(bad)}: sums to "
                f"{sums[bad][0].item():.6g} (expected 1 within {atol:g})"
            )
    for name, w in nonneg:
        bad = ~torch.isfinite(w)
        if bad.any():
            raise ValueError(f"{name}: non-finite value {w[bad][0].item()} at index {_where(bad)}")
        bad = w < 0
        if bad.any():
            raise ValueError(f"{name}: must be >= 0, got {w[bad][0].item():.6g} at index {_where(bad)}")
    for name, m in masks:
        bad = ~m.any(-1)
        if bad.any():
            raise ValueError(f"{name}: no option enabled at index {_where(bad)} (need >= 1 True per row)")


def check_shapes(probs: Tensor, wagers: Tensor | None, target: Tensor | None, wname: str = "wagers") -> None:
    if probs.dim() < 2:
        raise ValueError(f"probs: expected shape [..., M, K], got {tuple(probs.shape)}")
    m, k = probs.shape[-2:]
    lead = [tuple(probs.shape[:-2])]
    if wagers is not None:
        if wagers.dim() < 1 or wagers.shape[-1] != m:
            raise ValueError(
                f"{wname}: expected shape [..., M={m}] to match probs, got {tuple(wagers.shape)}"
            )
        lead.append(tuple(wagers.shape[:-1]))
    if target is not None:
        if target.dim() < 1 or target.shape[-1] != k:
            raise ValueError(f"target: expected shape [..., K={k}] to match probs, got {tuple(target.shape)}")
        lead.append(tuple(target.shape[:-1]))
    try:
        torch.broadcast_shapes(*lead)
    except RuntimeError:
        names = ["probs[..., M, K]", f"{wname}[..., M]", "target[..., K]"]
        got = ", ".join(f"{n}: {s}" for n, s in zip(names, lead, strict=False))
        raise ValueError(f"batch dims do not broadcast ({got})") from None


def check_consts(**consts: float) -> None:
    for name, value in consts.items():
        if not (isinstance(value, numbers.Real) and value > 0 and value < float("inf")):
            raise ValueError(f"{name}: must be a positive finite number, got {value!r}")


def check_choice(name: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}: expected one of {list(allowed)}, got {value!r}")


def as_mask(option_mask: object, p: Tensor, *others: Tensor) -> Tensor | None:
    """Check an option mask [..., K] (bool) against probs [..., M, K] and the other batched args."""
    if option_mask is None:
        return None
    mask = option_mask if isinstance(option_mask, Tensor) else torch.as_tensor(option_mask)
    if mask.dtype != torch.bool:
        raise ValueError(f"option_mask: expected a bool tensor, got dtype {mask.dtype}")
    if mask.dim() < 1 or mask.shape[-1] != p.shape[-1]:
        raise ValueError(
            f"option_mask: expected shape [..., K={p.shape[-1]}] to match probs, got {tuple(mask.shape)}"
        )
    try:
        torch.broadcast_shapes(
            tuple(mask.shape[:-1]), tuple(p.shape[:-2]), *(tuple(t.shape[:-1]) for t in others)
        )
    except RuntimeError:
        raise ValueError(
            f"batch dims do not broadcast (probs {tuple(p.shape)}, option_mask {tuple(mask.shape)})"
        ) from None
    return mask.to(p.device)


def prepare(probs, wagers, target, validate: bool, option_mask=None, wname: str = "wagers"):
    p0, w0, q0 = as_float(probs), as_float(wagers), as_float(target)
    dtype = common_dtype(p0, w0, q0)
    p, w, q = p0.to(dtype), w0.to(dtype), q0.to(dtype)
    check_shapes(p, w, q, wname)
    mask = as_mask(option_mask, p, w, q)
    if validate:
        masks = [("option_mask", mask)] if mask is not None else []
        atol = simplex_atol(p.shape[-1], p0, q0)
        check_values(simplex=[("probs", p), ("target", q)], nonneg=[(wname, w)], masks=masks, atol=atol)
    return p, w, q, mask
