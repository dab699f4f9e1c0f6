"""`walla train` CLI: a run on a synthetic scenario, --show-plan, and one clear error line for mistakes."""

from __future__ import annotations

import pytest
import yaml
from synthetic import synthetic_scenario_file
from typer.testing import CliRunner
from walla.train import cli

runner = CliRunner()
SCENARIO = """\
# For: walla-train --scenario synth.yaml
description: synthetic
scenario: {dataset: facts, agents: [smollm2-135m, smollm2-135m, smollm2-135m], context_rule: one_relevant}
train:
  methods: [uniform, walla-i]
  seeds: [18, 19, 20]
  hparams: {walla: {lr: 1.0e-3, epochs: 1, hidden: [8], projection_dim: null, batch_size: 25}}
"""


@pytest.fixture
def synth(tmp_path, monkeypatch):
    """A scenario file and a synthetic assembled scenario (the CLI and plan logic stay real)."""
    return synthetic_scenario_file(tmp_path, monkeypatch, SCENARIO)


def _run(tmp_path, *args: str):
    return runner.invoke(
        cli.app, ["--store", str(tmp_path / "store"), "--runs", str(tmp_path / "runs"), *args]
    )


def test_train_writes_runs_and_prints_summary(tmp_path, synth):
    res = _run(tmp_path, "--scenario", str(synth), "--seeds", "2")
    assert res.exit_code == 0, res.output
    assert "WALLA I" in res.output and "UniformAvg" in res.output and "Brier" in res.output
    (key,) = (tmp_path / "runs" / "synth" / "walla-i").iterdir()  # one run key: <method>/<key-id>/
    assert sorted(p.name for p in key.iterdir()) == ["key.json", "seed=18", "seed=19"]


def test_show_plan_prints_the_resolved_plan(tmp_path, synth):
    res = _run(tmp_path, "--scenario", str(synth), "--show-plan", "--set", "walla.epochs=3")
    assert res.exit_code == 0, res.output
    plan = yaml.safe_load(res.output)
    assert plan["seeds"] == [18, 19, 20] and plan["methods"]["walla-i"]["config"]["epochs"] == 3
    assert plan["methods"]["walla-i"]["config"]["temperature"] == 2.0  # every key, defaults included
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--methods", "wala-i"], "no such method 'wala-i'; did you mean --methods walla-i (a method)"),
        (["--seeds", "0"], "--seeds must be >= 1"),
        (["--seed-list", "18,x"], "--seed-list: expected comma-separated integers, got '18,x'"),
        (["--set", "walla.lr=fast"], "walla-i.lr: Input should be a valid number"),
        (["--set", "lr=1"], "expected METHOD_OR_FAMILY.KEY=VALUE"),
        (["--save-states", "walla-ii"], "--save-states 'walla-ii': not a method or family of this plan"),
        (["--device", "cuda:7"], "cuda"),
        (["--device", "tpu"], "tpu"),
        (["--logger", "tensorboard"], "pip install tensorboard"),
        (["--logger", "mlflow"], "--logger must be one of csv, tensorboard, wandb"),
        (["--limit-rows", "2"], "--limit-rows must be >= 3"),
    ],
)
def test_user_errors_are_one_line_exit_2(tmp_path, synth, args, message):
    res = _run(tmp_path, "--scenario", str(synth), *args)
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output
    assert len([ln for ln in res.output.splitlines() if ln.strip()]) == 1, res.output


def test_unknown_scenario_and_missing_store(tmp_path):
    res = _run(tmp_path, "--scenario", "demo-hetero-fact")
    assert (
        res.exit_code == 2 and "did you mean --scenario demo-hetero-facts (a scenario manifest)" in res.output
    )
    res = _run(
        tmp_path, "--scenario", "demo-hetero-facts"
    )  # the command is right, the store is missing: data
    assert res.exit_code == 1 and "store" in res.output and "does not exist" in res.output
    assert "walla extract" in res.output


def test_main_is_the_console_entry_point():
    from importlib.metadata import entry_points

    (ep,) = [e for e in entry_points(group="console_scripts") if e.name == "walla-train"]
    assert ep.value == "walla.cli.main:walla_train"


@pytest.mark.parametrize(
    ("installed", "message"),
    [
        ((), "--logger wandb needs the packages 'wandb', 'lightning': pip install wandb lightning"),
        (("wandb",), "--logger wandb needs the package 'lightning': pip install lightning"),
        (("lightning",), "--logger wandb needs the package 'wandb': pip install wandb"),
        (("wandb", "lightning"), None),
        (("tensorboardX",), None),
    ],
)
def test_logger_names_every_missing_package(monkeypatch, installed, message):
    """W&B's logger is the full `lightning` package's (walla depends on Fabric alone): both are named."""
    import importlib.util
    import re

    from walla.train import loggers

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name in installed else None)
    kind = "tensorboard" if "tensorboardX" in installed else "wandb"
    if message is None:
        loggers.check_logger(kind)
    else:
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            loggers.check_logger(kind)
