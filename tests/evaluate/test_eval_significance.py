"""Question intervals and significance marks in the report, and the block of rows scored against their own
(calibrated) agents: on runs written by train's writer, read back by walla eval."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from eval_fixtures import write_run, write_scenario
from walla.evaluate.intervals.bootstrap import calibration_interval, percentile_interval, resample_indices
from walla.evaluate.metrics import EvalArrays, compute_metrics
from walla.evaluate.report import EvalConfig, run
from walla.evaluate.tables import to_latex, to_markdown
from walla.store.schema import VARIANT_CODE

N = 200  # test questions (after one train row and V validation rows)
V = 60  # validation questions: the ‡ reference is chosen on them
SEEDS = (1, 2)
TEST = slice(1 + V, None)


def _predicting(right: np.ndarray, label: np.ndarray, confidence: float | np.ndarray = 0.7) -> np.ndarray:
    """[N, 2] predictions that are right exactly where `right` is True, at the given confidence(s)."""
    pick = np.where(right, label, 1 - label)
    confidence = np.broadcast_to(confidence, label.shape)
    p = np.stack([1 - confidence, 1 - confidence], axis=1)
    p[np.arange(len(label)), pick] = confidence
    return p


def make_runs(root: Path, calibrated: bool = False) -> tuple[Path, dict]:
    """UniformAvg (about 50% right), StackedGen (60% right), WALLA I (90%: StackedGen's right answers and
    more; its second seed breaks 10 of them, so the seeds differ), WALLA II (StackedGen with 2 answers
    fixed and 2 broken: the same accuracy, noise only); a validation split on which StackedGen is the best
    baseline."""
    rng = np.random.default_rng(0)
    rows = 1 + V + N
    label = rng.integers(0, 2, rows)
    probs = rng.dirichlet([1.0, 1.0], size=(rows, 2))  # [rows, 2 agents, 2 options]
    split = ["train"] + ["val"] * V + ["test"] * N
    variant = np.zeros((rows, 2), dtype=np.int8)
    variant[::2, 0] = VARIANT_CODE["relevant"]  # agent 1 holds the relevant context on every other question
    runs = root / "runs"
    write_scenario(runs, "sig", probs, label, split, ["alpha", "beta"], variant=variant)
    order = rng.permutation(rows)
    base = np.zeros(rows, dtype=bool)
    base[order[: int(0.6 * rows)]] = True
    better = base.copy()
    better[order[: int(0.9 * rows)]] = True
    worse = better.copy()  # WALLA I's second seed
    worse[1 + V + np.flatnonzero(better[TEST])[:10]] = False
    noise = base.copy()
    flip = 1 + V + np.r_[np.flatnonzero(base[TEST])[:2], np.flatnonzero(~base[TEST])[:2]]  # test rows only
    noise[flip] = ~noise[flip]
    w = np.tile([0.6, 0.4], (rows, 1))
    agg = {
        "uniform": probs.mean(1),
        "stacked-gen": _predicting(base, label),
        "walla-i": _predicting(better, label),
        "walla-ii": _predicting(noise, label),
    }
    walla_i = {SEEDS[0]: agg["walla-i"], SEEDS[1]: _predicting(worse, label, np.where(worse, 0.85, 0.65))}
    walla_w = {SEEDS[0]: w, SEEDS[1]: np.tile([0.3, 0.7], (rows, 1))}
    for seed in SEEDS:
        write_run(runs, "sig", "uniform", seed, np.full((rows, 2), 0.5), agg["uniform"], split)
        for method in ("stacked-gen", "walla-ii"):
            write_run(runs, "sig", method, seed, w, agg[method], split)
        write_run(runs, "sig", "walla-i", seed, walla_w[seed], walla_i[seed], split)
        if calibrated:
            cal = probs ** (1 / 1.5)
            cal /= cal.sum(-1, keepdims=True)
            meta = {
                "display_name": "WALLA I (calibrated)",
                "config": {"calibrated": True, "calibration": {"by_role": "auto"}},
            }
            cal_agg = np.einsum("nm,nmk->nk", w, cal)
            write_run(runs, "sig", "walla-i-cal", seed, w, cal_agg, split, agent_probs=cal, run_meta=meta)
    return runs, {
        "label": label,
        "probs": probs,
        "agg": agg,
        "w": w,
        "better": better,
        "walla-i": walla_i,
        "walla-w": walla_w,
    }


def _report(tmp_path: Path, calibrated: bool = False):
    runs, data = make_runs(tmp_path, calibrated)
    result = run(EvalConfig(report=tmp_path / "out" / "t.md", runs=runs, plots=False))
    main = next(t for t in result.tables if t.key == "main")
    return result, main, {r.label: r for r in main.rows}, data


def test_marks_for_a_clear_win_and_none_for_noise(tmp_path):
    _, main, rows, data = _report(tmp_path)
    assert (
        main.baselines["accuracy"] == "StackedGen"
    )  # best on validation; WALLA rows are never the reference
    assert rows["StackedGen"].validation["accuracy"] > rows["UniformAvg"].validation["accuracy"]
    assert rows["WALLA I"].validation == {}  # not a candidate: not even read on validation
    acc = {label: row.cells["accuracy"] for label, row in rows.items()}
    assert acc["WALLA I"].summary.mean == pytest.approx(data["better"][TEST].mean() - 5 / N)
    assert acc["WALLA I"].marks == "†‡"  # 85% vs ~50% and vs 60% on 200 questions: far outside the noise
    assert acc["WALLA II"].summary.mean == acc["StackedGen"].summary.mean  # 2 fixed, 2 broken answers
    assert "‡" not in acc["WALLA II"].marks  # noise: the paired interval of the difference holds 0
    assert acc["WALLA II"].vs["best"].lo < 0 < acc["WALLA II"].vs["best"].hi
    # a row compared with itself: exactly 0 on every resample, never marked
    assert acc["StackedGen"].vs["best"].lo == acc["StackedGen"].vs["best"].hi == 0.0
    assert acc["UniformAvg"].vs["uniform"].lo == acc["UniformAvg"].vs["uniform"].hi == 0.0
    assert "†" not in acc["UniformAvg"].marks and "‡" not in acc["StackedGen"].marks
    md = to_markdown(main)
    assert "ACC StackedGen" in md and "1000 resamples" in md and "on the 60 validation questions" in md
    assert r"$^{\dagger\ddagger}$" in to_latex(main)  # both marks in one superscript
    # every shown mark has both its unadjusted and its simultaneous interval excluding 0; the simultaneous
    # one is the wider
    for cell in (c for r in main.rows for c in r.cells.values()):
        for key in cell.significant:
            assert cell.vs[key].excludes_zero and cell.sim[key].excludes_zero
        for key, sim in cell.sim.items():
            assert sim.lo <= cell.vs[key].lo + 1e-12 or sim.hi >= cell.vs[key].hi - 1e-12


def test_question_interval_is_the_seed_mean_on_explicit_resamples(tmp_path):
    """The report's brackets equal a direct computation: every metric of each (differing) seed recomputed
    on each resample's rows (compute_metrics), averaged over the seeds, 2.5% / 97.5% percentiles (ECE:
    the calibration interval of those same values)."""
    _, main, rows, data = _report(tmp_path)
    label = data["label"][TEST]
    probs = np.asarray(data["probs"][TEST], dtype=np.float32)  # as the run files hold them
    per_seed = []
    for seed in SEEDS:
        agg = np.asarray(data["walla-i"][seed][TEST], dtype=np.float32)
        w = np.asarray(data["walla-w"][seed][TEST], dtype=np.float32)
        arrays = EvalArrays(agg, probs, w, label, np.eye(2, dtype=np.float32)[label])
        per_seed.append([compute_metrics(arrays.subset(idx)) for idx in resample_indices(N)])
    for col in main.columns:
        by_seed = np.array([[r[col.key] for r in resamples] for resamples in per_seed])  # [S, B]
        assert not np.allclose(by_seed[0], by_seed[1]), col.key  # the seeds differ on every metric
        values = by_seed.mean(0)
        cell = rows["WALLA I"].cells[col.key]
        assert cell.resamples == pytest.approx(values, abs=1e-12), col.key
        if col.key == "ece":
            want = calibration_interval(values, cell.summary.mean, cell.draws)
        else:
            want = percentile_interval(values)
        assert (cell.boot.lo, cell.boot.hi) == pytest.approx((want.lo, want.hi), abs=1e-12), col.key


def test_calibrated_rows_sit_in_their_own_block_and_are_not_compared_on_agent_metrics(tmp_path):
    result, main, rows, _ = _report(tmp_path, calibrated=True)
    assert main.rows[-1].label == "WALLA I (calibrated)" and main.rows[-1].group == "calibrated"
    cal = rows["WALLA I (calibrated)"].cells
    for key in ("mrr", "kendall_tau", "d_regret"):  # scored against its own agents
        assert not cal[key].comparable and cal[key].vs == {} and cal[key].boot is not None
    for key in ("auc", "accuracy", "ece"):  # the aggregate only: compared as usual
        assert cal[key].comparable and set(cal[key].vs) == {"uniform", "best"}
    md = to_markdown(main)
    assert "| *Scored against its own recalibrated agents* |" in md
    note = next(n for n in main.notes if n.startswith("Scored against its own recalibrated agents:"))
    assert (
        "fit on train + val only" in note and "MRR, K-Tau, DRegret are measured against those agents" in note
    )
    assert "held the relevant private context" in note  # the scenario routes contexts: heads by role
    other = next(t for t in result.tables if t.key == "other")
    assert "depends on the aggregate only" in " ".join(other.notes)
    tex = to_latex(main)
    assert (
        "\\midrule\nWALLA I (calibrated) & " in tex and "Scored against its own recalibrated agents: " in tex
    )


def test_csv_carries_intervals_and_marks(tmp_path):
    _report(tmp_path)
    records = csv.DictReader((tmp_path / "out" / "t.csv").open())
    rows = {(r["row"], r["metric"]): r for r in records if r["table"] == "main"}
    walla = rows[("WALLA I", "accuracy")]
    assert (
        walla["vs_uniform_sig"] == "1"
        and walla["vs_best_sig"] == "1"
        and walla["best_baseline"] == "StackedGen"
    )
    assert float(walla["boot_lo"]) < float(walla["mean"]) < float(walla["boot_hi"])
    assert float(walla["vs_best_lo"]) > 0
    # the simultaneous interval (family-wise) is wider than the unadjusted one, and also excludes 0 here
    assert 0 < float(walla["vs_best_sim_lo"]) < float(walla["vs_best_lo"])
    assert float(walla["vs_best_sim_hi"]) > float(walla["vs_best_hi"])
    noise = rows[("WALLA II", "accuracy")]
    assert noise["vs_best_sig"] == "0" and float(noise["vs_best_lo"]) < 0 < float(noise["vs_best_hi"])
    mrr = rows[("UniformAvg", "mrr")]  # not shown ("–"), so not compared
    assert mrr["vs_uniform_sig"] == "" and mrr["vs_best_lo"] == ""


def test_empty_hard_subset_has_no_intervals_and_no_bootstrap_note(tmp_path):
    runs = tmp_path / "runs"
    probs = np.array([[[0.9, 0.1], [0.8, 0.2]]] * 4)  # both agents right on every question
    split = ["train"] + ["test"] * 3
    write_scenario(runs, "easy", probs, np.zeros(4, dtype=np.int64), split, ["a", "b"])
    for seed in SEEDS:
        write_run(runs, "easy", "uniform", seed, np.full((4, 2), 0.5), probs.mean(1), split)
    result = run(EvalConfig(report=tmp_path / "t.md", runs=runs, plots=False))
    hard = next(t for t in result.tables if t.key == "hard")
    assert all(
        c.boot is None and c.vs == {} and c.note == "empty" for r in hard.rows for c in r.cells.values()
    )
    assert not any("bootstrap" in n for n in hard.notes)
    main = next(t for t in result.tables if t.key == "main")  # 3 identical questions: every resample alike
    acc = next(r for r in main.rows if r.method == "uniform").cells["accuracy"]
    assert (acc.boot.lo, acc.boot.hi) == (1.0, 1.0)
