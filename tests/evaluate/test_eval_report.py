"""The report recipe end to end on runs written by the test: golden tables, missing runs, errors, CLI, plots.

The golden numbers were checked by hand (see the comments next to GOLDEN_MAIN).
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

import numpy as np
import pytest
from eval_fixtures import LABEL, PROBS, SPLIT, write_run, write_scenario
from typer.testing import CliRunner
from walla.evaluate.cli import app
from walla.evaluate.plots import _log_metrics, rolling_mean
from walla.evaluate.report import EvalConfig, run
from walla.evaluate.tables import to_markdown

WALLA_W = {
    18: [[0.5, 0.5], [0.8, 0.2], [0.25, 0.75], [0.5, 0.5], [0.1, 0.9], [0.65, 0.35]],
    19: [[0.5, 0.5], [0.7, 0.3], [0.1, 0.9], [0.6, 0.4], [0.3, 0.7], [0.55, 0.45]],
}

# Hand checks: alpha is right on q1, q3, q5 -> ACC 60; its confidences .91 .77 .66 .58 .74 sit in separate
# bins -> ECE (.09+.77+.34+.58+.26)/5 = 40.80; correct {.91,.66,.74} vs wrong {.77,.58} -> AUC 4/6.
# Per-question Brier alpha .0162 1.1858 .2312 .6728 .1352, beta .2888 .1682 .3698 .0578 .5408 -> best
# agent a b a b a -> alpha's D-Regret (1.0176 + .615)/5 = 32.65, MRR (1+.5+1+.5+1)/5, K-Tau 1/5.
# WALLA I K-Tau: seed 18 (1+1+0+1+1)/5 = .8, seed 19 1.0 -> 90.00 ± 12.706 * .1414 / sqrt(2) = 127.06.
# Beta is right on every question but q5 with confidence .52 below all others -> AUC 100; WALLA I is right
# everywhere on both seeds -> AUC undefined ("–").
GOLDEN_MAIN = """\
### toy: all test questions

*Scenario toy · dataset toyqa (hard labels) · agents: 1 alpha, 2 beta · N = 5 test questions · seeds: 18, 19 · store fingerprints: alpha/none 0000000000000000, beta/none 0000000000000001*

| Method | AUC ↑ | ACC ↑ | ECE ↓ | MRR ↑ | K-Tau ↑ | DRegret ↓ |
|:--|--:|--:|--:|--:|--:|--:|
| *Individual agents* | | | | | | |
| Agent 1: alpha | 66.67 | 60.00 | 40.80 | 80.00 | 20.00 | 32.65 |
| Agent 2: beta | 100.00 | 80.00 | 35.80 | 70.00 | -20.00 | 16.34 |
| *Learning-free baselines* | | | | | | |
| UniformAvg | 100.00 ± 0.00 | 80.00 ± 0.00 | 38.30 ± 0.00 | – | 0.00 ± 0.00 | 18.91 ± 0.00 |
| *WALLA* | | | | | | |
| WALLA I | – | **100.00 ± 0.00** | **30.66 ± 7.12** | 100.00 ± 0.00 | **90.00 ± 127.06** | **8.25 ± 2.28** |

