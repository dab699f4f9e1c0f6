"""Runs on disk (train/runs.py layout): round trip, atomic completion marker, skip finished runs."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from synthetic import make_private_context_scenario
from walla.train.methods import MethodOutput
from walla.train.run import limit_rows, run_scenario
from walla.train.runs import (
    PREDICTIONS,
    RUN_META,
    TRAIN_LOG,
    is_complete,
    list_runs,
    read_run,
    read_scenario_table,
    run_dir,
    write_run,
    write_scenario_table,
)

TINY = {"walla-i": {"lr": 3e-3, "epochs": 1, "hidden": [8]}}


@pytest.fixture(scope="module")
def data():
    return make_private_context_scenario(n=120, m=3, k=3, h=[6, 8, 6], seed=9, min_options=2)


def _output(n: int, m: int, k: int, seed: int = 0) -> MethodOutput:
    rng = np.random.default_rng(seed)
    w = rng.random((n, m)).astype(np.float32)
    p = rng.random((n, k)).astype(np.float32)
    return MethodOutput(
        weights=w / w.sum(1, keepdims=True),
        agg_probs=p / p.sum(1, keepdims=True),
        extras={"wagers": w, "payouts": w - 0.5, "agent_probs": rng.random((n, m, k)).astype(np.float32)},
    )


def test_scenario_table_round_trip(tmp_path, data):
    write_scenario_table(tmp_path, data, ["uniform"], [18])
    write_scenario_table(tmp_path, data, ["walla-i"], [19, 18])  # lists merge
    df, meta = read_scenario_table(tmp_path, data.name)
    n, m, k = data.probs.shape
    assert meta["agents"] == data.agents and meta["K"] == k and meta["M"] == m
    assert meta["methods"] == ["uniform", "walla-i"] and meta["seeds"] == [18, 19]
    assert meta["fingerprints"] == data.fingerprints
    assert df["question_id"].to_list() == list(data.question_id)
    np.testing.assert_allclose(np.array(df["agent_probs"].to_list()).reshape(n, m, k), data.probs)
    np.testing.assert_array_equal(np.array(df["option_mask"].to_list()), data.option_mask)
    np.testing.assert_array_equal(np.array(df["variant"].to_list()), data.variant)
    with pytest.raises(FileNotFoundError, match="scenario.parquet: missing"):
        read_scenario_table(tmp_path, "nope")


def test_run_round_trip_and_listing(tmp_path, data):
    n, m, k = data.probs.shape
    out = _output(n, m, k)
    log = [
        {"step": 1, "epoch": 0, "n_seen": 10, "loss": 0.5},
        {"step": 2, "epoch": 0, "n_seen": 20, "loss": 0.4},
    ]
    path = run_dir(tmp_path, data.name, "walla-i", 18)
    write_run(
        path,
        data.question_id,
        data.split,
        out,
        log,
        {"method": "walla-i", "seed": 18, "config": {"lr": 1e-3}},
    )
    assert is_complete(path) and not list(path.glob("*.tmp"))
    rec = read_run(path)
    assert rec.meta["config"] == {"lr": 1e-3} and rec.meta["seed"] == 18
    np.testing.assert_allclose(rec.array("weights"), out.weights)
    np.testing.assert_allclose(rec.array("agg_probs", split="test"), out.agg_probs[data.split == "test"])
    np.testing.assert_allclose(rec.array("agent_probs").reshape(n, m, k), out.extras["agent_probs"])
    assert rec.array("advantage") is None  # absent extras are null columns
    assert rec.train_log["loss"].to_list() == [0.5, 0.4]
    # an interrupted rerun leaves no run.json behind: the run counts as incomplete
    with pytest.raises(ValueError, match="non-finite weights"):
        bad = MethodOutput(weights=np.full((n, m), np.nan, np.float32), agg_probs=out.agg_probs)
        write_run(path, data.question_id, data.split, bad, [], {"method": "walla-i"})
    assert not is_complete(path) and (path / PREDICTIONS).exists()
    with pytest.raises(FileNotFoundError, match="incomplete"):
        read_run(path)
    other = run_dir(tmp_path, data.name, "uniform", 19)
    write_run(other, data.question_id, data.split, out, None, {"method": "uniform"})
    assert pl.read_parquet(other / TRAIN_LOG).columns == ["step", "epoch", "n_seen"]
    refs = list_runs(tmp_path)
    assert [(r.method, r.seed) for r in refs] == [("uniform", 19)]
    assert len(list_runs(tmp_path, data.name, complete_only=False)) == 2


def test_run_scenario_writes_every_row_and_skips_finished(tmp_path, data):
    s1 = run_scenario(data, ["uniform", "walla-i"], [18, 19], tmp_path, overrides=TINY)
    assert [r.status for r in s1.results] == ["done"] * 4
    path = run_dir(tmp_path, data.name, "walla-i", 19)
    rec = read_run(path)
    assert rec.predictions.height == len(data.split)  # all rows of all splits
    assert set(rec.predictions["split"].unique()) == {"train", "val", "test"}
    assert rec.meta["group"] == "walla" and rec.meta["display_name"] == "WALLA I"
    assert rec.meta["config"]["lr"] == 3e-3 and rec.meta["batched_seeds"] == [18, 19]
    assert rec.meta["fingerprints"] == data.fingerprints and rec.meta["wall_time_s"] > 0
    assert rec.train_log.height == int(np.ceil((data.split == "train").sum() / 100))
    stamp = (path / RUN_META).stat().st_mtime_ns
    (run_dir(tmp_path, data.name, "uniform", 18) / RUN_META).unlink()  # simulate an interrupted run
    s2 = run_scenario(data, ["uniform", "walla-i"], [18, 19], tmp_path, overrides=TINY)
    status = {(r.method, r.seed): r.status for r in s2.results}
    assert status == {
        ("uniform", 18): "done",
        ("uniform", 19): "skipped",
        ("walla-i", 18): "skipped",
        ("walla-i", 19): "skipped",
    }
    assert (path / RUN_META).stat().st_mtime_ns == stamp
    s3 = run_scenario(data, ["walla-i"], [19], tmp_path, overrides=TINY, force=True)
    assert [r.status for r in s3.results] == ["done"]
    again = read_run(path)  # same seed, same data: identical predictions
    np.testing.assert_array_equal(again.array("weights"), rec.array("weights"))
    meta = json.loads((tmp_path / data.name / "scenario.json").read_text())
    assert meta["methods"] == ["uniform", "walla-i"] and meta["seeds"] == [18, 19]


def test_scenario_calibration_records_agent_probs(tmp_path, data):
    cal = {"calibration": {"epochs": 1, "min_rows": 5}}
    run_scenario(data, ["uniform"], [18], tmp_path, calibrated=True, overrides=cal)
    rec = read_run(run_dir(tmp_path, data.name, "uniform", 18))
    assert rec.meta["calibrated"] == "scenario"
    assert rec.array("agent_probs").shape == (len(data.split), data.n_agents * 3)


def test_limit_rows_keeps_split_shares(data):
    small = limit_rows(data, 60)
    assert 50 <= len(small.split) <= 60
    assert {"train", "val", "test"} == set(small.split) and small.name == f"{data.name}-rows60"
    assert small.hidden[1].shape == (len(small.split), 8) and small.probs.shape[0] == len(small.split)


def test_unknown_method_suggests(tmp_path, data):
    with pytest.raises(KeyError, match="walla-ii"):
        run_scenario(data, ["walla-iii"], [18], tmp_path)
