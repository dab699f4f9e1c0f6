"""Selective answers (evaluate/selective.py): accuracy and coverage at confidence thresholds and at fixed
coverages, with the scenario's question resamples; and the augmented heads' diagnostics table."""

from __future__ import annotations

import numpy as np
import pytest
from eval_fixtures import LABEL, PROBS, SPLIT, write_run, write_scenario
from walla.evaluate import selective
from walla.evaluate.config import EvalConfig
from walla.evaluate.report import run
from walla.evaluate.tables import to_markdown


def test_threshold_and_coverage_values_by_hand():
    conf = np.array([0.765, 0.53, 0.615, 0.625, 0.61])
    correct = np.array([1.0, 0.0, 1.0, 1.0, 1.0])
    assert selective.threshold_values(conf, correct, 0.5) == (0.8, 1.0)
    assert selective.threshold_values(conf, correct, 0.7) == (1.0, 0.2)
    acc, cov = selective.threshold_values(conf, correct, 0.9)
    assert np.isnan(acc) and cov == 0.0
    assert selective.coverage_values(conf, correct, 0.5) == 1.0  # ceil(2.5) = 3 most confident, all right
    assert selective.coverage_values(conf, correct, 1.0) == 0.8


def test_resampled_values_agree_with_the_point_values():
    rng = np.random.default_rng(3)
    conf, correct = rng.random(40), (rng.random(40) < 0.6).astype(float)
    ones = np.ones((40, 1))
    for t in selective.THRESHOLDS:
        acc, cov = selective.threshold_values(conf, correct, t, ones)
        point = selective.threshold_values(conf, correct, t)
        assert acc[0] == pytest.approx(point[0], nan_ok=True) and cov[0] == pytest.approx(point[1])
    for c in selective.COVERAGES:
        assert selective.coverage_values(conf, correct, c, ones)[0] == pytest.approx(
            selective.coverage_values(conf, correct, c)
        )
    # a question drawn twice counts twice: duplicating every question leaves accuracy and coverage unchanged
    twos = np.full((40, 1), 2.0)
    assert selective.coverage_values(conf, correct, 0.5, twos)[0] == pytest.approx(
        selective.coverage_values(conf, correct, 0.5)
    )


def test_the_report_has_a_selective_table_and_the_heads_diagnostics(tmp_path):
    runs = tmp_path / "runs"
    write_scenario(runs, "toy", PROBS, LABEL, SPLIT, ["alpha", "beta"], dataset="toyqa")
    for seed in (18, 19):
        write_run(runs, "toy", "uniform", seed, np.full((6, 2), 0.5), PROBS.mean(1), SPLIT)
        w = np.tile([0.3, 0.6], (6, 1)) + 0.01 * seed
        extras = {
            "wagers": w,
            "payouts": w * 0.1,
            "advantage": w - 0.4,
            "pred_score": w * 0.3 + 0.6,
            "pred_baseline": np.full((6, 2), 0.7),
        }
        agg = np.einsum("nm,nmk->nk", w / w.sum(1, keepdims=True), PROBS)
        write_run(runs, "toy", "walla-i-aug", seed, w / w.sum(1, keepdims=True), agg, SPLIT, extras=extras)
    result = run(EvalConfig(report=tmp_path / "out" / "tables.md", runs=runs, plots=True))
    sel = next(t for t in result.tables if t.key == "selective")
    md = to_markdown(sel)
    # UniformAvg on the 5 test questions: p>=0.7 answers only q1 (right): ACC 100, coverage 20
    row = next(line for line in md.splitlines() if line.startswith("| UniformAvg"))
    assert "| 80.00 ± 0.00" in row and "| 100.00 ± 0.00" in row and "| 20.0 ± 0.0" in row
    assert any(t.key == "diagnostics" for t in result.tables)
    assert "tables-toy-selective.png" in {p.name for p in result.files}
