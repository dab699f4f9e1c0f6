"""walla eval and run keys (issue 20): seeds of different run keys are never averaged -- each key is a row
labelled by the fields that differ -- and runs without a current key are stale, never mixed."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from eval_fixtures import LABEL, PROBS, SPLIT, write_run, write_scenario
from walla.evaluate.load import load_scenario_runs
from walla.evaluate.report import EvalConfig, run
from walla.train.methods import MethodOutput
from walla.train.runs import RUN_META, TRAIN_SCHEMA, scenario_dir
from walla.train.runs import write_run as train_write_run

UNIFORM = np.full((6, 2), 0.5)
ALPHA = np.tile([1.0, 0.0], (6, 1))  # every weight on agent alpha: ACC 60 on the test rows


def scenario(tmp_path: Path, methods=("uniform", "walla-i"), seeds=(18, 19, 20)) -> Path:
    runs = tmp_path / "runs"
    write_scenario(runs, "toy", PROBS, LABEL, SPLIT, ["alpha", "beta"], list(methods), list(seeds))
    return runs


def walla(runs: Path, seed: int, weights: np.ndarray, planned=None, **config) -> Path:
    agg = np.einsum("nm,nmk->nk", weights, PROBS)
    meta = {"config": config}
    return write_run(runs, "toy", "walla-i", seed, weights, agg, SPLIT, run_meta=meta, planned=planned)


def acc(rows: dict, label: str) -> list[float]:
    """Test accuracy of every seed of a row."""
    return [float((r.agg_probs.argmax(1) == LABEL[1:]).mean()) for r in rows[label].values()]


def test_two_configs_are_two_labelled_rows_in_method_order(tmp_path):
    runs = scenario(tmp_path)
    for seed in (18, 19, 20):
        write_run(runs, "toy", "uniform", seed, UNIFORM, PROBS.mean(1), SPLIT)
        walla(runs, seed, UNIFORM, lr=1e-3, epochs=2)
    b = walla(runs, 18, ALPHA, [18], lr=3e-3, epochs=2)  # another lr (--seed-list 18), beside the first
    data = load_scenario_runs(runs, "toy")
    assert not data.problems
    assert list(data.runs) == ["uniform", "walla-i", f"walla-i@{b.parent.name}"]
    first, second = data.runs["walla-i"], data.runs[f"walla-i@{b.parent.name}"]
    assert sorted(first) == [18, 19, 20] and sorted(second) == [18]
    assert {r.display for r in first.values()} == {"WALLA I (lr=0.001)"}
    assert second[18].display == "WALLA I (lr=0.003)" and data.runs["uniform"][18].display == "UniformAvg"
    assert acc(data.runs, f"walla-i@{b.parent.name}") == [0.6] and acc(data.runs, "walla-i") == [0.8] * 3
    result = run(EvalConfig(report=tmp_path / "r.md", runs=runs, plots=False))
    md = (tmp_path / "r.md").read_text()
    assert "| WALLA I |" not in md and not result.problems  # never one mean over both (that would be 75.00)
    rows = csv.DictReader((tmp_path / "r.csv").open())
    accuracy = {r["row"]: r for r in rows if r["table"] == "main" and r["metric"] == "accuracy"}
    assert float(accuracy["WALLA I (lr=0.001)"]["mean"]) == pytest.approx(80.0)
    assert float(accuracy["WALLA I (lr=0.003)"]["mean"]) == pytest.approx(60.0)
    assert [accuracy[r]["n_seeds"] for r in ("WALLA I (lr=0.001)", "WALLA I (lr=0.003)")] == ["3", "1"]


def test_labels_name_every_differing_field_inside_the_display(tmp_path):
    runs = scenario(tmp_path, methods=("walla-i",), seeds=(18,))
    walla(runs, 18, UNIFORM, lr=1e-3, hidden=[8], calibration={"lr": 1e-4})
    walla(runs, 18, UNIFORM, lr=1e-3, hidden=[16], calibration={"lr": 1e-5}, window=None)

    for path in (runs / "toy" / "walla-i").glob("*/seed=18/run.json"):  # as walla-i-log records it
        meta = json.loads(path.read_text())
        path.write_text(json.dumps({**meta, "display_name": "WALLA I (log pool)"}))
    labels = [next(iter(r.values())).display for r in load_scenario_runs(runs, "toy").runs.values()]
    assert sorted(labels) == [
        "WALLA I (log pool, config.calibration.lr=0.0001, hidden=[8], window=–)",
        "WALLA I (log pool, config.calibration.lr=1e-05, hidden=[16], window=null)",
    ]


def _legacy(runs: Path, seed: int) -> Path:
    """A run in the layout before run keys: runs/toy/uniform/seed=<s>/ without run_key."""
    scen = json.loads((scenario_dir(runs, "toy") / "scenario.json").read_text())
    path = runs / "toy" / "uniform" / f"seed={seed}"
    meta = {"method": "uniform", "seed": seed, "scenario_inputs_id": scen["inputs_id"]}
    qids = [f"q{i}" for i in range(6)]
    out = MethodOutput(UNIFORM.astype(np.float32), PROBS.mean(1).astype(np.float32))
    return train_write_run(path, qids, SPLIT, out, meta)


def _no_key(runs: Path, seed: int) -> Path:
    path = write_run(runs, "toy", "uniform", seed, UNIFORM, PROBS.mean(1), SPLIT)
    meta = json.loads((path / RUN_META).read_text())
    del meta["run_key"]
    (path / RUN_META).write_text(json.dumps(meta))
    return path


def _old_schema(runs: Path, seed: int) -> Path:
    path = write_run(runs, "toy", "uniform", seed, UNIFORM, PROBS.mean(1), SPLIT)
    meta = json.loads((path / RUN_META).read_text())
    meta["run_key"]["schema"] = TRAIN_SCHEMA - 1
    (path / RUN_META).write_text(json.dumps(meta))
    return path


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (_legacy, "written by a walla train without run keys"),
        (_no_key, "run.json has no run key"),
        (_old_schema, f"trained by walla train schema {TRAIN_SCHEMA - 1}, this one is {TRAIN_SCHEMA}"),
    ],
)
def test_runs_without_a_current_key_are_stale_never_mixed(tmp_path, damage, says):
    runs = scenario(tmp_path, methods=("uniform",), seeds=(18, 19))
    write_run(runs, "toy", "uniform", 18, UNIFORM, PROBS.mean(1), SPLIT)
    write_run(runs, "toy", "uniform", 19, UNIFORM, PROBS.mean(1), SPLIT)
    path = damage(runs, 7)
    data = load_scenario_runs(runs, "toy")
    (problem,) = data.problems
    assert (
        (problem.kind, problem.seed) == ("stale", 7)
        and says in problem.detail
        and str(path) in problem.detail
    )
    assert list(data.runs) == ["uniform"] and sorted(data.runs["uniform"]) == [18, 19]


def test_a_key_that_is_not_its_directory_is_unreadable(tmp_path):
    runs = scenario(tmp_path, methods=("walla-i",), seeds=(18,))
    path = walla(runs, 18, UNIFORM, lr=1e-3)
    meta = json.loads((path / RUN_META).read_text())
    meta["run_key"]["config"]["lr"] = 1.0  # edited by hand: the directory says another config
    (path / RUN_META).write_text(json.dumps(meta))
    (problem,) = load_scenario_runs(runs, "toy").problems
    assert problem.kind == "unreadable" and "is not the one of directory walla-i/" in problem.detail


def test_missing_seeds_are_those_planned_for_each_key(tmp_path):
    runs = scenario(tmp_path, methods=("uniform", "walla-i", "stacked-gen"), seeds=(18, 19))
    write_run(runs, "toy", "uniform", 18, UNIFORM, PROBS.mean(1), SPLIT)  # key.json plans 18, 19
    walla(runs, 18, UNIFORM, lr=1e-3)
    walla(runs, 19, UNIFORM, lr=1e-3)
    data = load_scenario_runs(runs, "toy")
    got = sorted((p.kind, p.method, p.seed) for p in data.problems)
    assert got == [
        ("missing", "stacked-gen", 18),
        ("missing", "stacked-gen", 19),
        ("missing", "uniform", 19),
    ]
