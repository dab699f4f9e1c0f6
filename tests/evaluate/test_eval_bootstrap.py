"""The paired bootstrap over questions: hand-computed resamples, the fast paths against recomputing each
metric on the resampled rows, the pairing of differences, the calibration interval and the max-statistic
critical value."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats
from sklearn.metrics import roc_auc_score
from walla.evaluate import metrics as M
from walla.evaluate.auroc import weighted_auc
from walla.evaluate.intervals.bootstrap import (
    Interval,
    calibration_bounds,
    calibration_interval,
    counts_from_indices,
    difference_interval,
    max_t_critical,
    metric_resamples,
    monte_carlo_quantile,
    null_se,
    percentile_interval,
    resample_indices,
    row_resamples,
)

# 3 questions, label 0 everywhere, two seeds of one method:
#   seed A: confidences .9 (right), .6 (wrong), .7 (right)
#   seed B: confidences .8 (right), .55 (right), .7 (wrong)
LABEL = np.zeros(3, dtype=np.int64)
P_A = np.array([[0.9, 0.1], [0.4, 0.6], [0.7, 0.3]])
P_B = np.array([[0.8, 0.2], [0.55, 0.45], [0.3, 0.7]])
INDICES = np.array([[0, 1, 2], [0, 0, 1], [1, 1, 2], [2, 2, 2]])  # 4 fixed resamples


def _arrays(p: np.ndarray, label: np.ndarray | None = None) -> M.EvalArrays:
    n, k = p.shape
    label = np.zeros(n, dtype=np.int64) if label is None else label
    probs = np.stack([p, np.full((n, k), 1.0 / k)], axis=1)  # [N, 2, K]: the method's pick and a flat agent
    weights = np.tile([0.7, 0.3], (n, 1))
    return M.EvalArrays(p, probs, weights, label, np.eye(k)[label])


SEEDS = [_arrays(P_A), _arrays(P_B)]
COUNTS = counts_from_indices(INDICES, 3)


def test_counts_from_indices():
    assert COUNTS.shape == (3, 4)  # questions x resamples
    assert COUNTS.T.tolist() == [[1, 1, 1], [2, 1, 0], [0, 2, 1], [0, 0, 3]]


def test_accuracy_by_hand():
    # A right on q0, q2; B right on q0, q1. Per resample: A 2/3 2/3 1/3 1; B 2/3 1 2/3 0; mean over seeds:
    expected = [2 / 3, 5 / 6, 1 / 2, 1 / 2]
    got = row_resamples(M.METRICS["accuracy"], SEEDS, COUNTS)
    assert got == pytest.approx(expected, abs=1e-15)
    # percentile interval by hand (numpy's linear interpolation) on the sorted values .5 .5 .667 .833:
    # 2.5%: position 0.075 -> .5; 97.5%: position 2.925 -> 2/3 + .925 * (5/6 - 2/3)
    interval = percentile_interval(got)
    assert interval.lo == pytest.approx(0.5) and interval.hi == pytest.approx(2 / 3 + 0.925 / 6)


def test_auc_by_hand_and_undefined_resamples():
    # A: right {.9, .7} vs wrong {.6}: 1 on the first three resamples; the fourth draws q2 only (all right): NaN.
    # B: r0 right {.8, .55} vs wrong {.7} -> 1/2; r1 all right -> NaN; r2 right {.55, .55} vs {.7} -> 0; r3 NaN.
    a = metric_resamples(M.METRICS["auc"], SEEDS[0], COUNTS)
    b = metric_resamples(M.METRICS["auc"], SEEDS[1], COUNTS)
    assert a[:3].tolist() == [1.0, 1.0, 1.0] and np.isnan(a[3])
    assert b[[0, 2]].tolist() == [0.5, 0.0] and np.isnan(b[[1, 3]]).all()
    both = row_resamples(M.METRICS["auc"], SEEDS, COUNTS)  # mean over the seeds defined on each resample
    assert both[:3].tolist() == [0.75, 1.0, 0.5] and np.isnan(both[3])
    assert percentile_interval(both) is None  # undefined on one resample: no interval at all


def test_ece_by_hand():
    # every confidence sits in its own bin, so ECE = mean |correct - confidence| over the drawn questions:
    # A gaps .1 .6 .3, B gaps .2 .45 .7
    gap_a, gap_b = np.array([0.1, 0.6, 0.3]), np.array([0.2, 0.45, 0.7])
    expected = [(gap_a[r].mean() + gap_b[r].mean()) / 2 for r in INDICES]
    assert expected == pytest.approx([(1 / 3 + 0.45) / 2, 1.65 / 6, 3.1 / 6, 0.5])
    assert row_resamples(M.METRICS["ece"], SEEDS, COUNTS) == pytest.approx(expected, abs=1e-12)


def test_identity_resample_gives_the_table_value():
    ones = np.ones((3, 1))
    for name, info in M.METRICS.items():
        for arrays in SEEDS:
            want = info.compute(arrays)
            got = metric_resamples(info, arrays, ones)[0]
            assert got == pytest.approx(want, abs=1e-12, nan_ok=True), name


@pytest.mark.parametrize("k", [2, 4])
def test_every_metric_fast_path_equals_recomputing_on_resampled_rows(k):
    """terms @ counts and the vectorized AUC/ECE agree with compute() on the resampled rows themselves."""
    rng = np.random.default_rng(3)
    n, m = 40, 3
    probs = rng.dirichlet(np.ones(k), size=(n, m))
    probs[:10] = np.round(probs[:10], 1)  # ties in confidence (AUC) and values on bin edges (ECE)
    probs /= probs.sum(-1, keepdims=True)
    weights = rng.dirichlet(np.ones(m), size=n)
    label = rng.integers(0, k, n)
    p_agg = np.einsum("nm,nmk->nk", weights, probs)
    p_agg[:8] = np.round(p_agg[:8], 1)
    p_agg /= p_agg.sum(-1, keepdims=True)
    arrays = M.EvalArrays(p_agg, probs, weights, label, np.eye(k)[label])
    indices = resample_indices(n, n_resamples=25, seed=5)
    counts = counts_from_indices(indices, n)
    for name, info in M.METRICS.items():
        fast = metric_resamples(info, arrays, counts)
        slow = [info.compute(arrays.subset(idx)) for idx in indices]
        assert fast == pytest.approx(slow, abs=1e-12, nan_ok=True), name


def test_weighted_auc_with_ties_matches_sklearn_on_repeated_rows():
    rng = np.random.default_rng(11)
    score = np.round(rng.random(30), 1)  # many ties
    positive = rng.random(30) < 0.6
    indices = resample_indices(30, n_resamples=20, seed=1)
    got = weighted_auc(score, positive, counts_from_indices(indices, 30))
    want = [roc_auc_score(positive[i], score[i]) for i in indices]
    assert got == pytest.approx(want, abs=1e-12)


def test_resample_matrix_is_fixed_by_seed():
    a, b = resample_indices(140), resample_indices(140)
    assert a.shape == (1000, 140) and (a == b).all() and a.min() == 0 and a.max() == 139
    assert not (resample_indices(140, seed=19) == a).all()
    assert resample_indices(0).shape == (1000, 0)


def test_paired_difference_cancels_what_the_questions_share():
    """Two rows right on the same questions but one: on every resample their difference is exactly how
    often that question was drawn, / N, so the interval is that count's, however noisy each row is. An
    unpaired bootstrap (other resamples per row) would give a wide interval around 0."""
    n = 50
    rng = np.random.default_rng(4)
    right = rng.random(n) < 0.6
    right[0] = True
    other = right.copy()
    other[0] = False
    counts = counts_from_indices(resample_indices(n), n)
    a, b = (row_resamples(M.METRICS["accuracy"], [_arrays(_onehot(r))], counts) for r in (right, other))
    assert a - b == pytest.approx(counts[0] / n, abs=1e-15)
    diff = difference_interval(a, b)
    want = percentile_interval(counts[0] / n)
    assert (diff.lo, diff.hi) == pytest.approx((want.lo, want.hi), abs=1e-15) and diff.hi <= 4 / n
    assert percentile_interval(a).hi - percentile_interval(a).lo > 0.2  # each row alone: ±0.13


def _onehot(right: np.ndarray) -> np.ndarray:
    """[N, 2] predictions of label 0 (right) or 1 (wrong), at confidence 0.8."""
    return np.where(right[:, None], [[0.8, 0.2]], [[0.2, 0.8]])


def test_excludes_zero_is_strict():
    assert Interval(0.01, 0.2).excludes_zero and Interval(-0.2, -0.01).excludes_zero
    assert not Interval(0.0, 0.2).excludes_zero and not Interval(-0.1, 0.0).excludes_zero


def test_calibration_interval_by_hand():
    values = np.array([0.10, 0.12, 0.14, 0.16, 0.18])  # resamples running 0.04 above the estimate
    moved = calibration_interval(values, 0.10, None)  # no null draws: the centred percentile interval
    assert moved.lo == pytest.approx(np.percentile(values, 2.5) - 0.04)
    assert moved.hi == pytest.approx(np.percentile(values, 99) - 0.04)  # the upper end's 1% tail
    # with null draws the lower end is the estimate minus their Monte-Carlo 97.5% quantile: of 101
    # draws the ceil(0.975 x 102) = 100th smallest
    calibrated = np.linspace(0.0, 0.2, 101)  # a calibrated predictor reads up to 0.198 by noise
    assert calibration_interval(values, 0.10, calibrated).lo == 0.0
    assert calibration_interval(values, 0.10, calibrated / 10).lo == pytest.approx(0.10 - 0.0198)
    assert calibration_interval(values, 0.10, calibrated / 10).hi == pytest.approx(moved.hi)
    assert calibration_interval(values - 0.2, 0.01, None).lo == 0.0  # never below 0
    wide = calibration_interval(values, 0.30, None)  # the interval always holds its estimate
    assert wide.lo <= 0.30 <= wide.hi
    assert calibration_interval(np.array([0.1, np.nan]), 0.1, None) is None


def test_calibration_bounds_batch_equals_one_by_one():
    rng = np.random.default_rng(3)
    values, estimate, draws = rng.random((5, 40)) / 5, rng.random(5) / 5, rng.random((5, 40)) / 5
    lo, hi = calibration_bounds(values, estimate, draws)
    for i in range(5):
        one = calibration_interval(values[i], float(estimate[i]), draws[i])
        assert (one.lo, one.hi) == pytest.approx((lo[i], hi[i]), abs=1e-15)


def test_monte_carlo_quantile_counts_the_table_as_one_more_draw():
    draws = np.arange(1.0, 20.0)  # 19 draws: a statistic drawn like them exceeds the 19th in 1 of 20
    assert monte_carlo_quantile(draws, 0.95) == 19.0
    assert monte_carlo_quantile(np.arange(1000.0), 0.95) == 950.0  # the 951st smallest, not 949.05
    assert monte_carlo_quantile(np.arange(4.0), 0.95) == 3.0  # too few draws: the largest
    batch = np.stack([np.arange(1.0, 20.0), np.arange(1.0, 20.0)[::-1] * 2])
    assert monte_carlo_quantile(batch, 0.95).tolist() == [19.0, 38.0]


def test_null_se_adds_the_difference_about_zero():
    se, d = np.array([0.03, 0.0]), np.array([0.1, 0.0])
    assert null_se(d, se, 100) == pytest.approx([np.sqrt(0.03**2 + 0.01 / 100), 0.0])


def test_max_t_critical_by_hand():
    # one hypothesis, resamples symmetric about the observed 1.0 with sd 1: |t| = 0, 0, 1.2247.., ...
    # 4 draws: the Monte-Carlo 95% critical value is the largest; then Student's t on the df of n = 10
    # questions and B = 4 resamples, 1 / (1/9 + 1/3) = 2.25
    df = 1 / (1 / 9 + 1 / 3)
    diffs = np.array([[1.0, 1.0, 1.0 - np.sqrt(1.5), 1.0 + np.sqrt(1.5)]])
    t = np.abs(diffs[0] - 1.0) / diffs[0].std(ddof=1)
    on_t = stats.t.isf(stats.norm.sf(t.max()), df=df)
    assert max_t_critical(np.array([1.0]), diffs, n=10) == pytest.approx(on_t)
    assert on_t > t.max()  # heavier tails: a larger critical value
    # two hypotheses: the max over them on each resample
    two = np.stack([diffs[0], diffs[0][::-1] * 2])
    t2 = np.maximum(t, np.abs(two[1] - 2.0) / two[1].std(ddof=1))
    want = stats.t.isf(stats.norm.sf(t2.max()), df=df)
    assert max_t_critical(np.array([1.0, 2.0]), two, n=10) == pytest.approx(want)
    # a difference left out of the family (valid False) does not raise the critical value
    three = np.concatenate([two, 100 * diffs])
    kept = np.array([True, True, False])
    assert max_t_critical(np.array([1.0, 2.0, 100.0]), three, 10, kept) == pytest.approx(want)
    # a batch of families: one critical value each
    batch = max_t_critical(np.stack([[1.0, 2.0]] * 2), np.stack([two, two]), 10)
    assert batch == pytest.approx([want, want])
