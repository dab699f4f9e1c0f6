"""Run identity through the real CLIs (issue 20, findings 1 and 2): seeds trained with another config or
precision are never averaged with the first ones; walla eval shows them as separate rows labelled by
the keys that differ, and rerunning the same command retrains nothing."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from synthetic import make_private_context_scenario, synthetic_scenario_file, with_agents
from typer.testing import CliRunner
from walla.evaluate import cli as eval_cli
from walla.train import cli as train_cli
from walla.train import run as train_run

runner = CliRunner()
SCENARIO = """\
# For: walla train --scenario synth.yaml
description: synthetic
scenario: {dataset: facts, agents: [smollm2-135m, smollm2-135m, smollm2-135m], context_rule: one_relevant}
train:
  methods: [uniform, walla-i]
  seeds: [18, 19, 20, 21, 22]
  hparams: {walla: {lr: 1.0e-3, epochs: 1, hidden: [8], projection_dim: null, batch_size: 25}}
"""


@pytest.fixture
def synth(tmp_path, monkeypatch):
    """A scenario file and a synthetic assembled scenario (the CLI, plan, runs and report stay real)."""
    return synthetic_scenario_file(tmp_path, monkeypatch, SCENARIO)


def train(tmp_path: Path, synth: Path, *args: str):
    argv = ["--scenario", str(synth), "--store", str(tmp_path / "store"), "--runs", str(tmp_path / "runs")]
    res = runner.invoke(train_cli.app, [*argv, *args])
    assert res.exit_code == 0, res.output
    return res


def report(tmp_path: Path) -> dict[str, dict[str, str]]:
    """walla eval on the runs: row label -> the main table's accuracy cell (csv row)."""
    out = runner.invoke(
        eval_cli.app,
        ["--report", str(tmp_path / "o" / "t.md"), "--runs", str(tmp_path / "runs"), "--no-plots"],
    )
    assert out.exit_code == 0, out.output
    rows = csv.DictReader((tmp_path / "o" / "t.csv").open())
    return {r["row"]: r for r in rows if r["table"] == "main" and r["metric"] == "accuracy"}


def test_acc(tmp_path: Path, method: str) -> dict[float, list[float]]:
    """lr -> test accuracies of every complete run of `method`, read from the run files."""
    out: dict[float, list[float]] = {}
    for path in sorted((tmp_path / "runs" / "synth" / method).rglob("run.json")):
        meta = json.loads(path.read_text())
        out.setdefault(meta["config"]["lr"], []).append(meta["test_acc"])
    return out


test_acc.__test__ = False  # a helper, not a test


def written(tmp_path: Path) -> dict[str, int]:
    """run.json path -> its modification time (ns), for every run of the scenario."""
    return {str(p): p.stat().st_mtime_ns for p in (tmp_path / "runs" / "synth").rglob("run.json")}


def test_another_lr_is_a_row_of_its_own(tmp_path, synth):
    train(tmp_path, synth, "--seeds", "5")
    before = written(tmp_path)
    assert len(before) == 10  # uniform and walla-i, 5 seeds each
    train(tmp_path, synth, "--seeds", "5")  # the same command: every run is kept, none rewritten
    assert written(tmp_path) == before
    res = train(tmp_path, synth, "--seed-list", "18", "--set", "walla.lr=3e-3")
    assert "walla-i: run key" in res.output and "1 other key(s) beside it" in res.output
    assert {p: w for p, w in written(tmp_path).items() if p in before} == before  # beside, not over
    accs = test_acc(tmp_path, "walla-i")
    assert {lr: len(a) for lr, a in accs.items()} == {1e-3: 5, 3e-3: 1}  # beside, not over the first
    rows = report(tmp_path)
    assert "WALLA I" not in rows  # never one row over both configurations
    a, b = rows["WALLA I (lr=0.001)"], rows["WALLA I (lr=0.003)"]
    assert (a["n_seeds"], b["n_seeds"]) == ("5", "1")
    assert float(a["mean"]) == pytest.approx(100 * np.mean(accs[1e-3]), abs=1e-9)
    assert float(b["mean"]) == pytest.approx(100 * accs[3e-3][0], abs=1e-9)
    assert rows["UniformAvg"]["n_seeds"] == "5"  # uniform did not change: one row, five seeds
    labels = list(rows)
    assert (
        labels.index("UniformAvg") < labels.index("WALLA I (lr=0.001)") < labels.index("WALLA I (lr=0.003)")
    )