Values ×100: mean ± 95% CI over seeds (t-interval), then [lo, hi] the 95% interval over test questions (below); bold = best aggregation method per column (individual agents excluded).\\
[lo, hi]: 95% percentile interval from a paired bootstrap over the 5 test questions (1000 resamples with replacement, numpy default_rng(18); on each resample the metric is computed per seed and averaged over seeds; every row uses the same resamples); ECE is the debiased binned estimator (Kumar et al. 2019), which still reads high on few questions (a perfectly calibrated predictor reads about 5 with 2 options and 7 with 4 on 140 questions, 2 on 1000); its interval runs from the estimate less what a perfectly calibrated predictor with the same confidences reads in 97.5% of label draws (0 when the estimate is within that; 1000 draws, numpy default_rng(19)) to the resamples' 99th percentile centred on the estimate. † : the row differs from UniformAvg; no ‡: this scenario has no validation questions to choose the reference on. A mark is shown when the difference's simultaneous 95% interval over the column's family excludes 0 (max-statistic bootstrap over the paired differences, its critical value read on Student's t, each standard error taken about 0), and so does its unadjusted interval (in the CSV); the family is every row compared in this column against either reference, so the chance of any false mark in a column is at most 5% (simulated on null tables of 140 and 1000 questions, independent and correlated rows). Power: with the 5 test questions a true difference of about ACC 79.19, ECE 30.01, K-Tau 192.45, DRegret 42.72 is marked 80% of the time or more (the column's median standard error x (critical value + 0.84)); smaller ones mostly go unmarked. Direction is either way; the marks hold the trained seeds fixed, so a marked difference inside the seed intervals (±) is still within training noise. No brackets: the metric is undefined on some resample (e.g. AUC when every drawn prediction is right), so neither an interval nor a mark is given.\\
– : undefined on every seed (e.g. AUC when all test predictions are right, or all wrong).\\
– (MRR): equal weights rank the agents by slot order only (SPEC §10.10), so MRR is not shown.
"""  # noqa: E501

# hard subset = q2, q4, q5 (q1 and q3 are answered correctly by both agents) -> N = 3
GOLDEN_HARD_ROWS = [
    "| Agent 1: alpha | 50.00 | 33.33 | 53.67 | 66.67 | -33.33 | 54.42 |",
    "| UniformAvg | 100.00 ± 0.00 | 66.67 ± 0.00 | 43.17 ± 0.00 | – | 0.00 ± 0.00 | 26.20 ± 0.00 |",
]

# wagers = weights / 2: alpha seed 18 mean .23, seed 19 .225 -> 22.75 ± 12.706 * .003536 / sqrt(2) = 3.18
GOLDEN_WAGERS = """\
| Method | WALLA I Wager | WALLA I Net payout |
|:--|--:|--:|
| Agent 1: alpha | 22.75 ± 3.18 | 2.55 ± 0.64 |
| Agent 2: beta | 27.25 ± 3.18 | 3.45 ± 0.64 |
"""


def make_runs(root: Path, methods=(), seeds=(), with_heads: bool = False, meta: dict | None = None) -> Path:
    runs = root / "runs"
    write_scenario(
        runs, "toy", PROBS, LABEL, SPLIT, ["alpha", "beta"], methods, seeds, dataset="toyqa", meta=meta
    )
    for seed in (18, 19):
        uniform_meta = {"display_name": "UniformAvg", "group": "learning_free"}
        write_run(
            runs, "toy", "uniform", seed, np.full((6, 2), 0.5), PROBS.mean(1), SPLIT, run_meta=uniform_meta
        )
        w = np.array(WALLA_W[seed])
        extras = {"wagers": w * 0.5, "payouts": w * 0.1 - 0.02}
        log = None
        if with_heads:
            extras |= {
                "advantage": w - 0.4,
                "pred_score": w * 0.3 + 0.6,
                "pred_baseline": np.full((6, 2), 0.7),
            }
            steps = list(range(30))
            log = {
                "step": steps,
                "epoch": [s // 10 for s in steps],
                "n_seen": [100 * s for s in steps],
                "d_regret": [0.3 / (1 + s) for s in steps],
                "acc": [0.5 + s / 100 for s in steps],
            }
        agg = np.einsum("nm,nmk->nk", w, PROBS)
        write_run(runs, "toy", "walla-i", seed, w, agg, SPLIT, extras=extras, train_log=log)
    return runs


def _table(result, key):
    return next(t for t in result.tables if t.key == key)


def seed_parts(md: str) -> str:
    """The Markdown without the question intervals and significance marks (test_eval_significance.py
    checks those): what the hand-checked seed numbers below are compared with."""
    return re.sub(r" \[-?[\d.]+, -?[\d.]+\][†‡]*", "", md)


def test_golden_tables(tmp_path):
    runs = make_runs(tmp_path)
    result = run(EvalConfig(report=tmp_path / "out" / "tables.md", runs=runs, plots=False))
    assert seed_parts(to_markdown(_table(result, "main"))) == GOLDEN_MAIN
    hard = seed_parts(to_markdown(_table(result, "hard")))
    assert "N = 3 test questions" in hard
    for row in GOLDEN_HARD_ROWS:
        assert row in hard
    assert GOLDEN_WAGERS in to_markdown(_table(result, "wagers"))
    assert not result.problems
    header = (tmp_path / "out" / "tables.md").read_text().split("## Scenario")[0]
    assert "Marks: marks control the family-wise error at 5% per column of a table" in header
    assert (
        "‡ reference: per column, the learning-free or learning-based baseline with the best mean on the "
        in header
    )
    # the report file holds the same tables; .tex and .csv sit next to it
    md = (tmp_path / "out" / "tables.md").read_text()
    assert GOLDEN_MAIN in seed_parts(md) and "## Missing runs" not in md
    assert "paired bootstrap over test questions (1000 resamples, numpy default_rng(18))" in md  # header
    tex = (tmp_path / "out" / "tables.tex").read_text()
    assert (
        r"\toprule" in tex
        and r"\textbf{100.00}\tiny{$\pm$0.00}\,\tiny{[100.00, 100.00]}" in tex
        and r"90.00}\tiny{$\pm$127.06}\,\tiny{[" in tex
    )
    # no mark on 5 questions (WALLA I's ACC is one question above UniformAvg's): the family's critical value
    # is read on Student's t with about 3 degrees of freedom; marks in LaTeX: test_eval_significance.py
    assert r"$^{\dagger" not in tex and r"$^{\ddagger" not in tex
    rows = list(csv.DictReader((tmp_path / "out" / "tables.csv").open()))
    acc = next(
        r for r in rows if r["table"] == "main" and r["row"] == "WALLA I" and r["metric"] == "accuracy"
    )
    assert float(acc["mean"]) == pytest.approx(100.0) and acc["bold"] == "1" and acc["n"] == "2"
    mrr = next(r for r in rows if r["table"] == "main" and r["row"] == "UniformAvg" and r["metric"] == "mrr")
    assert mrr["note"] == "uniform" and float(mrr["mean"]) == pytest.approx(100 * (1 + 0.5 + 1 + 0.5 + 1) / 5)


def test_soft_target_scenario_uses_kld_tvd_columns(tmp_path):
    runs = tmp_path / "runs"
    target = np.array([[0.5, 0.5], [0.7, 0.3], [0.6, 0.4], [0.2, 0.8], [0.35, 0.65], [0.9, 0.1]])
    write_scenario(runs, "bx", PROBS, LABEL, SPLIT, ["g", "g"], target=target, soft_target=True)
    for seed in (1, 2):
        write_run(runs, "bx", "uniform", seed, np.full((6, 2), 0.5), PROBS.mean(1), SPLIT)
    result = run(EvalConfig(report=tmp_path / "t.md", runs=runs, plots=False))
    md = to_markdown(_table(result, "main"))
    assert "| Method | KLD ↓ | TVD ↓ | MRR ↑ | DRegret ↓ |" in md
    tvd = np.mean(np.abs(PROBS.mean(1)[1:, 0] - target[1:, 0]))
    assert "| UniformAvg | " in md and f"{100 * tvd:.2f} ± 0.00" in md


def test_missing_method_seed_and_incomplete_run_are_reported(tmp_path):
    runs = make_runs(tmp_path, methods=["uniform", "walla-i", "stacked-gen"], seeds=[18, 19, 20])
    write_run(runs, "toy", "walla-i", 20, np.full((6, 2), 0.5), PROBS.mean(1), SPLIT, complete=False)
    other_ids = [f"x{i}" for i in range(6)]  # does not cover the test questions
    write_run(runs, "toy", "uniform", 20, np.full((6, 2), 0.5), PROBS.mean(1), SPLIT, question_ids=other_ids)
    (runs / "broken" / "uniform" / "seed=1").mkdir(parents=True)  # a scenario without scenario.parquet
    (runs / "broken" / "scenario.json").write_text((runs / "toy" / "scenario.json").read_text())
    # rows in another order than scenario.parquet are re-aligned by question_id
    perm = [5, 0, 3, 1, 4, 2]
    split = [SPLIT[i] for i in perm]
    ids = [f"q{i}" for i in perm]
    meta = {"display_name": "UniformAvg"}
    write_run(
        runs,
        "toy",
        "uniform",
        19,
        np.full((6, 2), 0.5),
        PROBS.mean(1)[perm],
        split,
        question_ids=ids,
        run_meta=meta,
    )
    result = run(EvalConfig(report=tmp_path / "r.md", runs=runs, plots=False))
    lines = {p.line().split(":")[0] + ":" + p.kind for p in result.problems}
    assert "broken:unreadable" in lines
    assert "toy/walla-i/seed=20:incomplete" in lines
    assert "toy/uniform/seed=20:unreadable" in lines
    assert {f"toy/stacked-gen/seed={s}:missing" for s in (18, 19, 20)} <= lines
    md = seed_parts((tmp_path / "r.md").read_text())
    assert "## Missing runs" in md and "**Warning:**" in md and "stacked-gen/seed=19: missing" in md
    # the complete runs are still evaluated (and the shuffled uniform seed gives the same numbers)
    assert "| WALLA I | – | **100.00 ± 0.00**" in md
    assert (
        "| UniformAvg | 100.00 ± 0.00 | 80.00 ± 0.00 | 38.30 ± 0.00 | – | 0.00 ± 0.00 | 18.91 ± 0.00 |" in md
    )


def test_nan_metric_on_every_seed_is_a_dash_with_footnote(tmp_path):
    runs = make_runs(tmp_path)
    md = to_markdown(_table(run(EvalConfig(report=tmp_path / "r.md", runs=runs, plots=False)), "main"))
    assert "| WALLA I | – |" in md and "– : undefined on every seed" in md


def test_cli_writes_files_and_summary(tmp_path):
    runs = make_runs(tmp_path, seeds=[18, 19, 20])
    out = CliRunner().invoke(
        app, ["--report", str(tmp_path / "o" / "t.md"), "--runs", str(runs), "--no-plots"]
    )
    assert out.exit_code == 0, out.output
    assert "wrote " in out.output and "t.md" in out.output and "t.tex" in out.output and "t.csv" in out.output
    assert "WALLA I" in out.output and "warning:" in out.output  # seed 20 missing


def test_cli_errors_are_one_line(tmp_path):
    runner = CliRunner()
    out = runner.invoke(app, ["--report", str(tmp_path / "t.md"), "--runs", str(tmp_path / "nope")])
    assert out.exit_code == 1 and "does not exist" in out.output and "Traceback" not in out.output
    (tmp_path / "empty").mkdir()
    out = runner.invoke(app, ["--report", str(tmp_path / "t.md"), "--runs", str(tmp_path / "empty")])
    assert out.exit_code == 1 and "no scenario" in out.output
    runs = make_runs(tmp_path)
    out = runner.invoke(app, ["--report", str(tmp_path / "t.md"), "--runs", str(runs), "--scenario", "other"])
    assert out.exit_code == 2 and "no such scenario 'other'" in out.output and ": toy)" in out.output
    out = runner.invoke(app, ["--report", str(tmp_path / "t.txt"), "--runs", str(runs)])
    assert out.exit_code == 2 and ".md" in out.output


def test_plots_are_written(tmp_path):
    runs = make_runs(tmp_path, with_heads=True)
    result = run(EvalConfig(report=tmp_path / "out" / "tables.md", runs=runs, plots=True))
    pngs = sorted(p.name for p in result.files if p.suffix == ".png")
    assert pngs == [
        f"tables-toy-{k}.png" for k in ("alignment", "heads", "reliability", "selective", "training")
    ]
    for name in pngs:
        data = (tmp_path / "out" / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    md = (tmp_path / "out" / "tables.md").read_text()
    assert "![Learned wager vs realized advantage](tables-toy-alignment.png)" in md


def test_training_plot_helpers():
    y = np.array([1.0, 2.0, np.inf, 4.0, np.nan, np.nan, 7.0])
    assert np.allclose(rolling_mean(y, 2), [1.5, 2.0, 4.0, 4.0, np.nan, 7.0], equal_nan=True)
    cols = [
        "step",
        "epoch",
        "n_seen",
        "loss",
        "grad_norm",
        "stop_metric",
        "window_metric",
        "wager_mean",
        "wager_0",
    ]
    assert _log_metrics(cols) == ["window_metric", "stop_metric", "wager_mean", "loss"]


def test_the_caption_names_each_feature_sets_determinism_tier(tmp_path):
    """Issue 27: the tier a feature set's backend settled (recorded by store assembly) is in the header line."""
    used = {"alpha/toyqa/none": {"fingerprint": "0000000000000000", "determinism": "batch-recorded"}}
    runs = make_runs(tmp_path, meta={"feature_sets": used})
    result = run(EvalConfig(report=tmp_path / "out" / "tables.md", runs=runs, plots=False))
    caption = to_markdown(_table(result, "main")).splitlines()[2]
    assert "alpha/none 0000000000000000 (batch-recorded), beta/none 0000000000000001*" in caption
