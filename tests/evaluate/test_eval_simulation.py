"""The statistics of the tables, checked by simulation (STYLE §16): seeded, numpy only, seconds.

* null: every row an independent predictor of the same accuracy -> the share of tables with any mark
  (a false mark) and with any ‡ is at most 5% plus the Monte-Carlo tolerance;
* power: a row that is clearly better gets its marks;
* coverage: the ECE interval covers the population ECE of a simulated predictor in [0.90, 0.99] of trials.

Tables go through walla's own `annotate` (significance.py), rows built from per-question terms with the
report's resample matrix, so what is simulated is what the report does.

Monte-Carlo tolerance: a rate estimated from T independent tables has standard error
sqrt(p (1 - p) / T); at p = 0.05 and T = 600 that is 0.0089, and a rate is accepted up to
0.05 + 2.33 x 0.0089 = 0.071 (one-sided 99%: a correct 5% procedure fails this test 1 time in 100 seeds).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from threadpoolctl import threadpool_limits
from walla.evaluate.aggregate import Summary
from walla.evaluate.bootstrap import (
    calibrated_uniforms,
    calibration_interval,
    counts_from_indices,
    resample_indices,
    row_draws,
    row_resamples,
)
from walla.evaluate.metrics import METRICS, EvalArrays
from walla.evaluate.significance import annotate, best_baseline
from walla.evaluate.tables import Cell, Column, Row, Table

N_TEST, N_VAL = 140, 60
TABLES = 600
NOMINAL = 0.05
TOLERANCE = 2.33 * math.sqrt(NOMINAL * (1 - NOMINAL) / TABLES)  # 0.0209
BASELINES = 7
ACC = Column("accuracy", "ACC", True, 100.0, 2)
COUNTS = counts_from_indices(resample_indices(N_TEST), N_TEST)  # the report's resample matrix for 140


@pytest.fixture(autouse=True)
def _one_thread():
    """Small [140 x 1000] products, as in the report (report._single_thread): threads only add contention."""
    with threadpool_limits(limits=1):
        yield


def _row(label: str, group: str, right_test: np.ndarray, right_val: np.ndarray, method: str) -> Row:
    """One table row of a single-seed method from its per-question correctness on test and validation."""
    terms = right_test.astype(np.float64)
    cell = Cell(Summary(float(terms.mean()), None, 1, 1), resamples=terms @ COUNTS / N_TEST)
    return Row(label, group, {"accuracy": cell}, method, {"accuracy": float(right_val.mean())})


def simulated_table(rng: np.random.Generator, walla_acc: float = 0.6, acc: float = 0.6) -> Table:
    """UniformAvg, 7 baselines and WALLA I: independent predictors of accuracy `acc` (WALLA: `walla_acc`)
    on 140 test and 60 validation questions: the issue's null when walla_acc == acc."""
    rows = [_row("UniformAvg", "learning_free", rng.random(N_TEST) < acc, rng.random(N_VAL) < acc, "uniform")]
    for i in range(BASELINES):
        right = rng.random(N_TEST) < acc, rng.random(N_VAL) < acc
        rows.append(_row(f"B{i}", "learning_free" if i < 3 else "learning_based", *right, f"b{i}"))
    right = rng.random(N_TEST) < walla_acc, rng.random(N_VAL) < walla_acc
    rows.append(_row("WALLA I", "walla", *right, "walla-i"))
    return Table("main", "sim", "sim", "", [ACC], rows)


def _rates(walla_acc: float, seed: int) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    any_mark = any_best = any_raw = walla_both = 0
    for _ in range(TABLES):
        table = simulated_table(rng, walla_acc)
        annotate(table, "the 140 test questions", "the 60 validation questions")
        cells = [r.cells["accuracy"] for r in table.rows]
        any_mark += any(c.marks for c in cells)
        any_best += any("‡" in c.marks for c in cells)
        any_raw += any(iv.excludes_zero for c in cells for iv in c.vs.values())  # unadjusted, as before
        walla_both += table.rows[-1].cells["accuracy"].marks == "†‡"
    return {
        "any_mark": any_mark / TABLES,
        "any_best": any_best / TABLES,
        "any_unadjusted": any_raw / TABLES,
        "walla_both": walla_both / TABLES,
    }


