"""A name walla prints is accepted back: the scenario a kind builds and writes (`--scenario hetero` on facts
trains `hetero-facts`) is what `--add-agent` and a rerun take, through the real commands and store."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner
from walla.extract.cli import app as extract_app
from walla.train.cli import app as train_app

runner = CliRunner()
FAST = [
    "--methods",
    "uniform,walla-i",
    "--seed-list",
    "18",
    "--set",
    "walla.epochs=1",
    "--set",
    "walla.hidden=[8]",
]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """Two (dummy-backend) models on 40 generated facts, and `--scenario hetero` trained over them."""
    root = tmp_path_factory.mktemp("kinds")
    for model in ("smollm2-135m", "gemma3-270m"):
        argv = [
            "--model",
            model,
            "--dataset",
            "facts",
            "--size",
            "40",
            "--variants",
            "none",
            "--backend",
            "dummy",
        ]
        r = runner.invoke(extract_app, [*argv, "--no-progress", "--store", str(root / "store")])
        assert r.exit_code == 0, r.stderr
    r = train(root, "--scenario", "hetero", *FAST, "--save-states", "walla-i")
    assert r.exit_code == 0, (r.output, r.stderr)
    assert "walla train: scenario hetero-facts" in r.output  # the name it prints ...
    assert (root / "runs" / "hetero-facts" / "scenario.json").is_file()  # ... and writes
    return root


def train(root: Path, *args: str):
    return runner.invoke(train_app, ["--store", str(root / "store"), "--runs", str(root / "runs"), *args])


def test_the_printed_name_trains_again(root):
    r = train(root, "--scenario", "hetero-facts", *FAST)
    assert r.exit_code == 0, (r.output, r.stderr)
    assert "hetero-facts" in r.output and "new" in r.output
    assert not (root / "runs" / "hetero-facts-facts").exists()


def test_an_agent_joins_the_printed_name(root):
    r = train(root, "--scenario", "hetero-facts", "--add-agent", "smollm2-135m", *FAST)
    assert r.exit_code == 0, (r.output, r.stderr)
    assert (root / "runs" / "hetero-facts+smollm2-135m" / "scenario.json").is_file()


def test_a_name_never_trained_is_refused_with_the_kinds(root):
    r = train(root, "--scenario", "hetero-fact", *FAST)
    assert r.exit_code == 2, (r.output, r.stderr)
    line = r.stderr.strip()
    assert "--scenario hetero-facts (trained under" in line and "kinds hetero, homo, hetero-context" in line


def test_a_joined_name_names_the_command_that_trained_it(root):
    joined = root / "runs" / "hetero-facts+smollm2-135m"
    if not joined.exists():
        assert train(root, "--scenario", "hetero-facts", "--add-agent", "smollm2-135m", *FAST).exit_code == 0
    r = train(root, "--scenario", joined.name, *FAST)
    assert r.exit_code == 2, (r.output, r.stderr)
    assert "rerun the command that trained it" in r.stderr and "--add-agent" in r.stderr
