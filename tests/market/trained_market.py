"""A tiny trained market for the replay and agent tests (a random tiny LLM built here; no download):

walla extract --model <dir> --dataset facts --size 60 --variants none,relevant
walla train --scenario homo --model <dir> --agents 3 --methods walla-i,walla-ii --seed-list 18 --save-states walla

market = train_tiny_market(tmp)              # {"model", "store", "runs", "scenario"}
train_more(market, runs, "walla-i", "walla.lr=0.003")   # another run key of walla-i in `runs`
"""

from __future__ import annotations

import sys
from pathlib import Path

from typer.testing import CliRunner
from walla.extract import cli as extract_cli
from walla.train import cli as train_cli
from walla.train.runs import list_scenarios

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "extract"))

from tiny_model import tiny_model, tiny_tokenizer  # noqa: E402

HEAD_SETTINGS = ("walla.epochs=3", "walla.projection_dim=null", "walla.hidden=[8]", "walla.standardize=true")


def _train(model: Path, store: Path, runs: Path, methods: str, settings: tuple[str, ...]) -> None:
    args = ["--scenario", "homo", "--model", str(model), "--agents", "3", "--store", str(store)]
    args += ["--runs", str(runs), "--methods", methods, "--seed-list", "18", "--save-states", "walla"]
    for s in settings:
        args += [s] if s.startswith("--") else ["--set", s]  # a flag (--calibrated) or a --set key=value
    res = CliRunner().invoke(train_cli.app, args)
    assert res.exit_code == 0, res.output


def train_tiny_market(tmp: Path, dtype: str = "float32", methods: str = "walla-i,walla-ii") -> dict:
    """The tiny LLM extracted in `dtype` (with and without the fact), then `methods` trained with heads saved."""
    tok = tiny_tokenizer()
    mdir = tmp / "tiny-llm"
    tiny_model(len(tok), seed=3).save_pretrained(mdir)
    tok.save_pretrained(mdir)
    store, runs = tmp / "store", tmp / "runs"
    args = ["--model", str(mdir), "--dataset", "facts", "--size", "60", "--store", str(store)]
    args += ["--device", "cpu", "--dtype", dtype, "--variants", "none,relevant"]
    res = CliRunner().invoke(extract_cli.app, args)
    assert res.exit_code == 0, res.output
    _train(mdir, store, runs, methods, HEAD_SETTINGS)
    (scenario,) = list_scenarios(runs)
    return {"model": mdir, "store": store, "runs": runs, "scenario": scenario}


def train_more(market: dict, runs: Path, methods: str, *settings: str) -> None:
    """Train `methods` again into `runs` with extra `settings`: another run key beside the first."""
    _train(market["model"], market["store"], runs, methods, (*HEAD_SETTINGS, *settings))
