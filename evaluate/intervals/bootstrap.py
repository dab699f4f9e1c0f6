"""Paired bootstrap over test questions: how much a table's numbers move with the questions drawn.

The seed interval (aggregate.py) holds the test set fixed; on 140 questions an accuracy has about
±4 points of sampling error that it never shows. Here every row of a table is recomputed on the same
B resamples of its questions (drawn with replacement, same size), and on each resample the metric is
computed per seed and averaged over the seeds (the seed mean is what the table shows). The percentile
interval of those B values is the row's question interval; the percentile interval of the B paired
differences between two rows is the interval of their difference (pairing: both rows see the same
questions in every resample, so what the questions share cancels).

A calibration error (ECE) is not a mean and sits at a boundary (0 for a calibrated predictor), and its
debiased estimator still reads high on few questions; its interval is `calibration_interval`: from the
estimate less what a perfectly calibrated predictor with the same confidences reads in 97.5% of label
draws (0 when the estimate is within that) to the resamples' 99th percentile centred on the estimate. The
marks (significance.py) compare many rows at once: `simultaneous_bounds` gives the family-wise intervals
of a max-statistic bootstrap over those rows' paired differences (`max_t_critical`, `null_se`).

A resample is a column of counts [N, B]: how often each question is drawn. Per-question additive metrics
(ACC, MRR, K-Tau, DRegret, KLD, ...) are terms @ counts / N; AUC and ECE are recomputed per resample by
their vectorized `*_resampled` forms (metrics.py); a metric with neither falls back to computing it on
the resampled rows one resample at a time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats
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


def percentile_bounds(values: np.ndarray, level: float = LEVEL) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bounds of resample values [..., B] (numpy's linear interpolation) -> (lo, hi) [...]."""
    lo, hi = np.percentile(values, [50 * (1 - level), 50 * (1 + level)], axis=-1)
    return lo, hi


def percentile_interval(values: np.ndarray, level: float = LEVEL) -> Interval | None:
    """Percentile interval of resample values (numpy's linear interpolation); None unless every resample
    is defined (an interval over only the resamples where, say, an AUC exists would be biased)."""
    if len(values) == 0 or not np.isfinite(values).all():
        return None
    lo, hi = percentile_bounds(values, level)
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


UPPER_TAIL = 0.01  # the calibration interval's upper end: the resamples' 99th percentile (see below)


def calibration_bounds(
    values: np.ndarray, estimate: np.ndarray, draws: np.ndarray | None, level: float = LEVEL
) -> tuple[np.ndarray, np.ndarray]:
    """`calibration_interval` on a batch: values [..., B], estimate [...], draws [..., B] or None ->
    (lo, hi) [...] (the simulations of benchmarks/marks_coverage.py call this, the tables through
    `calibration_interval`)."""
    estimate = np.asarray(estimate, dtype=np.float64)
    shift = estimate - values.mean(axis=-1)
    if draws is None:  # no null to read the estimator's error on: the centred percentile interval
        lo = np.maximum(percentile_bounds(values, level)[0] + shift, 0.0)
    else:
        lo = np.maximum(estimate - monte_carlo_quantile(draws, (1 + level) / 2), 0.0)
    hi = np.percentile(values, 100 * (1 - UPPER_TAIL), axis=-1) + shift
    return np.minimum(lo, estimate), np.maximum(hi, estimate)


def calibration_interval(
    values: np.ndarray, estimate: float, draws: np.ndarray | None, level: float = LEVEL
) -> Interval | None:
    """Question interval of a calibration error (>= 0) that covers the population value in simulation
    (benchmarks/marks_coverage.py: 2 and 4 options, 140 and 1000 questions, ECE 0, 0.05 and 0.10), where
    the plain percentile interval did not and the estimate-centred one fell to 0.87.

    * lower end: the estimate minus the (1 + level) / 2 quantile of `draws`, the same estimator on label
      draws of a perfectly calibrated predictor with the same confidences (consistency resampling,
      Broecker & Smith 2007), so its bias at ECE 0 is subtracted with its noise; the estimator's upward
      error is largest at ECE 0, so this is a conservative lower bound; 0 when the estimate is within
      that null's spread ("indistinguishable from calibrated" reads [0, hi]);
    * upper end: the resamples' 99th percentile moved to centre on the estimate (a 1% tail instead of
      2.5%: the one-step debiasing over-corrects by up to about a quarter of its standard error at
      moderate gaps, and the upper end has to allow for an estimate that reads low);
    * the interval always holds the estimate. Without `draws`, the lower end is the centred 2.5th
      percentile.
    """
    if len(values) == 0 or not np.isfinite(values).all() or not np.isfinite(estimate):
        return None
    lo, hi = calibration_bounds(values, estimate, draws, level)
    return Interval(float(lo), float(hi))


