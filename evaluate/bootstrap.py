"""Paired bootstrap over test questions: how much a table's numbers move with the questions drawn.

The seed interval (aggregate.py) holds the test set fixed; on 140 questions an accuracy has about
±4 points of sampling error that it never shows. Here every row of a table is recomputed on the same
B resamples of its questions (drawn with replacement, same size), and on each resample the metric is
computed per seed and averaged over the seeds (the seed mean is what the table shows). The percentile
interval of those B values is the row's question interval; the percentile interval of the B paired
differences between two rows is the interval of their difference (pairing: both rows see the same
questions in every resample, so what the questions share cancels).

A resample is a column of counts [N, B]: how often each question is drawn. Per-question additive metrics
(ACC, MRR, K-Tau, DRegret, KLD, ...) are terms @ counts / N; AUC and ECE are recomputed per resample by
their vectorized `*_resampled` forms (metrics.py); a metric with neither falls back to computing it on
the resampled rows one resample at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from walla.evaluate.metrics import EvalArrays, MetricInfo

# 1000 resamples: the Monte-Carlo error of a 2.5% / 97.5% percentile endpoint is then about
# sqrt(0.025 * 0.975 / 1000) ≈ 0.5% in probability, small next to the interval it bounds (Efron &
# Tibshirani recommend >= 1000 for percentile intervals), and the whole report stays at seconds
# (cost is linear in B). Both constants are written under every table they affect.
N_RESAMPLES = 1000
RESAMPLE_SEED = 18  # numpy default_rng seed of the resample matrix (one matrix per question set)
LEVEL = 0.95  # two-sided percentile interval


@dataclass(frozen=True)
class Interval:
    """A percentile interval [lo, hi] of a metric (raw fractions; tables scale for display)."""

    lo: float
    hi: float

    def scaled(self, factor: float) -> Interval:
        return Interval(self.lo * factor, self.hi * factor)

    @property
    def excludes_zero(self) -> bool:
        """Strictly: a difference that is exactly 0 on every resample (a row vs itself) never counts."""
        return self.lo > 0 or self.hi < 0


def resample_indices(n: int, n_resamples: int = N_RESAMPLES, seed: int = RESAMPLE_SEED) -> np.ndarray:
    """[B, n] question indices drawn with replacement; the same (n, B, seed) always gives the same matrix."""
    if n == 0:
        return np.zeros((n_resamples, 0), dtype=np.int64)
    return np.random.default_rng(seed).integers(0, n, size=(n_resamples, n))


def counts_from_indices(indices: np.ndarray, n: int) -> np.ndarray:
    """[n, B] float counts: how often each of the n questions appears in each row of indices [B, n']."""
    b = len(indices)
    flat = (indices + n * np.arange(b)[:, None]).ravel()
    counts = np.bincount(flat, minlength=b * n).reshape(b, n)
    return np.ascontiguousarray(counts.T, dtype=np.float64)


def metric_resamples(info: MetricInfo, arrays: EvalArrays, counts: np.ndarray) -> np.ndarray:
    """The metric of one method/seed on every resample of counts [N, B] -> [B] (NaN where undefined)."""
    if info.terms is not None:
        with np.errstate(invalid="ignore", divide="ignore"):
            return info.terms(arrays) @ counts / counts.sum(0)
    if info.resampled is not None:
        return info.resampled(arrays, counts)
    questions = np.arange(counts.shape[0])
    return np.array([info.compute(arrays.subset(np.repeat(questions, c.astype(int)))) for c in counts.T])


def seed_mean(values: np.ndarray) -> np.ndarray:
    """[S, B] per-seed resample values -> [B] mean over the seeds finite on each resample (as the table's
    seed mean leaves out a seed whose metric is undefined); NaN where no seed is finite."""
    finite = np.isfinite(values)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(finite, values, 0.0).sum(0) / finite.sum(0)


def row_resamples(info: MetricInfo, per_seed: list[EvalArrays], counts: np.ndarray) -> np.ndarray:
    """A table row's resample values [B]: the metric per seed on each resample, averaged over seeds."""
    return seed_mean(np.stack([metric_resamples(info, a, counts) for a in per_seed]))


def percentile_interval(values: np.ndarray, level: float = LEVEL) -> Interval | None:
    """Percentile interval of resample values (numpy's linear interpolation); None unless every resample
    is defined (an interval over only the resamples where, say, an AUC exists would be biased)."""
    if len(values) == 0 or not np.isfinite(values).all():
        return None
    lo, hi = np.percentile(values, [50 * (1 - level), 50 * (1 + level)])
    return Interval(float(lo), float(hi))


def difference_interval(row: np.ndarray, reference: np.ndarray, level: float = LEVEL) -> Interval | None:
    """Percentile interval of the paired differences row - reference over the same resamples."""
    return percentile_interval(row - reference, level)
