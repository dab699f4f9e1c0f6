"""Each option is written once, as its config field: the commands' options are the configs' fields, help
is rendered as written, and every message of the sources names `walla <sub>`, never an old script."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest
import typer
from walla.cli.lazy import run
from walla.cli.main import app
from walla.evaluate.cli import app as eval_app
from walla.evaluate.config import EvalConfig
from walla.extract.cli import app as extract_app
from walla.extract.config import ExtractConfig
from walla.serve.cli import app as serve_app
from walla.serve.config import ServeConfig
from walla.train import config as train_config
from walla.train import loggers
from walla.train.cli import app as train_app
from walla.train.config import TrainConfig
from walla.train.engine import _fabric as engine

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION = ("extract", "store", "train", "evaluate", "manifests", "cli", "market", "serve")
# an old script's name (not a file, walla-check.json, nor a thread's, walla-extract-io), or a make target
OLD_NAMES = re.compile(
    r"walla-(extract|train|eval|market|check)\b(?![.-])|walla-store(:| ls| verify| rm)|make extract"
)


@pytest.mark.parametrize(
    ("command", "cls", "extra"),
    [
        (extract_app, ExtractConfig, set()),
        (train_app, TrainConfig, {"debug"}),
        (eval_app, EvalConfig, set()),
        (serve_app, ServeConfig, set()),
    ],
)
def test_the_options_are_the_configs_fields(command, cls, extra):
    params = {p.name: p for p in typer.main.get_command(command).params}
    fields = {f.name: f for f in dataclasses.fields(cls)}
    assert set(params) - {"help"} == set(fields) | extra
    for name, f in fields.items():
        assert params[name].help == f.metadata["help"], name  # the help is the field's, word for word


def test_a_bad_option_names_its_flag_not_the_field(capfd):
    assert run(app, ["train", "--scenario", "hetero", "--seed-list", "18,x"], "walla") == 2
    assert "--seed-list: expected comma-separated integers" in capfd.readouterr().err
    assert (
        run(app, ["extract", "--model", "smollm2-135m", "--dataset", "facts", "--shard-rows", "x"], "walla")
        == 2
    )
    assert "walla extract: error: --shard-rows: Input should be a valid integer" in capfd.readouterr().err


def test_grouped_options_are_the_configs_fields_and_arrive_as_one_value(capfd):
    """cli/options.py `grouped_options` (walla market serve's connection limits): each field of the class is
    an option of the hand-written command, with the field's help and default; what is given arrives as one
    validated value; a bad one is one line naming its flag, exit 2, and the body never runs."""
    from walla.cli.options import app as new_app
    from walla.cli.options import grouped_options
    from walla.market.api import ConnectionLimits

    got = []
    cmd = new_app()

    @cmd.command()
    @grouped_options(ConnectionLimits, "limits", sub="market")
    def serve(db: str = typer.Option("m.db", "--db"), limits: ConnectionLimits | None = None) -> None:
        got.append((db, limits))

    params = {p.name: p for p in typer.main.get_command(cmd).params}
    assert set(params) - {"help"} == {"db"} | {f.name for f in dataclasses.fields(ConnectionLimits)}
    for f in dataclasses.fields(ConnectionLimits):
        assert params[f.name].help == f.metadata["help"] and params[f.name].default == f.default, f.name
    assert (
        run(cmd, ["--db", "x.db", "--read-timeout", "2.5", "--max-connections", "7"], "walla market serve")
        == 0
    )
    assert got == [("x.db", ConnectionLimits(read_timeout=2.5, max_connections=7))]
    assert run(cmd, ["--write-timeout", "0"], "walla market serve") == 2
    assert capfd.readouterr().err.strip().splitlines() == [
        "walla market: error: --write-timeout: expected 0 < seconds <= 3600, got 0"
    ]
    assert len(got) == 1


@pytest.mark.parametrize(
    "argv", [["extract", "--help"], ["train", "--help"], ["serve", "--help"], ["market", "agent", "--help"]]
)
def test_help_is_rendered_as_written(capfd, argv):
    """No rich markup eats `[ray]`, and a flag shows no value (`<bool>`)."""
    assert run(app, argv, "walla") == 0
    out = capfd.readouterr().out
    assert "--help" in out and "<bool>" not in out
    if argv[0] == "extract":
        assert "needs walla[ray]" in " ".join(out.split())


def test_trainconfig_knows_the_recipes_choices():
    """TrainConfig checks --logger and --precision before torch loads: its lists are the recipe's."""
    assert train_config.LOGGERS == loggers.LOGGERS
    assert set(train_config.PRECISIONS) == {"auto", *engine.PRECISIONS, *engine.PRECISION_ALIASES}


def _messages(path: Path) -> list[tuple[int, str]]:
    """The string constants of a module that are not docstrings (what it can print)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (n.lineno, n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
    ]


def test_no_message_names_an_old_script_or_a_make_target():
    bad = [
        f"{path.relative_to(ROOT)}:{line}: {text!r}"
        for stage in PRODUCTION
        for path in sorted((ROOT / stage).rglob("*.py"))
        for line, text in _messages(path)
        if OLD_NAMES.search(text)
    ]
    assert not bad, "\n".join(bad)
