"""The run format (train/runs/_layout.py, runs/writer.py, runs/reader.py) and the recipe (train/run.py): round trip, completion marker,
skipping finished runs, retraining stale ones, and the one-writer lock."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from synthetic import make_private_context_scenario
from walla.manifests.scenario import Scenario, ScenarioSpec
from walla.train.engine import TrainEnv, load_checkpoint
from walla.train.methods import MethodOutput, method_module
from walla.train.plan import Overrides, build_plan
from walla.train.resolve import states_to_save
from walla.train.run import RunsLockedError, run_plan, runs_lock
from walla.train.runs import (
    PREDICTIONS,
    RUN_META,
    STATE,
    RunDir,
    RunFormatError,
    is_complete,
    key_id,
    list_run_dirs,
    read_run,
    read_scenario_table,
    run_dir,
    run_key,
    write_run,
    write_scenario_table,
)

SPEC = {"dataset": "synthetic", "agents": ["a", "b", "c"]}
TRAIN = {
    "methods": ["uniform", "walla-i"],
    "seeds": [18, 19],
    "hparams": {
        "walla": {"lr": 3.0e-3, "epochs": 1, "hidden": [8], "projection_dim": None, "batch_size": 20}
    },
}


@pytest.fixture(scope="module")
def data():
    return make_private_context_scenario(n=120, m=3, k=3, h=[6, 8, 6], seed=9, min_options=2)


def _plan(data, train=None, **over):
    spec = ScenarioSpec(
        name=data.name, dataset="synthetic", agents=tuple(data.agents), description="synthetic"
    )
    problems: list[str] = []
    plan = build_plan(
        {"train": train or TRAIN}, Path("synthetic.yaml"), Scenario(spec, {}, {}), Overrides(**over), problems
    )
    assert not problems, problems
    return plan


def _output(n: int, m: int, k: int, seed: int = 0) -> MethodOutput:
    rng = np.random.default_rng(seed)
    w = rng.random((n, m)).astype(np.float32)
    p = rng.random((n, k)).astype(np.float32)
    return MethodOutput(
        weights=w / w.sum(1, keepdims=True),
        agg_probs=p / p.sum(1, keepdims=True),
        extras={"wagers": w, "payouts": w - 0.5, "agent_probs": rng.random((n, m, k)).astype(np.float32)},
    )


def test_scenario_table_and_run_round_trip(tmp_path, data):
    meta = write_scenario_table(tmp_path, data, SPEC, ["uniform"], [18])
    assert write_scenario_table(tmp_path, data, SPEC, ["walla-i"], [19, 18])["methods"] == [
        "uniform",
        "walla-i",
    ]
    table = read_scenario_table(tmp_path, data.name)
    test = data.split_index("test")
    n, m, k = data.probs.shape
    assert table.agents == list(data.agents) and table.fingerprints == data.fingerprints
    assert list(table.question_id) == list(data.question_id[test])
    np.testing.assert_allclose(table.probs, data.probs[test], atol=1e-6)
    np.testing.assert_array_equal(table.variant, data.variant[test])
    out = _output(n, m, k)
    kid = key_id(run_key(meta["inputs_id"], "walla-i", {"lr": 1e-3}))
    path = run_dir(tmp_path, data.name, "walla-i", kid, 18)
    write_run(path, data.question_id, data.split, out, {"method": "walla-i", "seed": 18})
    rec = read_run(path, table)
    np.testing.assert_allclose(rec.weights, out.weights[test], atol=1e-6)
    np.testing.assert_allclose(rec.extras["wagers"], out.extras["wagers"][test], atol=1e-6)
    np.testing.assert_allclose(rec.agent_probs, out.extras["agent_probs"][test], atol=1e-6)
    legacy = tmp_path / data.name / "walla-i" / "seed=19"  # the layout before run keys
    legacy.mkdir()
    assert list_run_dirs(tmp_path, data.name) == [
        RunDir("walla-i", None, 19, legacy),
        RunDir("walla-i", kid, 18, path),
    ]
    (path / RUN_META).write_text("{not json")
    with pytest.raises(RunFormatError, match=r"run.json: not valid JSON"):
        read_run(path, table)


def test_write_run_refuses_non_finite(tmp_path, data):
    n, m, k = data.probs.shape
    out = _output(n, m, k)
    out.agg_probs[0, 0] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        write_run(tmp_path / "r", data.question_id, data.split, out, {"method": "x"})
    assert not is_complete(tmp_path / "r")


def test_run_plan_writes_skips_and_retrains_stale(tmp_path, data):
    plan = _plan(data)
    env = TrainEnv()
    res = run_plan(plan, data, tmp_path, env, note=lambda s: None, save_states={"walla-i"})
    assert [(r["method"], r["seed"], r["status"]) for r in res] == [
        ("uniform", 18, "done"),
        ("uniform", 19, "done"),
        ("walla-i", 18, "done"),
        ("walla-i", 19, "done"),
    ]
    wpath = run_dir(tmp_path, data.name, "walla-i", res[2]["key_id"], 18)
    assert (wpath / "state.pt").exists() and (wpath / "logs" / "metrics.csv").exists()
    assert not (run_dir(tmp_path, data.name, "uniform", res[0]["key_id"], 18) / "state.pt").exists()
    table = read_scenario_table(tmp_path, data.name)
    rec = read_run(wpath, table)
    assert rec.train_log.height > 0 and {"step", "loss"} <= set(rec.train_log.columns)
    assert rec.meta["display_name"] == "WALLA I" and rec.meta["config"]["lr"] == 3e-3
    np.testing.assert_allclose(rec.weights.sum(1), 1.0, atol=1e-5)
    again = run_plan(plan, data, tmp_path, env, note=lambda s: None)
    assert {r["status"] for r in again} == {"skipped"}
    # a changed config is another run key: walla-i trains beside the first runs, uniform's are kept
    hp = {"walla": {**TRAIN["hparams"]["walla"], "lr": 1.0e-3}}
    changed = run_plan(_plan(data, {**TRAIN, "hparams": hp}), data, tmp_path, env, note=lambda s: None)
    assert [r["status"] for r in changed] == ["skipped", "skipped", "done", "done"]
    assert changed[2]["key_id"] != res[2]["key_id"] and read_run(wpath, table).meta["config"]["lr"] == 3e-3
    walla = [d for d in list_run_dirs(tmp_path, data.name) if d.method == "walla-i"]
    assert sorted((d.key_id, d.seed) for d in walla) == sorted(
        (r["key_id"], r["seed"]) for r in res[2:] + changed[2:]
    )
    # other questions (a different scenario input): every run of the same key is retrained in place
    notes: list[str] = []
    other = dataclasses.replace(data, fingerprints={**data.fingerprints, "a/none": "ffff"})
    again = run_plan(_plan(data), other, tmp_path, env, note=notes.append)
    assert {r["status"] for r in again} == {"done"}
    assert [r["key_id"] for r in again] == [r["key_id"] for r in res]
    assert sum("trained from other inputs or by another walla train; retraining" in s for s in notes) == 4


def test_states_are_written_only_where_asked_and_reproduce_the_predictions(tmp_path, data):
    """No run writes state.pt by default; --save-states retrains a complete run that has none (the same
    predictions, byte for byte, on the CPU) and its state predicts exactly what the run stored."""
    plan, env = _plan(data), TrainEnv()
    first = run_plan(plan, data, tmp_path, env, note=lambda s: None)
    paths = [run_dir(tmp_path, data.name, r["method"], r["key_id"], r["seed"]) for r in first]
    assert all(is_complete(p) for p in paths) and not any((p / STATE).exists() for p in paths)
    before = {p: (p / PREDICTIONS).read_bytes() for p in paths}
    notes: list[str] = []
    again = run_plan(plan, data, tmp_path, env, note=notes.append, save_states={"walla-i"})
    assert [(r["method"], r["status"]) for r in again] == [("uniform", "skipped")] * 2 + [
        ("walla-i", "done")
    ] * 2
    assert sum("trained without its state; retraining to write state.pt" in n for n in notes) == 2
    assert [(p / STATE).exists() for p in paths] == [False, False, True, True]
    assert all((p / PREDICTIONS).read_bytes() == before[p] for p in paths)
    table = read_scenario_table(tmp_path, data.name, split="train")
    for path in paths[2:]:
        rec = read_run(path, table)
        out = method_module("walla-i").predict(
            load_checkpoint(path / STATE), data, data.split_index("train"), env
        )
        np.testing.assert_array_equal(rec.weights, out.weights.astype(np.float32))
        np.testing.assert_array_equal(rec.extras["wagers"], out.extras["wagers"].astype(np.float32))
    assert {
        r["status"] for r in run_plan(plan, data, tmp_path, env, note=notes.append, save_states={"walla-i"})
    } == {"skipped"}
    # a run redone without states loses its old state (it would not match the new predictions)
    run_plan(plan, data, tmp_path, env, note=lambda s: None, force=True)
    assert not any((p / STATE).exists() for p in paths)


def test_states_to_save_names_methods_and_families(data):
    plan = _plan(data)
    assert states_to_save(None, plan) == frozenset()
    assert states_to_save("all", plan) == {"uniform", "walla-i"}
    assert states_to_save("walla", plan) == states_to_save(" walla-i ", plan) == {"walla-i"}
    assert states_to_save("uniform,walla", plan) == {"uniform", "walla-i"}
    with pytest.raises(ValueError, match=r"--save-states 'walla-ii': not a method or family of this plan"):
        states_to_save("walla-ii", plan)
    with pytest.raises(ValueError, match="--save-states: empty list"):
        states_to_save(",", plan)


def test_one_writer_per_scenario(tmp_path, data):
    with runs_lock(tmp_path, data.name):
        with pytest.raises(RunsLockedError, match="another walla train is writing"):
            run_plan(_plan(data), data, tmp_path, TrainEnv(), note=lambda s: None)


def test_too_small_scenarios_are_refused_with_numbers(tmp_path, data):
    tiny = data.subset(np.concatenate([data.split_index("train")[:5], data.split_index("test")[:1]]))
    with pytest.raises(ValueError, match=r"5 train / 0 val / 1 test questions"):
        run_plan(_plan(data), tiny, tmp_path, TrainEnv(), note=lambda s: None)


def test_limit_rows_keeps_split_shares(data):
    small = data.limit_rows(30)
    assert small.name.endswith("-rows30") and 25 <= len(small.split) <= 30
    assert {s: len(small.split_index(s)) > 0 for s in ("train", "val", "test")} == dict.fromkeys(
        ("train", "val", "test"), True
    )


def test_cuda_runs_get_their_own_key_for_the_device_drawn_init():
    """Since init is drawn on the device, a CUDA run is keyed apart from earlier (host-init) CUDA runs; CPU
    keys do not change (the CPU init is the same values)."""
    cpu = run_key("inputs", "walla-i", {"lr": 1e-3}, precision="32-true", device="cpu")
    cuda = run_key("inputs", "walla-i", {"lr": 1e-3}, precision="32-true", device="cuda:1")
    assert "init_drawn_on" not in cpu and cuda["init_drawn_on"] == "cuda"
    before = {k: v for k, v in cuda.items() if k != "init_drawn_on"}  # the key CUDA runs had before
    assert key_id(cuda) != key_id(before)
    fields = {
        "schema",
        "scenario_inputs_id",
        "method",
        "config",
        "calibration",
        "precision",
        "device",
        "init",
    }
    assert set(cpu) == fields  # the fields CPU keys always had: their key ids stay
