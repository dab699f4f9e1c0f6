"""`walla train --scenario hetero|homo|hetero-context` says which preset it resolved and why, and
`--preset demo|paper` overrides it (issue 20, finding 5)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from typer.testing import CliRunner
from walla.extract.cli import app as extract_app
from walla.train import cli as train_cli
from walla.train.kinds import _presets

runner = CliRunner()
MODELS = ("smollm2-135m", "gemma3-270m")  # embedded package models, extracted with the dummy backend


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    store = tmp_path_factory.mktemp("presets") / "store"
    for model in MODELS:
        argv = ["--model", model, "--store", str(store), "--backend", "dummy", "--variants", "none,relevant"]
        res = runner.invoke(extract_app, [*argv, "--no-progress", "--dataset", "facts", "--size", "30"])
        assert res.exit_code == 0, res.output
    return store


def show_plan(store: Path, *args: str) -> tuple[str, dict]:
    res = runner.invoke(
        train_cli.app,
        ["--scenario", "hetero", "--store", str(store), "--show-plan", "--methods", "walla-i", *args],
    )
    assert res.exit_code == 0, res.output
    return res.output.splitlines()[0], yaml.safe_load(res.output)


def test_show_plan_names_the_preset_and_paper_changes_it(store):
    line, plan = show_plan(store)
    assert line == (
        "# preset: demo (every agent is an embedded model; --preset paper for the paper's settings): "
        "manifests/scenarios/_base.yaml + _demo.yaml"
    )
    assert plan["methods"]["walla-i"]["config"]["lr"] == 5e-4  # _demo.yaml
    line, plan = show_plan(store, "--preset", "paper")
    assert line == "# preset: paper hetero (--preset paper): manifests/scenarios/_base.yaml + _hetero.yaml"
    walla = plan["methods"]["walla-i"]["config"]
    assert (walla["lr"], walla["epochs"]) == (5e-7, 50)  # _hetero.yaml, the paper's constants
    assert show_plan(store, "--preset", "demo")[1] == show_plan(store)[1]


def test_training_prints_the_preset_line(store, tmp_path):
    argv = [
        "--scenario",
        "hetero",
        "--store",
        str(store),
        "--runs",
        str(tmp_path / "runs"),
        "--methods",
        "uniform",
    ]
    res = runner.invoke(train_cli.app, [*argv, "--seed-list", "18"])
    assert res.exit_code == 0, res.output
    assert "preset: demo (every agent is an embedded model;" in res.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scenario", "hetero", "--preset", "fast"], "--preset 'fast': expected one of demo, paper"),
        (
            ["--scenario", "demo-hetero-facts", "--preset", "paper"],
            "--preset is for --scenario hetero | homo",
        ),
    ],
)
def test_bad_preset_is_one_line(store, args, message):
    res = runner.invoke(train_cli.app, [*args, "--store", str(store), "--show-plan"])
    assert res.exit_code == 2 and message in res.output, res.output
    assert len([ln for ln in res.output.splitlines() if ln.strip()]) == 1


def test_preset_reason_names_the_agents_that_are_not_embedded():
    table = {"smollm2-135m": SimpleNamespace(source="package"), "qwen": SimpleNamespace(source="hub")}
    files, line = _presets("hetero", "mmlu", ("smollm2-135m", "qwen", "x.gguf"), table)
    assert files == ["_base.yaml", "_hetero.yaml"]
    assert line.startswith("preset: paper hetero (qwen, x.gguf are not embedded models; --preset demo")
    files, line = _presets("homo", "bayesx", ("smollm2-135m",) * 3, table, "paper")
    assert files == ["_base.yaml", "_bayesx.yaml"] and line.startswith(
        "preset: paper bayesx (--preset paper)"
    )
    assert _presets("homo", "pubmedqa", ("qwen",) * 2, table)[0] == ["_base.yaml", "_homo_pubmedqa.yaml"]
