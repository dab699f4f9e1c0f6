"""Tables and predictors whose truth is known, run through the evaluation's own statistics.

What the tables promise, checked by simulation (STYLE §16): the chance of any false mark in a column
(significance.family_marks, the code `annotate` runs) and the coverage of the ECE interval
(calibration_error.ece_debiased_resampled / ece_calibrated_draws, bootstrap.calibration_bounds, the code every ECE
cell runs). Everything is vectorised over simulated tables, seeded, numpy only; the report's own resample
matrix and calibrated label draws are used. Run the full tables with

    python benchmarks/marks_coverage.py --draws 20000

tests/evaluate/test_eval_simulation.py runs a smaller seeded version.

Null table (the setting of issue 28): UniformAvg, 7 baselines (3 learning-free, 4 learning-based) and
WALLA I, each right on a question with probability `accuracy`; with `rho` > 0 every row copies a shared
per-question outcome with probability rho (correlated rows that share what they get right), else draws
its own. The ‡ reference is the baseline (UniformAvg included) with the best accuracy on 60 validation
questions drawn the same way. A column's family: every row against UniformAvg and against ‡.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from walla.evaluate.calibration_error import ECE_BINS, ece_calibrated_draws, ece_debiased_resampled
from walla.evaluate.intervals.bootstrap import (
    N_RESAMPLES,
    calibrated_uniforms,
    calibration_bounds,
    counts_from_indices,
    resample_indices,
)
from walla.evaluate.intervals.significance import family_marks

ROWS = 9  # UniformAvg (row 0), 7 baselines (rows 1-7), WALLA I (row 8)
CANDIDATES = 8  # rows 0-7 may be the ‡ reference (learning-free or learning-based)
N_VALIDATION = 60
ACCURACY = 0.6
MEMORY = 10_000_000  # floats in a batch's largest array ([tables, pairs, resamples] or the ECE draws: ~80 MB)


def report_counts(n: int) -> np.ndarray:
    """[n, B] the resample counts the report uses on an n-question table (bootstrap.py)."""
    return counts_from_indices(resample_indices(n), n)


def correlated_outcomes(
    rng: np.random.Generator, shape: tuple[int, ...], n: int, accuracy: np.ndarray | float, rho: float
) -> np.ndarray:
    """[*shape, n] bool: right with probability `accuracy` (broadcast to shape), each row copying a shared
    per-question outcome (one per leading table) with probability rho, else drawing its own."""
    p = np.broadcast_to(np.asarray(accuracy, dtype=np.float64), shape)[..., None]  # [*shape, 1]
    uniform = rng.random(shape[:1] + (1,) * (len(shape) - 1) + (n,))  # shared per table and question
    own = rng.random(shape + (n,))
    copy = rng.random(shape + (n,)) < rho
    return np.where(copy, uniform, own) < p


def null_table_marks(
    rng: np.random.Generator,
    tables: int,
    counts: np.ndarray,
    rho: float = 0.0,
    walla_accuracy: float = ACCURACY,
) -> np.ndarray:
    """Simulate `tables` accuracy columns on n = counts.shape[0] questions (see the module docstring; WALLA
    I right with probability `walla_accuracy`) and mark them as the tables do -> marked [tables, 17] bool:
    rows 1-8 against UniformAvg, then rows 0-8 against ‡ (a row against itself is never marked)."""
    n, b = counts.shape
    accuracy = np.full(ROWS, ACCURACY)
    accuracy[-1] = walla_accuracy
    batch = max(1, MEMORY // (3 * ROWS * n + 2 * 17 * b))
    out = []
    for start in range(0, tables, batch):
        t = min(batch, tables - start)
        right = correlated_outcomes(rng, (t, ROWS), n, accuracy, rho).astype(np.float64)  # [t, R, n]
        val = correlated_outcomes(rng, (t, ROWS), N_VALIDATION, accuracy, rho).mean(-1)  # [t, R]
        best = np.argmax(val[:, :CANDIDATES], axis=-1)  # [t]: first one on ties, as best_baseline
        out.append(column_marks(right, best, counts))
    return np.concatenate(out)


def column_marks(right: np.ndarray, best: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Marks of a batch of accuracy columns: per-question terms right [T, R, n] (row 0 UniformAvg), the ‡
    row best [T] -> marked [T, 2R - 1] (rows 1.. vs UniformAvg, then rows 0.. vs ‡), via
    significance.family_marks on the report's resamples, as `annotate` does for one table."""
    t, r, n = right.shape
    resamples = (right.reshape(t * r, n) @ counts / counts.sum(0)).reshape(t, r, -1)  # [T, R, B]
    means = right.mean(-1)  # [T, R]
    rows = np.concatenate([np.tile(np.arange(1, r), (t, 1)), np.tile(np.arange(r), (t, 1))], 1)  # [T, H]
    refs = np.concatenate([np.zeros((t, r - 1), dtype=np.int64), np.repeat(best[:, None], r, 1)], 1)
    ti = np.arange(t)[:, None]
    differences = resamples[ti, rows] - resamples[ti, refs]  # [T, H, B]
    observed = means[ti, rows] - means[ti, refs]  # [T, H]
    marked, _, _ = family_marks(observed, differences, n, valid=rows != refs)
    return marked


