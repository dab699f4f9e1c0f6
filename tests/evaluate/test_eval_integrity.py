"""walla eval on runs from other inputs, broken files and bad arguments (issue 12): never a silent mix,
every user error one line on stderr with exit != 0 and no traceback."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import walla.store.atomic
from eval_fixtures import LABEL, PROBS, SPLIT, write_run, write_scenario
from typer.testing import CliRunner
from walla.evaluate.cli import app

UNIFORM_W = np.full((6, 2), 0.5)


def make_runs(root: Path, name: str = "toy") -> Path:
    runs = root / "runs"
    write_scenario(runs, name, PROBS, LABEL, SPLIT, ["alpha", "beta"], ["uniform"], [1, 2])
    for seed in (1, 2):
        write_run(runs, name, "uniform", seed, UNIFORM_W, PROBS.mean(1), SPLIT)
    return runs


def run_path(runs: Path, method: str, seed: int, scenario: str = "toy") -> Path:
    """The one run directory of a method and seed (whatever its run key)."""
    (path,) = (runs / scenario / method).glob(f"*/seed={seed}")
    return path


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def _csv_cell(path: Path, row: str, metric: str) -> dict:
    rows = csv.DictReader(path.open())
    return next(r for r in rows if r["table"] == "main" and r["row"] == row and r["metric"] == metric)


def test_runs_from_other_inputs_are_never_counted(tmp_path):
    runs = make_runs(tmp_path)
    old_id = json.loads((runs / "toy" / "scenario.json").read_text())["inputs_id"]
    # the store was rebuilt (new feature-set fingerprints): the scenario is rewritten and seed 1 retrained;
    # the new seed-1 run pools agent 1 only, so its numbers differ from the old uniform runs
    fps = {"alpha/none": "a" * 16, "beta/none": "b" * 16}
    scen = write_scenario(
        runs, "toy", PROBS, LABEL, SPLIT, ["alpha", "beta"], ["uniform"], [1], fingerprints=fps
    )
    assert scen["inputs_id"] != old_id and scen["seeds"] == [1]
    new_w = np.tile([1.0, 0.0], (6, 1))
    write_run(runs, "toy", "uniform", 1, new_w, PROBS[:, 0], SPLIT)
    stale = json.loads((run_path(runs, "uniform", 2) / "run.json").read_text())
    assert stale["scenario_inputs_id"] == old_id  # the old run is still on disk

    out = invoke("--report", str(tmp_path / "o" / "t.md"), "--runs", str(runs), "--no-plots")
    assert out.exit_code == 0, out.output
    assert out.stderr.count("\n") == 1 and out.stderr.startswith(
        "walla eval: warning: 1 stale run(s) not counted"
    )
    acc = _csv_cell(tmp_path / "o" / "t.csv", "UniformAvg", "accuracy")
    assert acc["n_seeds"] == "1" and acc["ci"] == ""  # one seed: the current-input run only
    assert float(acc["mean"]) == pytest.approx(100 * np.mean(PROBS[1:, 0].argmax(1) == LABEL[1:]))
    md = (tmp_path / "o" / "t.md").read_text()
    assert "## Stale runs" in md and "toy/uniform/seed=2: stale:" in md
    assert "toy/uniform/seed=1: stale" not in md and "seeds: 1 ·" in md


def _corrupt_run_json(runs: Path) -> Path:
    (path := run_path(runs, "uniform", 2) / "run.json").write_text("{not json")
    return path


def _deleted_scenario_json(runs: Path) -> Path:
    make_runs(runs.parent, "other")
    (path := runs / "other" / "scenario.json").unlink()
    return path


def _corrupt_scenario_json(runs: Path) -> Path:
    (path := runs / "toy" / "scenario.json").write_text("{not json")
    return path


def _truncated_predictions(runs: Path) -> Path:
    path = run_path(runs, "uniform", 1) / "predictions.parquet"
    path.write_bytes(path.read_bytes()[:50])
    return path


def _predictions_without_columns(runs: Path) -> Path:
    pl.DataFrame({"x": [1]}).write_parquet(path := run_path(runs, "uniform", 1) / "predictions.parquet")
    return path


def _scenario_parquet_without_columns(runs: Path) -> Path:
    pl.DataFrame({"x": [1]}).write_parquet(path := runs / "toy" / "scenario.parquet")
    return path


@pytest.mark.parametrize(
    "corrupt",
    [
        _corrupt_run_json,
        _deleted_scenario_json,
        _corrupt_scenario_json,
        _truncated_predictions,
        _predictions_without_columns,
        _scenario_parquet_without_columns,
    ],
)
def test_broken_file_is_one_line_naming_it(tmp_path, corrupt):
    runs = make_runs(tmp_path)
    path = corrupt(runs)
    out = invoke("--report", str(tmp_path / "t.md"), "--runs", str(runs), "--no-plots")
    assert out.exit_code == 1 and isinstance(out.exception, SystemExit)
    assert (
        out.stderr.count("\n") == 1
        and out.stderr.startswith("walla eval: error: ")
        and str(path) in out.stderr
    )
    assert "Traceback" not in out.output


def test_broken_run_still_reports_the_others(tmp_path):
    runs = make_runs(tmp_path)
    _corrupt_run_json(runs)
    out = invoke("--report", str(tmp_path / "t.md"), "--runs", str(runs), "--no-plots")
    assert out.exit_code == 1 and "1 unreadable run(s) not counted" in out.stderr
    assert _csv_cell(tmp_path / "t.csv", "UniformAvg", "accuracy")["n_seeds"] == "1"


def _read_only(monkeypatch, tmp_path: Path) -> Path:
    """A report directory nothing may be written into (root ignores chmod: the rename is refused)."""
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)

    def refuse(src, dst):
        raise PermissionError(13, "Permission denied", str(src))

    monkeypatch.setattr(walla.store.atomic, "replace", refuse)
    return d / "t.md"


def _under_a_file(monkeypatch, tmp_path: Path) -> Path:
    (tmp_path / "afile").write_text("x")
    return tmp_path / "afile" / "t.md"


@pytest.mark.parametrize("where", [_read_only, _under_a_file])
@pytest.mark.parametrize("plots", [True, False])
def test_unwritable_report_is_one_line(tmp_path, monkeypatch, where, plots):
    runs = make_runs(tmp_path)
    report = where(monkeypatch, tmp_path)
    out = invoke("--report", str(report), "--runs", str(runs), *([] if plots else ["--no-plots"]))
    assert out.exit_code == 1 and isinstance(out.exception, SystemExit), out.output
    assert out.stderr.count("\n") == 1 and out.stderr.startswith(
        f"walla eval: error: cannot write {report.parent}/"
    )
    if report.parent.is_dir():
        assert not list(report.parent.glob("*.tmp"))  # no temp file left behind


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_read_only_directory_without_interposing(tmp_path):
    runs = make_runs(tmp_path)
    (d := tmp_path / "ro").mkdir()
    d.chmod(0o555)
    out = invoke("--report", str(d / "t.md"), "--runs", str(runs), "--no-plots")
    assert out.exit_code == 1 and out.stderr.startswith(f"walla eval: error: cannot write {d}/")


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (["--report", "t.md", "--runs", "nope"], 1, "runs directory nope does not exist"),
        (["--report", "t.txt"], 2, "expected a .md path"),
        (
            ["--report", "t.md", "--scenario", "other"],
            2,
            "no such scenario 'other' (trained under runs: toy)",
        ),
    ],
)
def test_bad_arguments_are_one_line(tmp_path, monkeypatch, args, code, says):
    make_runs(tmp_path)
    monkeypatch.chdir(tmp_path)
    out = invoke(*args)
    assert out.exit_code == code and isinstance(out.exception, SystemExit)
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("walla eval: error: ") and says in out.stderr


def test_report_alone_reports_every_scenario_under_runs(tmp_path, monkeypatch):
    make_runs(tmp_path, "toy")
    make_runs(tmp_path, "other")
    monkeypatch.chdir(tmp_path)
    out = invoke("--report", "tables.md", "--no-plots")
    assert out.exit_code == 0, out.output
    md = (tmp_path / "tables.md").read_text()
    assert "## Scenario `other`" in md and "## Scenario `toy`" in md and out.stderr == ""
