"""Deterministic train/val/test assignment (SPEC §3.1), applied by every dataset loader.

Modes (a dataset manifest's `split_protocol.mode`):
- `uniform`: permute all rows with `np.random.RandomState(seed)`, cut train | val | test.
- `balanced_binary`: class pools (label 0 = YES / '1' vs the rest), each shuffled with the same
  RandomState(seed) stream and truncated to the minority size; per-class 8:1:1. The surplus of the
  majority class is DROPPED from the table (the reference discards it too) and logged.
- `none`: every row is "test" (out-of-distribution evaluation sets such as ARC-Challenge).
- `given`: the rows carry their own split (generic JSON lines with a `split` field).

Counts use largest remainders: floor(ratio * n) each, the leftover rows go to the splits with
the largest fractional parts (ties: train before val before test).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
from walla.store.schema import SPLITS

log = logging.getLogger(__name__)

MODES = ("uniform", "balanced_binary", "none", "given")


@dataclass(frozen=True)
class SplitProtocol:
    mode: str = "uniform"
    ratios: tuple[float, ...] = (0.8, 0.1, 0.1)  # train, val, test
    seed: int = 42  # SPEC §3.1: 42 for MMLU/MedMCQA/PubMedQA, 18 for BayesX

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"split_protocol.mode must be one of {MODES}, got {self.mode!r}")
        if len(self.ratios) != 3 or any(r < 0 for r in self.ratios) or abs(sum(self.ratios) - 1) > 1e-9:
            raise ValueError(
                f"split_protocol.ratios must be 3 non-negative numbers summing to 1, got {self.ratios}"
            )

    @classmethod
    def from_dict(cls, d: dict | None) -> SplitProtocol:
        """Build from a manifest dict ({mode, ratios, seed}); None = the uniform 8:1:1 default."""
        if d is None:
            return cls()
        if isinstance(d, SplitProtocol):
            return d
        unknown = set(d) - {"mode", "ratios", "seed"}
        if unknown:
            raise ValueError(
                f"split_protocol has unknown keys {sorted(unknown)}; expected mode, ratios, seed"
            )
        return cls(
            mode=str(d.get("mode", "uniform")),
            ratios=tuple(float(r) for r in d.get("ratios", (0.8, 0.1, 0.1))),
            seed=int(d.get("seed", 42)),
        )


@dataclass
class SplitResult:
    split: list[str | None]  # per input row; None = dropped by balancing
    dropped: int = 0
    counts: dict[str, int] = field(default_factory=dict)


def split_counts(n: int, ratios: tuple[float, ...]) -> list[int]:
    """Largest-remainder split sizes: floor(r*n) each, leftovers to the largest fractional parts."""
    exact = [r * n for r in ratios]
    counts = [int(np.floor(e)) for e in exact]
    left = n - sum(counts)
    order = sorted(range(len(ratios)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[:left]:
        counts[i] += 1
    return counts


def _cut(indices: np.ndarray, ratios: tuple[float, ...], out: list[str | None]) -> None:
    n_train, n_val, _ = split_counts(len(indices), ratios)
    for pos, idx in enumerate(indices):
        out[int(idx)] = "train" if pos < n_train else ("val" if pos < n_train + n_val else "test")


def assign_splits(
    labels: list[int], protocol: SplitProtocol, given: list[str | None] | None = None
) -> SplitResult:
    """Split assignment for rows with these labels (0-based option indices).

    Args:
        labels: per-row correct option index (balanced_binary pools label 0 vs the rest).
        protocol: mode, ratios, seed.
        given: per-row split from the source (mode "given" only).
    Returns:
        SplitResult with one split name per row (None for rows dropped by balancing).
    Raises:
        ValueError: mode "given" without a split on every row, or an unknown split name.
    """
    n = len(labels)
    out: list[str | None] = [None] * n
    if protocol.mode == "none":
        out = ["test"] * n
    elif protocol.mode == "given":
        if given is None or any(s is None for s in given):
            raise ValueError("split_protocol mode 'given' needs a 'split' field on every row")
        bad = [s for s in given if s not in SPLITS]
        if bad:
            raise ValueError(f"unknown split {bad[0]!r}; expected one of {SPLITS}")
        out = list(given)
    elif protocol.mode == "uniform":
        perm = np.random.RandomState(protocol.seed).permutation(n)
        _cut(perm, protocol.ratios, out)
    else:  # balanced_binary
        lab = np.asarray(labels)
        rng = np.random.RandomState(protocol.seed)
        pos = rng.permutation(np.flatnonzero(lab == 0))
        neg = rng.permutation(np.flatnonzero(lab != 0))
        m = min(len(pos), len(neg))
        _cut(pos[:m], protocol.ratios, out)
        _cut(neg[:m], protocol.ratios, out)
    dropped = sum(s is None for s in out)
    if dropped:
        log.info(
            "balanced_binary split: dropped %d majority-class rows (kept %d per class)",
            dropped,
            (n - dropped) // 2,
        )
    counts = {s: sum(x == s for x in out) for s in SPLITS}
    return SplitResult(split=out, dropped=dropped, counts=counts)