@dataclass(frozen=True)
class Rate:
    """A rate estimated from `count` of `trials` independent simulations."""

    count: int
    trials: int

    @property
    def value(self) -> float:
        return self.count / self.trials

    @property
    def se(self) -> float:
        """Monte-Carlo standard error sqrt(p (1 - p) / T)."""
        return math.sqrt(self.value * (1 - self.value) / self.trials)

    def upper(self, z: float = 1.645) -> float:
        """One-sided upper confidence bound (Wilson score; z = 1.645: 95%)."""
        p, t = self.value, self.trials
        centre = p + z * z / (2 * t)
        half = z * math.sqrt(p * (1 - p) / t + z * z / (4 * t * t))
        return (centre + half) / (1 + z * z / t)

    def lower(self, z: float = 1.645) -> float:
        """One-sided lower confidence bound (Wilson score; z = 1.645: 95%)."""
        p, t = self.value, self.trials
        centre = p + z * z / (2 * t)
        half = z * math.sqrt(p * (1 - p) / t + z * z / (4 * t * t))
        return (centre - half) / (1 + z * z / t)


def familywise_error(n: int, tables: int, rho: float, seed: int) -> Rate:
    """Share of null columns (every row equally accurate) with any mark."""
    marked = null_table_marks(np.random.default_rng(seed), tables, report_counts(n), rho)
    return Rate(int(marked.any(-1).sum()), tables)


# ----------------------------------------------------------------------------------------- ECE


def bin_centres(options: int, n_bins: int = ECE_BINS) -> np.ndarray:
    """Centres of the confidence bins a K-option max-prob can fall in (above 1/K)."""
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    centres = (edges[:-1] + edges[1:]) / 2
    return centres[centres > 1.0 / options]


def gap_predictors(
    rng: np.random.Generator, trials: int, n: int, options: int, gap: float
) -> tuple[np.ndarray, np.ndarray]:
    """`trials` K-option predictors on n questions whose population 20-bin ECE is exactly `gap`: the
    max-prob confidence is a bin centre drawn uniformly (one confidence per bin), right with probability
    confidence - gap; the rest of the mass spread evenly -> p_agg [T, n, K], label [T, n]."""
    conf = rng.choice(bin_centres(options), size=(trials, n))
    right = rng.random((trials, n)) < conf - gap
    label = rng.integers(0, options, (trials, n))
    pick = np.where(right, label, (label + rng.integers(1, options, (trials, n))) % options)
    p = np.repeat(((1 - conf) / (options - 1))[..., None], options, axis=-1)
    np.put_along_axis(p, pick[..., None], conf[..., None], axis=-1)
    return p, label


@dataclass(frozen=True)
class EceCoverage:
    covered: Rate  # the interval holds the population ECE
    mean_estimate: float  # the table's (debiased) ECE, averaged over trials
    mean_width: float


def ece_coverage(n: int, options: int, gap: float, trials: int, seed: int) -> EceCoverage:
    """How often the table's ECE interval (report resamples, report label draws) holds the population
    ECE `gap` of `gap_predictors`."""
    rng = np.random.default_rng(seed)
    counts = np.concatenate([np.ones((n, 1)), report_counts(n)], axis=1)  # column 0: the estimate itself
    uniforms = calibrated_uniforms(n)
    batch = max(1, MEMORY // (n * N_RESAMPLES))
    covered, estimates, widths = 0, [], []
    for start in range(0, trials, batch):
        t = min(batch, trials - start)
        p, label = gap_predictors(rng, t, n, options, gap)
        values = ece_debiased_resampled(p, label, counts)  # [t, 1 + B]
        estimate, resamples = values[:, 0], values[:, 1:]
        lo, hi = calibration_bounds(resamples, estimate, ece_calibrated_draws(p, uniforms))
        covered += int(((lo <= gap) & (gap <= hi)).sum())
        estimates.append(estimate)
        widths.append(hi - lo)
    return EceCoverage(
        Rate(covered, trials), float(np.concatenate(estimates).mean()), float(np.concatenate(widths).mean())
    )
