"""Bad inputs to `walla train` and `walla eval`, as a new user would make them (issue 12).

Same contract as the extract/store table (test_bad_inputs_extract_store.py): the real CLI in-process,
exit code != 0, ONE line on stderr naming the offending file/key, no traceback, and the store still
verifies afterwards; where the message names a fix, the fix is run and the next walla train succeeds.
"""

from __future__ import annotations

import shlex
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from test_bad_inputs_extract_store import flip_byte, invoke
from typer.testing import CliRunner
from walla.evaluate import cli as eval_cli
from walla.train import cli as train_cli

runner = CliRunner()
DUMMY = [
    "--backend",
    "dummy",
    "--variants",
    "none,relevant",
    "--no-progress",
    "--dataset",
    "facts",
    "--size",
    "40",
]
FAST = ["--methods", "uniform,walla-i", "--seed-list", "18", "--set", "walla.epochs=1", "--set", "walla.hidden=[8]",
        "--set", "walla.projection_dim=null"]  # fmt: skip
SCENARIO = """\
# For: walla train --scenario {name}
include: [_base.yaml, _demo.yaml]
description: test
scenario: {{dataset: facts, agents: [smollm2-135m, gemma3-270m], context_rule: one_relevant}}
{extra}"""


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A store with two (dummy-backend) models on 40 generated facts, and one trained run."""
    root = tmp_path_factory.mktemp("te")
    for model in ("smollm2-135m", "gemma3-270m"):
        r = invoke("walla extract", ["--model", model, "--store", str(root / "store"), *DUMMY])
        assert r.exit_code == 0, r.stderr
    r = train(root, "--scenario", "demo-hetero-facts", *FAST)
    assert r.exit_code == 0, (r.output, r.stderr)
    return root


def train(root: Path, *args: str):
    return runner.invoke(train_cli.app, ["--store", str(root / "store"), "--runs", str(root / "runs"), *args])


def evaluate(root: Path, *args: str):
    return runner.invoke(eval_cli.app, list(args))


def scenario_file(root: Path, name: str, extra: str = "") -> str:
    path = root / f"{name}.yaml"
    path.write_text(SCENARIO.format(name=path, extra=extra))
    return str(path)


@dataclass
class Case:
    name: str
    cli: str  # walla train | walla eval
    argv: Callable[[Path], list[str]]
    names: str  # the stderr line must contain this
    damage: Callable[[Path], None] | None = None


def _runs_scenario(root: Path) -> Path:
    return root / "runs" / "demo-hetero-facts"


CASES = [
    Case("unknown scenario", "walla train", lambda r: ["--scenario", "demo-hetero-fact"], "did you mean --scenario demo-hetero-facts (a scenario manifest)"),
    Case("unknown method", "walla train", lambda r: ["--scenario", "demo-hetero-facts", "--methods", "wala-i"],
         "no such method 'wala-i'; did you mean --methods walla-i (a method)"),
    Case("hparam not a number", "walla train",
         lambda r: ["--scenario", scenario_file(r, "fast", "train: {hparams: {walla-i: {lr: fast}}}")],
         "fast.yaml: train.hparams.walla-i.lr"),
    Case("unknown hparam key", "walla train",
         lambda r: ["--scenario", scenario_file(r, "colour", "train: {hparams: {walla-i: {colour: red}}}")],
         "colour.yaml: train.hparams.walla-i.colour: unknown key"),
    Case("seeds not ints", "walla train",
         lambda r: ["--scenario", scenario_file(r, "eighteen", "train: {seeds: [eighteen]}")],
         "eighteen.yaml: train.seeds.0"),
    Case("include outside the project", "walla train", lambda r: ["--scenario", _write(r / "inc.yaml",
         "# x\ninclude: /etc/passwd\ndescription: x\nscenario: {dataset: facts, agents: [smollm2-135m]}\n")],
         "no absolute paths"),
    Case("not YAML", "walla train",
         lambda r: ["--scenario", _write(r / "bad.yaml", "a: [1, 2\n")],
         "bad.yaml: line"),
    Case("--runs is a file", "walla train", lambda r: ["--scenario", "demo-hetero-facts", "--runs", _a_file(r), *FAST],
         "is a file, expected a directory"),
    Case("store does not exist", "walla train", lambda r: ["--scenario", "demo-hetero-facts", "--store", str(r / "nowhere")],
         "nowhere does not exist"),
    Case("--device cuda without a GPU", "walla train", lambda r: ["--scenario", "demo-hetero-facts", "--device", "cuda"],
         "cuda"),
    Case("--precision bogus", "walla train", lambda r: ["--scenario", "demo-hetero-facts", "--precision", "fp7"], "fp7"),
    Case("homo without --model", "walla train", lambda r: ["--scenario", "homo", "--agents", "3"],
         "--scenario homo needs --model M and --agents N"),
    Case("hetero on an evaluation-only dataset", "walla train",
         lambda r: ["--scenario", "hetero", "--dataset", "arc-challenge"], "holds no complete feature set of dataset"),
    Case("a model that was not extracted", "walla train",
         lambda r: ["--scenario", "homo", "--model", "aloe", "--agents", "2"], "walla extract --model aloe --dataset facts"),
    Case("tampered hidden chunk", "walla train", lambda r: ["--scenario", "demo-hetero-facts", *FAST],
         "hidden.zarr/c/0/0", damage=lambda r: flip_byte(feature_dir_of(r, "smollm2-135m") / "hidden.zarr" / "c" / "0" / "0")),
    Case("eval: runs dir missing", "walla eval", lambda r: ["--report", str(r / "t.md"), "--runs", str(r / "nope")],
         "nope does not exist"),
    Case("eval: report not .md", "walla eval", lambda r: ["--report", str(r / "t.txt"), "--runs", str(r / "runs")], "t.txt"),
    Case("eval: corrupt scenario.json", "walla eval", lambda r: ["--report", str(r / "t.md"), "--runs", str(r / "runs")],
         "scenario.json", damage=lambda r: (_runs_scenario(r) / "scenario.json").write_text("{oops")),
]  # fmt: skip


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def _a_file(root: Path) -> str:
    (root / "a-file").write_text("x")
    return str(root / "a-file")


def feature_dir_of(root: Path, model: str) -> Path:
    return next(p for p in (root / "store" / "features" / model / "facts" / "none").iterdir() if p.is_dir())


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input(case: Case, base: Path, tmp_path: Path) -> None:
    if "cuda" in case.name and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    root = tmp_path / "root"
    shutil.copytree(base, root)
    if case.damage is not None:
        case.damage(root)
    r = train(root, *case.argv(root)) if case.cli == "walla train" else evaluate(root, *case.argv(root))
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code != 0, (r.output, r.stderr)
    assert len(lines) == 1 and case.names in lines[0], r.stderr
    assert "Traceback" not in r.output + r.stderr
    assert invoke("walla-store", ["verify", "--store", str(root / "store")]).exit_code == 0 or case.damage


def test_tampered_store_remedy_makes_the_next_train_succeed(base: Path, tmp_path: Path) -> None:
    """walla store verify and walla train name the same file and a fix; running the fix lets training go on."""
    root = tmp_path / "root"
    shutil.copytree(base, root)
    chunk = feature_dir_of(root, "smollm2-135m") / "hidden.zarr" / "c" / "0" / "0"
    flip_byte(chunk)
    v = invoke("walla-store", ["verify", "--store", str(root / "store")])
    assert v.exit_code == 1 and "hidden.zarr/c/0/0" in v.stderr
    r = train(root, "--scenario", "demo-hetero-facts", *FAST, "--force")
    (line,) = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code == 1 and "hidden.zarr/c/0/0" in line and "fix: `walla store rm " in line, (
        line
    )  # data: 1
    for part in line.split("fix: `", 1)[1].rsplit("`", 1)[0].split(" && "):
        argv = shlex.split(part)
        assert invoke(argv[0], argv[1:]).exit_code == 0, part
    r = train(root, "--scenario", "demo-hetero-facts", *FAST, "--force")
    assert r.exit_code == 0, (r.output, r.stderr)


def test_truncated_predictions_are_retrained(base: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    shutil.copytree(base, root)
    (pred,) = (_runs_scenario(root) / "walla-i").glob("*/seed=18/predictions.parquet")
    pred.write_bytes(pred.read_bytes()[:100])
    r = train(root, "--scenario", "demo-hetero-facts", *FAST)
    assert r.exit_code == 0 and "retraining" in r.output, r.output
    assert pred.stat().st_size > 100


def test_case_count_over_all_four_clis() -> None:
    from test_bad_inputs_extract_store import CASES as EXTRACT_STORE

    assert len(CASES) + len(EXTRACT_STORE) >= 40