def test_null_tables_have_a_false_mark_at_most_5_percent():
    rates = _rates(walla_acc=0.6, seed=28)
    print("null rates:", rates)  # quoted in the note of issue 28
    assert rates["any_mark"] <= NOMINAL + TOLERANCE, rates
    assert rates["any_best"] <= NOMINAL + TOLERANCE, rates
    # the simulation has teeth: the unadjusted intervals (kept in the CSV) exclude 0 in far more tables
    assert rates["any_unadjusted"] >= 0.3, rates


def test_a_clearly_better_row_is_marked_against_both_references():
    rates = _rates(walla_acc=0.85, seed=29)  # +25 points on 140 questions
    print("power rates:", rates)
    assert rates["walla_both"] >= 0.9, rates


def test_reference_is_chosen_on_validation_not_on_test():
    rng = np.random.default_rng(0)
    right = rng.random(N_TEST) < 0.6
    rows = [
        _row(
            "lucky on test",
            "learning_based",
            right | (rng.random(N_TEST) < 0.3),
            np.zeros(N_VAL, dtype=bool),
            "a",
        ),
        _row("best on val", "learning_based", right, rng.random(N_VAL) < 0.7, "b"),
        _row("WALLA I", "walla", right, np.ones(N_VAL, dtype=bool), "walla-i"),  # WALLA is never a candidate
    ]
    table = Table("main", "sim", "sim", "", [ACC], rows)
    assert rows[0].cells["accuracy"].summary.mean > rows[1].cells["accuracy"].summary.mean
    assert best_baseline(table, ACC) == 1
    annotate(table, "the 140 test questions", "the 60 validation questions")
    assert table.baselines == {"accuracy": "best on val"}
    assert "on the 60 validation questions" in table.notes[-1]


def test_without_validation_questions_there_is_no_double_dagger():
    table = simulated_table(np.random.default_rng(1), walla_acc=0.95)
    for row in table.rows:
        row.validation = {}
    annotate(table, "the 140 test questions", None)
    walla = table.rows[-1].cells["accuracy"]
    assert walla.marks == "†" and "best" not in walla.vs and table.baselines == {}
    assert "no ‡: this scenario has no validation questions" in table.notes[-1]


# ----------------------------------------------------------------------------------------- ECE coverage

GRID = np.linspace(0.525, 0.975, 10)  # confidences at the centres of the 10 upper bins, one per bin


def _ece_trial(rng: np.random.Generator, gap: float, n: int, counts: np.ndarray, uniforms: np.ndarray):
    """A binary predictor with confidences drawn from GRID, right with probability confidence - gap:
    its population 20-bin ECE is exactly `gap` (every bin holds one confidence). -> (estimate, interval)."""
    conf = rng.choice(GRID, n)
    right = rng.random(n) < conf - gap
    label = np.where(right, 0, 1)
    p_agg = np.stack([conf, 1 - conf], axis=1)
    arrays = [EvalArrays(p_agg, p_agg[:, None, :], np.ones((n, 1)), label, np.eye(2)[label])]
    info = METRICS["ece"]
    estimate = info.compute(arrays[0])
    interval = calibration_interval(
        row_resamples(info, arrays, counts), estimate, row_draws(info, arrays, uniforms)
    )
    return estimate, interval


@pytest.mark.parametrize("gap", [0.0, 0.08])
def test_ece_interval_covers_the_population_ece(gap):
    """A perfectly calibrated predictor (population ECE 0, where the plain percentile interval never
    covered) and an overconfident one (ECE 0.08), n = 140, the report's resamples and draws."""
    rng = np.random.default_rng(int(100 * gap) + 7)
    trials, covered, inside = 300, 0, 0
    uniforms = calibrated_uniforms(N_TEST)
    for _ in range(trials):
        estimate, interval = _ece_trial(rng, gap, N_TEST, COUNTS, uniforms)
        covered += interval.lo <= gap <= interval.hi
        inside += interval.lo <= estimate <= interval.hi
    print(f"ECE coverage at population ECE {gap}: {covered / trials:.3f}")
    assert 0.90 <= covered / trials <= 0.99
    assert inside == trials  # the estimate always lies inside its own interval
