"""One exit-code table for every stage (cli/exits.py, docs/cli.md): the same kind of mistake gets the same
code in extract, store, train, eval, check, market, serve and ls, and the same one-line voice,
`walla <sub>: error: ...`, naming walla's own commands."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from walla.cli import exits
from walla.cli.lazy import run
from walla.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
USAGE, DATA, UNREACHABLE = exits.USAGE, exits.DATA, exits.UNREACHABLE

# (argv, the exit code of the table, words of the one error line); run in an empty directory holding a
# trained-looking runs/toy/scenario.json and an empty walla-store/
CASES = [
    # USAGE: the command line is wrong (an unknown name, a bad value, a device not here)
    ("train --scenario hetro", USAGE, "did you mean --scenario hetero (a scenario kind)"),
    ("train --scenario hetero --seeds 0", USAGE, "--seeds must be >= 1, got 0"),
    ("train --scenario hetero --logger mlflow", USAGE, "--logger must be one of csv, tensorboard, wandb"),
    ("train --scenario hetero --agents x", USAGE, "--agents"),
    pytest.param("train --scenario demo-hetero-facts --device cuda", USAGE, "cuda", marks=NO_GPU),
    ("extract --model nope --dataset facts", USAGE, "no such model 'nope'"),
    ("extract --model smollm2-135m --dataset factz", USAGE, "did you mean --dataset facts (a dataset)"),
    ("extract --model smollm2-135m --dataset facts --batch-tokens lots", USAGE, "--batch-tokens"),
    pytest.param(
        "extract --model smollm2-135m --dataset facts --device cuda", USAGE, "--device cuda", marks=NO_GPU
    ),
    ("eval --report t.txt", USAGE, "expected a .md path"),
    ("eval --scenario tyo", USAGE, "did you mean --scenario toy"),
    ("check --model nope --dataset facts", USAGE, "no such model 'nope'"),
    ("store rm ab", USAGE, "too short"),
    ("market serve --port 70000 --db m.db", USAGE, "--port: expected 1..65535"),
    ("serve --scenario toy --port 70000", USAGE, "--port: expected 1..65535"),
    ("serve --scenario toy --max-batch 0", USAGE, "--max-batch must be >= 1, got 0"),
    ("serve --scenario toy --limit 5", USAGE, "--limit goes with --check"),
    ("serve --scenario tyo", USAGE, "did you mean --scenario toy"),
    ("market add-agent bad/name --db m.db", USAGE, "bad/name"),
    ("ls modles", USAGE, "modles"),
    ("trian", USAGE, "Did you mean 'train'?"),
    # DATA: the command line is fine, the files or state it names are not
    ("train --scenario demo-hetero-facts --store nowhere", DATA, "store nowhere does not exist"),
    ("eval --runs nowhere", DATA, "runs directory nowhere does not exist"),
    ("serve --scenario toy --runs nowhere", DATA, "runs directory nowhere does not exist"),
    ("serve --scenario toy --check", DATA, "runs/toy/scenario.parquet: missing"),
    ("store verify --store nowhere", DATA, "store nowhere does not exist"),
    ("market audit --db nowhere.db", DATA, "no such ledger file"),
    # UNREACHABLE: a service that does not answer
    ("market audit --db postgresql://walla@127.0.0.1:1/none", UNREACHABLE, "Connection refused"),
    (
        "serve --scenario toy --unsigned --db postgresql://walla@127.0.0.1:1/none",
        UNREACHABLE,
        "Connection refused",
    ),
]


@pytest.fixture
def here(tmp_path, monkeypatch) -> Path:
    (tmp_path / "walla-store").mkdir()
    (tmp_path / "runs" / "toy").mkdir(parents=True)
    (tmp_path / "runs" / "toy" / "scenario.json").write_text(json.dumps({"name": "toy", "spec": {}}))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(("line", "code", "words"), CASES)
def test_every_stage_answers_a_mistake_with_the_tables_code(here, capfd, line, code, words):
    argv = line.split()
    assert run(app, argv, "walla") == code, capfd.readouterr()
    err = [ln for ln in capfd.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1, err
    sub = "market" if argv[0] == "market" else argv[0]
    voice = "walla: error:" if argv[0] == "trian" else f"walla {sub}"
    assert err[0].startswith(voice) and ": error: " in err[0] and words in err[0], err[0]


def test_each_code_of_the_table_is_used_and_documented_once():
    """The table lives in cli/exits.py; docs/cli.md shows it, every code once; the cases above use them."""
    used = {c.values[1] if hasattr(c, "values") else c[1] for c in CASES}
    assert {USAGE, DATA, UNREACHABLE} <= used
    doc = (ROOT / "docs" / "cli.md").read_text()
    for code, meaning in exits.TABLE.items():
        assert len(re.findall(rf"^\| {code} +\|", doc, flags=re.M)) == 1, code
        assert meaning in doc, meaning