def monte_carlo_quantile(values: np.ndarray, level: float = LEVEL) -> np.ndarray:
    """The `level` critical value of a Monte-Carlo test from B draws values [..., B] -> [...]: the
    ceil(level (B + 1))-th smallest draw, so a statistic drawn like them exceeds it with probability at
    most 1 - level exactly (the observed table counted as one more draw; numpy's interpolated 95% quantile of
    1000 draws is exceeded 51 times in 1001, not 50)."""
    b = values.shape[-1]
    k = min(math.ceil(level * (b + 1)), b)
    return np.partition(values, k - 1, axis=-1)[..., k - 1]


def null_se(observed: np.ndarray, se: np.ndarray, n: int) -> np.ndarray:
    """Standard error of each paired difference as if it were 0: the resamples' sd `se` (which spreads
    the per-question differences about their mean d) widened to their spread about 0, se^2 + d^2 / n: the
    variance a sign-flip (randomization) test of the pair uses. Without it a large observed difference
    shrinks its own standard error and the test runs above its level on a few hundred questions
    (McNemar's Wald form against its score form)."""
    return np.sqrt(se * se + observed * observed / n)


def max_t_critical(
    observed: np.ndarray,
    differences: np.ndarray,
    n: int,
    valid: np.ndarray | None = None,
    level: float = LEVEL,
    se: np.ndarray | None = None,
) -> np.ndarray | float:
    """Family-wise critical value of the max-statistic bootstrap over H paired differences on n questions.

    observed [..., H] (the table's differences), differences [..., H, B] (their resamples), valid [..., H]
    (False: left out of the family; so is a difference equal on every resample), se [..., H] (their sd,
    computed when not given) -> [...] (a float for one family). On each resample the largest
    |D*_hb - d_h| / se_h over the family (Westfall & Young 1993; Romano & Wolf 2005, single step); its
    Monte-Carlo `level` critical value (`monte_carlo_quantile`), read as a normal quantile and moved to
    Student's t (the same tail probability), because the test divides by an estimated standard error:
    n - 1 degrees of freedom from the questions, combined with B - 1 from the resamples that estimate it.
    With `null_se`, marking the rows with |d_h| > c null_se_h makes any false mark in the family a
    <= 1 - level event: checked by simulation for independent and correlated rows on 140 and 1000
    questions (evaluate/intervals/simulate.py); the plain bootstrap quantile with the resamples' sd gave 6-7% on
    140 questions.
    """
    se = differences.std(axis=-1, ddof=1) if se is None else se  # [..., H]
    keep = se > 0 if valid is None else valid & (se > 0)
    scale = np.where(keep, se, np.inf)[..., None]  # a difference left out counts 0 on every resample
    t = np.abs(differences - observed[..., None]) / scale  # [..., H, B]
    normal = monte_carlo_quantile(t.max(axis=-2), level)  # [...]
    b = differences.shape[-1]
    # se carries the questions' sampling noise (n - 1 df) and the resamples' Monte-Carlo noise (B - 1 df):
    # their variances of log se add, 1/df = 1/(n - 1) + 1/(B - 1) (Satterthwaite)
    df = 1.0 / (1.0 / max(n - 1, 1) + 1.0 / max(b - 1, 1))
    critical = stats.t.isf(stats.norm.sf(normal), df=df)
    return float(critical) if np.ndim(critical) == 0 else critical


def simultaneous_bounds(
    observed: np.ndarray,
    differences: np.ndarray,
    n: int,
    valid: np.ndarray | None = None,
    level: float = LEVEL,
) -> tuple[np.ndarray, np.ndarray]:
    """The family's simultaneous intervals d_h -+ c null_se_h (`max_t_critical`, `null_se`): observed
    [..., H], differences [..., H, B] -> (lo, hi) [..., H], NaN for a difference left out of the family
    (`valid` False, or equal on every resample); one excludes 0 exactly when the family-wise test rejects
    that difference."""
    se = differences.std(axis=-1, ddof=1)  # [..., H]
    keep = se > 0 if valid is None else valid & (se > 0)
    crit = np.asarray(max_t_critical(observed, differences, n, keep, level, se))[..., None]
    half = np.where(keep, crit * null_se(observed, se, n), np.nan)
    return observed - half, observed + half


def power_difference(
    observed: np.ndarray, differences: np.ndarray, n: int, power: float = 0.8, level: float = LEVEL
) -> float:
    """The difference a family of this size and spread detects with probability `power`: (c + z_power) x
    the median standard error of its comparisons (normal approximation; c: `max_t_critical`). What the
    table's n can show: smaller true differences go unmarked more often than not."""
    se = differences.std(axis=-1, ddof=1)
    crit = max_t_critical(observed, differences, n, level=level, se=se)
    return float((crit + stats.norm.isf(1 - power)) * np.median(se[se > 0]))