def test_another_precision_is_a_row_of_its_own(tmp_path, synth):
    train(tmp_path, synth, "--seeds", "5", "--precision", "32-true")
    before = written(tmp_path)
    train(tmp_path, synth, "--seed-list", "18", "--precision", "bf16-mixed")
    after = written(tmp_path)
    assert {p: w for p, w in after.items() if p in before} == before
    (new,) = set(after) - set(before)  # one new walla-i run; uniform never uses the precision: kept
    assert "/walla-i/" in new and json.loads(Path(new).read_text())["precision"] == "bf16-mixed"
    rows = report(tmp_path)
    assert "WALLA I" not in rows
    full, bf16 = rows["WALLA I (precision=32-true)"], rows["WALLA I (precision=bf16-mixed)"]
    assert (full["n_seeds"], bf16["n_seeds"]) == ("5", "1")
    assert rows["UniformAvg"]["n_seeds"] == "5"  # nothing of it depends on the precision


@pytest.fixture
def joinable(tmp_path, monkeypatch):
    """synth.yaml (3 agents) whose assembly gives the first len(agents) slots of one 4-agent synthetic
    scenario, so `--add-agent gemma3-270m` assembles the base's 3 agents plus a fourth."""
    full = make_private_context_scenario(n=100, m=4, k=2, h=6, seed=2, name="synth")
    path = synthetic_scenario_file(tmp_path, monkeypatch, SCENARIO)
    monkeypatch.setattr(
        train_run,
        "assemble_scenario",
        lambda sc, store: with_agents(full, list(range(len(sc.spec.agents))), sc.spec.name),
    )
    return path


def test_joining_seeds_of_different_base_keys_stops_naming_both(tmp_path, joinable):
    """Finding 1 (issue 28): base seed 18 at lr 5e-4 and seed 19 at lr 0.05, then both seeds joined at lr
    5e-4. The old walla train continued seed 19 from the lr-0.05 heads under one joined key: ONE `WALLA I`
    row averaging seeds continued from differently trained heads. Now the join stops with one line naming
    both base keys; trained properly, joins of different base keys are rows of their own."""
    walla = ("--methods", "walla-i", "--save-states", "walla-i")
    train(tmp_path, joinable, *walla, "--seed-list", "18", "--set", "walla.lr=5e-4")
    train(tmp_path, joinable, *walla, "--seed-list", "19", "--set", "walla.lr=0.05")
    keys = {lr: kid for lr, kid in base_keys(tmp_path).items()}
    assert set(keys) == {5e-4, 0.05}
    join = ("--add-agent", "gemma3-270m", "--seed-list", "18,19")
    argv = ["--scenario", str(joinable), "--store", str(tmp_path / "store"), "--runs", str(tmp_path / "runs")]
    res = runner.invoke(train_cli.app, [*argv, *walla, *join, "--set", "walla.lr=5e-4"])
    assert res.exit_code == 1, res.output  # the runs on disk are not what the join needs: data (cli/exits.py)
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in res.output, res.output
    assert f"no base run of key {keys[5e-4]}" in lines[0] and "seed 19" in lines[0]
    assert f"seed 19 is trained only under key {keys[0.05]}: config.lr 0.05 (not 0.0005)" in lines[0]
    assert not (tmp_path / "runs" / "synth+gemma3-270m" / "walla-i").exists()  # nothing trained
    # seed 19 of the lr-5e-4 key trained too: both seeds continue that key, one row of two seeds ...
    train(tmp_path, joinable, *walla, "--seed-list", "19", "--set", "walla.lr=5e-4")
    train(tmp_path, joinable, *walla, *join, "--set", "walla.lr=5e-4")
    # ... and seed 19 joined at lr 0.05 continues the lr-0.05 base key: another key, another row
    train(
        tmp_path,
        joinable,
        *walla,
        "--add-agent",
        "gemma3-270m",
        "--seed-list",
        "19",
        "--set",
        "walla.lr=0.05",
    )
    joined = {}
    for path in (tmp_path / "runs" / "synth+gemma3-270m" / "walla-i").rglob("run.json"):
        meta = json.loads(path.read_text())
        assert meta["run_key"]["init"] == meta["initialized"]
        joined.setdefault(meta["initialized"]["base_key_id"], []).append(meta["seed"])
    assert {k: sorted(v) for k, v in joined.items()} == {keys[5e-4]: [18, 19], keys[0.05]: [19]}
    rows = {r: v for r, v in report(tmp_path).items() if v["scenario"] == "synth+gemma3-270m"}
    assert "WALLA I" not in rows  # never one row over both bases
    assert rows["WALLA I (lr=0.0005, init.base_key_id=" + keys[5e-4] + ")"]["n_seeds"] == "2"
    assert rows["WALLA I (lr=0.05, init.base_key_id=" + keys[0.05] + ")"]["n_seeds"] == "1"


def base_keys(tmp_path: Path) -> dict[float, str]:
    """lr -> key id of the base scenario's walla-i runs."""
    out = {}
    for path in (tmp_path / "runs" / "synth" / "walla-i").rglob("run.json"):
        meta = json.loads(path.read_text())
        out[meta["config"]["lr"]] = meta["key_id"]
    return out
