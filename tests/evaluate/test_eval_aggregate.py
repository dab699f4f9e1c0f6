"""Seed aggregation: mean and 95% t-interval half-width, as scipy.stats.t.interval computes it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats
from walla.evaluate.aggregate import summarize


def test_ci_matches_scipy_t_interval():
    values = [0.81, 0.83, 0.80, 0.84, 0.82]
    lo, hi = stats.t.interval(0.95, len(values) - 1, loc=np.mean(values), scale=stats.sem(values))
    s = summarize(values)
    assert s.mean == pytest.approx(np.mean(values))
    assert s.ci == pytest.approx((hi - lo) / 2)
    assert (s.n, s.n_total) == (5, 5)


def test_non_finite_values_are_dropped():
    s = summarize([0.5, float("nan"), 0.7, float("inf")])
    lo, hi = stats.t.interval(0.95, 1, loc=0.6, scale=stats.sem([0.5, 0.7]))
    assert s.mean == pytest.approx(0.6) and s.ci == pytest.approx((hi - lo) / 2)
    assert (s.n, s.n_total, s.partial) == (2, 4, True)


def test_single_value_has_no_interval_and_nothing_is_nan():
    assert summarize([0.3]).ci is None
    empty = summarize([float("nan"), float("nan")])
    assert math.isnan(empty.mean) and empty.ci is None and not empty.defined


def test_deterministic_method_gives_zero_width():
    s = summarize([0.1] * 5)  # the float mean of five 0.1 is not exactly 0.1; the width must still be 0
    assert s.ci == 0.0 and s.mean == pytest.approx(0.1)


def test_scaled():
    s = summarize([0.2, 0.4]).scaled(100)
    assert s.mean == pytest.approx(30.0) and s.ci == pytest.approx(100 * summarize([0.2, 0.4]).ci)
