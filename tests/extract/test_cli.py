"""`walla extract` command line: one-line errors and exit codes."""

from __future__ import annotations

import time

from typer.testing import CliRunner
from walla.extract.cli import app

runner = CliRunner()


def test_unknown_model_exits_2_with_close_matches(tmp_path):
    r = runner.invoke(app, ["--model", "smolm2", "--dataset", "facts", "--store", str(tmp_path)])
    assert r.exit_code == 2
    assert "no such model 'smolm2'; did you mean --model smollm2-135m (a model)?" in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_offline_hub_model_and_dataset_fail_fast_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # deterministic: never touch the network from a test
    t0 = time.perf_counter()
    r = runner.invoke(app, ["--model", "aloe", "--dataset", "medmcqa", "--store", str(tmp_path)])
    assert time.perf_counter() - t0 < 30
    assert r.exit_code == 3
    lines = r.output.strip().splitlines()
    assert len(lines) == 1, r.output
    assert "HPAI-BSC/Llama3-Aloe-8B-Alpha" in lines[0] and "openlifescienceai/medmcqa" in lines[0]
    assert "--data-file" in lines[0] and "smollm2-135m" in lines[0] and "HF_HUB_OFFLINE" in lines[0]


def test_bad_option_and_bad_data_are_one_line(tmp_path):
    r = runner.invoke(app, ["--model", "smollm2-135m", "--dataset", "facts", "--variants", "none,wrong"])
    assert r.exit_code == 2 and "variants must be a non-empty subset" in r.output
    bad = tmp_path / "arc.jsonl"
    bad.write_text('{"id": "x", "question": {"stem": "s", "choices": []}, "answerKey": "A"}\n')
    r = runner.invoke(
        app,
        [
            "--model",
            "smollm2-135m",
            "--dataset",
            "arc-challenge",
            "--backend",
            "dummy",
            "--data-file",
            str(bad),
            "--store",
            str(tmp_path / "s"),
        ],
    )
    assert r.exit_code == 1 and "arc.jsonl, line 1: field 'choices' is empty" in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_dummy_run_prints_paths(tmp_path):
    r = runner.invoke(
        app,
        [
            "--model",
            "smollm2-135m",
            "--dataset",
            "bayesx",
            "--backend",
            "dummy",
            "--size",
            "40",
            "--variants",
            "none",
            "--store",
            str(tmp_path),
            "--no-progress",
        ],
    )
    assert r.exit_code == 0, r.output
    assert (
        "questions: 34 rows" in r.output
    )  # balanced_binary drops the surplus class and "wrote smollm2-135m/bayesx/none" in r.output
    r2 = runner.invoke(
        app,
        [
            "--model",
            "smollm2-135m",
            "--dataset",
            "bayesx",
            "--backend",
            "dummy",
            "--size",
            "40",
            "--variants",
            "none",
            "--store",
            str(tmp_path),
            "--no-progress",
        ],
    )
    assert "already complete: " in r2.output


def test_size_and_batching_options_take_auto_or_a_number(tmp_path):
    base = ["--model", "smollm2-135m", "--dataset", "facts", "--store", str(tmp_path)]
    r = runner.invoke(app, [*base, "--batch-tokens", "lots"])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1
    assert "--batch-tokens: Input should be a valid integer" in r.output
    r = runner.invoke(app, [*base, "--shard-rows", "0"])
    assert r.exit_code == 2 and "shard_rows must be >= 1, got 0" in r.output
    r = runner.invoke(app, [*base, "--backend", "hf", "--backend-arg", "batch_invariant=maybe"])
    assert r.exit_code == 2 and "batch_invariant must be auto, on, off or fixed, got 'maybe'" in r.output
    assert len(r.output.strip().splitlines()) == 1
    r = runner.invoke(app, [*base, "--backend-arg", "compile"])
    assert r.exit_code == 2 and "--backend-arg must be key=value, got 'compile'" in r.output
    ok = [*base, "--backend", "dummy", "--size", "20", "--variants", "none", "--no-progress"]
    r = runner.invoke(app, [*ok, "--batch-tokens", "auto", "--shard-rows", "7"])
    assert r.exit_code == 0, r.output
