"""The user's three commands through the real CLIs on a tiny random model (built here, no download):

    walla extract --model <dir> --dataset facts --size 60 --store S
    walla train --scenario homo --model <dir> --agents 3 --methods uniform,walla-i --seed-list 18,19 \
        --save-states walla-i
    walla eval --report R/tables.md --runs R

and the report's numbers checked against a direct computation from the run files.
"""

from __future__ import annotations

import re

import numpy as np
import polars as pl
import pytest
from tiny_model import tiny_model, tiny_tokenizer
from typer.testing import CliRunner
from walla.evaluate import cli as eval_cli
from walla.extract import cli as extract_cli
from walla.train import cli as train_cli

runner = CliRunner()


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e")
    tok = tiny_tokenizer()
    mdir = tmp / "tiny-llm"
    tiny_model(len(tok), seed=3).save_pretrained(mdir)
    tok.save_pretrained(mdir)
    store, runs = tmp / "store", tmp / "runs"
    res = runner.invoke(
        extract_cli.app,
        ["--model", str(mdir), "--dataset", "facts", "--size", "60", "--store", str(store), "--device", "cpu",
         "--dtype", "float32", "--variants", "none,relevant"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    res = runner.invoke(
        train_cli.app,
        ["--scenario", "homo", "--model", str(mdir), "--agents", "3", "--store", str(store), "--runs", str(runs),
         "--methods", "uniform,walla-i", "--seed-list", "18,19", "--set", "walla.epochs=2",
         "--set", "walla.projection_dim=null", "--set", "walla.hidden=[8]", "--save-states", "walla-i"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    report = runs / "tables.md"
    res = runner.invoke(eval_cli.app, ["--report", str(report), "--runs", str(runs), "--no-plots"])
    assert res.exit_code == 0, res.output
    return runs, report


def _cell(text: str, row: str, col: int) -> float:
    """The mean of a row's col-th metric cell in the first Markdown table that has the row."""
    for line in text.splitlines():
        if line.startswith(f"| {row} |"):
            return float(line.split("|")[col + 2].split("±")[0].strip().strip("*"))
    raise AssertionError(f"row {row!r} not in report")


def run_path(scenario, method: str, seed: int):
    """The one run directory of a method and seed (runs/<scenario>/<method>/<key-id>/seed=<s>)."""
    (path,) = (scenario / method).glob(f"*/seed={seed}")
    return path


def test_report_rows_match_run_files(pipeline):
    runs, report = pipeline
    (scenario,) = [p for p in runs.iterdir() if p.is_dir()]
    assert re.match(r"homo-facts-tiny-llm-[0-9a-f]{8}-x3$", scenario.name)
    text = report.read_text()
    header = next(line for line in text.splitlines() if line.startswith("| Method |"))
    acc_col = [c.strip() for c in header.split("|")[2:-1]].index("ACC ↑")
    table = pl.read_parquet(scenario / "scenario.parquet").filter(pl.col("split") == "test")
    label = table["label"].to_numpy()
    for method, row in (("uniform", "UniformAvg"), ("walla-i", "WALLA I")):
        accs = []
        for seed in (18, 19):
            pred = pl.read_parquet(run_path(scenario, method, seed) / "predictions.parquet")
            pred = pred.filter(pl.col("split") == "test")
            assert pred["question_id"].to_list() == table["question_id"].to_list()
            agg = np.asarray(pred["agg_probs"].to_list())
            accs.append((agg.argmax(1) == label).mean())
        assert _cell(text, row, acc_col) == pytest.approx(100 * np.mean(accs), abs=0.006)
    assert (run_path(scenario, "walla-i", 18) / "logs" / "metrics.csv").exists()
    assert (run_path(scenario, "walla-i", 18) / "state.pt").exists()  # --save-states walla-i
    assert not (run_path(scenario, "uniform", 18) / "state.pt").exists()


def test_rerun_skips_finished_runs(pipeline):
    runs, _ = pipeline
    (scenario,) = [p for p in runs.iterdir() if p.is_dir()]
    before = (run_path(scenario, "uniform", 18) / "run.json").stat().st_mtime_ns
    store = runs.parent / "store"
    res = runner.invoke(
        train_cli.app,
        ["--scenario", "homo", "--model", scenario.name.split("homo-facts-")[1].rsplit("-x3", 1)[0],
         "--agents", "3", "--store", str(store), "--runs", str(runs), "--methods", "uniform", "--seed-list", "18"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert (run_path(scenario, "uniform", 18) / "run.json").stat().st_mtime_ns == before
