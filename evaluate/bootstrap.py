"""Paired bootstrap over test questions: how much a table's numbers move with the questions drawn.

The seed interval (aggregate.py) holds the test set fixed; on 140 questions an accuracy has about
±4 points of sampling error that it never shows. Here every row of a table is recomputed on the same
B resamples of its questions (drawn with replacement, same size), and on each resample the metric is
computed per seed and averaged over the seeds (the seed mean is what the table shows). The percentile
interval of those B values is the row's question interval; the percentile interval of the B paired
differences between two rows is the interval of their difference (pairing: both rows see the same
questions in every resample, so what the questions share cancels).

A calibration error (ECE) is not a mean and sits at a boundary (0 for a calibrated predictor); its
interval is `calibration_interval`: the resamples moved to centre on the (debiased) estimate, and 0 as
the lower end whenever the estimate is within what a perfectly calibrated predictor with the same
confidences shows 95% of the time. The marks (significance.py) compare many rows at once: `max_t_critical`
is the family-wise critical value of a max-statistic bootstrap over those rows' paired differences.

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
DRAW_SEED = 19  # numpy default_rng seed of the calibrated label draws (calibration_interval)
LEVEL = 0.95  # two-sided percentile interval; also the family-wise level of the marks


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


def calibrated_uniforms(n: int, n_draws: int = N_RESAMPLES, seed: int = DRAW_SEED) -> np.ndarray:
    """[n, B] uniforms of the calibrated label draws: question i is right in draw b when
    uniforms[i, b] < its confidence. Every row and seed of a table uses the same matrix, so seeds that
    predict alike draw alike (a question's truth is shared)."""
    return np.random.default_rng(seed).random((n, n_draws))


def row_draws(info: MetricInfo, per_seed: list[EvalArrays], uniforms: np.ndarray) -> np.ndarray | None:
    """A row's calibration error on the calibrated label draws, averaged over seeds -> [B]; None for a
    metric without `calibrated_draws`."""
    if info.calibrated_draws is None:
        return None
    return seed_mean(np.stack([info.calibrated_draws(a, uniforms) for a in per_seed]))


def calibration_interval(
    values: np.ndarray, estimate: float, draws: np.ndarray | None, level: float = LEVEL
) -> Interval | None:
    """Question interval of a calibration error (>= 0) that covers it in simulation (tests/evaluate/
    test_eval_simulation.py), where the plain percentile interval did not.

    * bias-corrected percentile: the percentile interval of the resamples moved by (estimate - their
      mean), so an estimator whose resamples run high (any |.| of noisy bin gaps) is not left below
      its own interval;
    * the lower end is 0 when the estimate is at most the `level` quantile of `draws` (the same error
      of a perfectly calibrated predictor with the same confidences: consistency resampling, Broecker &
      Smith 2007): "indistinguishable from calibrated" then reads [0, hi];
    * should the resamples be so skewed that their mean leaves their own 95% range, the interval is
      widened to hold the estimate rather than drawn beside it.
    """
    interval = percentile_interval(values, level)
    if interval is None or not np.isfinite(estimate):
        return None
    shift = estimate - float(values.mean())
    lo, hi = max(0.0, interval.lo + shift), max(0.0, interval.hi + shift)
    if draws is not None and estimate <= float(np.quantile(draws, level)):
        lo = 0.0
    return Interval(min(lo, estimate), max(hi, estimate))


def max_t_critical(observed: np.ndarray, differences: np.ndarray, level: float = LEVEL) -> float:
    """Family-wise critical value of the max-statistic bootstrap over H paired differences.

    observed [H] (the table's differences), differences [H, B] (their resamples), every row of which
    varies. The `level` quantile c of max_h |D*_hb - d_h| / se_h over the resamples (se_h: the sd of
    row h) makes d_h +- c se_h simultaneous intervals: all H cover their true difference at once in
    about `level` of question sets (Westfall & Young 1993; Romano & Wolf 2005, single step), so marking
    the rows whose interval excludes 0 makes any false mark in the family a <= 1 - level event.
    """
    se = differences.std(axis=1, ddof=1)  # [H]
    t = np.abs(differences - observed[:, None]) / se[:, None]  # [H, B]
    return float(np.quantile(t.max(axis=0), level))
