"""`walla-train` CLI: a run on a synthetic scenario, and one clear error line for user mistakes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from synthetic import make_private_context_scenario
from typer.testing import CliRunner
from walla.train import cli
from walla.train.runs import list_runs

runner = CliRunner()


@pytest.fixture
def synthetic_store(monkeypatch):
    """Substitute manifest + store with a synthetic scenario (the CLI logic stays real)."""
    data = make_private_context_scenario(n=100, m=3, k=2, h=6, seed=2, name="synth-cli")
    entry = SimpleNamespace(
        name="synth-cli",
        methods=["uniform", "walla-i"],
        seeds=[18, 19, 20],
        calibrated=False,
        hparams={"walla-i": {"variant": "I", "lr": 1e-3, "epochs": 1, "hidden": [8]}},
    )
    monkeypatch.setattr(cli, "load_entry", lambda name: entry)
    monkeypatch.setattr(cli, "load_data", lambda e, store: data)
    return data


def _run(*args: str):
    return runner.invoke(cli.app, list(args))


def test_train_writes_runs_and_prints_summary(tmp_path, synthetic_store):
    res = _run("--scenario", "synth-cli", "--runs", str(tmp_path), "--seeds", "2")
    assert res.exit_code == 0, res.output
    assert "WALLA I" in res.output and "UniformAvg" in res.output and "Brier" in res.output
    refs = list_runs(tmp_path, "synth-cli")
    assert sorted((r.method, r.seed) for r in refs) == [
        ("uniform", 18),
        ("uniform", 19),
        ("walla-i", 18),
        ("walla-i", 19),
    ]
    res = _run(
        "--scenario", "synth-cli", "--runs", str(tmp_path), "--seed-list", "19,20", "--methods", "walla-i"
    )
    assert res.exit_code == 0, res.output
    assert len(list_runs(tmp_path, "synth-cli")) == 5  # 19 skipped, 20 new


@pytest.mark.parametrize(
    "args, message",
    [
        (["--methods", "walla-iii"], "unknown method 'walla-iii'. Did you mean walla-ii"),
        (["--seeds", "2", "--seed-list", "18"], "either --seeds N or --seed-list"),
        (["--seed-list", "a,b"], "--seed-list: expected comma-separated integers"),
        (["--seed-list", "18,18"], "seeds must be distinct"),
        (["--device", "tpu"], "device must be cpu | cuda"),
    ],
)
def test_user_errors_are_one_line_exit_2(tmp_path, synthetic_store, args, message):
    res = _run("--scenario", "synth-cli", "--runs", str(tmp_path), *args)
    assert res.exit_code == 2
    assert message in " ".join(res.output.split())
    assert "Traceback" not in res.output


def test_unknown_scenario_suggests_close_match(tmp_path):
    res = _run("--scenario", "demo-hetero-factz", "--runs", str(tmp_path))
    assert res.exit_code == 2
    out = " ".join(res.output.split())
    assert "no such scenario 'demo-hetero-factz'" in out and "did you mean 'demo-hetero-facts'" in out


def test_missing_feature_sets_name_the_extract_command(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    res = _run("--scenario", "demo-hetero-facts", "--store", str(store), "--runs", str(tmp_path / "runs"))
    assert res.exit_code == 2
    assert "extract" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "runs").exists()


def test_main_is_the_console_entry_point():
    assert callable(cli.main)
