"""`walla --help`, every `walla SUB --help` (market's and store's commands included), the old script names and
shell completion answer without importing torch, transformers, Lightning, FastAPI or SQLAlchemy.

Each command line runs in a fresh interpreter (what a user's shell starts); no timing is asserted here
(the machine is shared; docs/benchmarks.md quotes hyperfine medians), only which modules got imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import typer
from walla.cli.main import COMMANDS
from walla.market.cli import COMMANDS as MARKET_COMMANDS
from walla.store.cli import app as store_app

HEAVY = ("torch", "transformers", "lightning_fabric", "fastapi", "sqlalchemy")
ALIASES = ("extract", "store", "train", "eval", "market")

CHILD = r"""
import json, os, sys
from walla.cli import main
how, argv = json.loads(sys.argv[1])
sys.argv = [how, *argv]
try:
    if how == "walla":
        main.main()
    else:  # an old script name: the console script's function
        getattr(main, how.replace("-", "_"))()
    code = 0
except SystemExit as e:
    code = e.code
heavy = [m for m in json.loads(os.environ["HEAVY"]) if m in sys.modules]
print("\n@@" + json.dumps({"code": code, "heavy": heavy}))
"""


def _run(how: str, argv: list[str], env: dict | None = None) -> tuple[dict, str]:
    env = {**os.environ, "HEAVY": json.dumps(HEAVY), "COLUMNS": "120", **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps([how, argv])],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    out, _, tail = proc.stdout.rpartition("\n@@")
    assert tail, proc.stderr[-2000:]
    return json.loads(tail), out + proc.stderr


def _cases() -> list[tuple[str, list[str]]]:
    store_commands = sorted(typer.main.get_command(store_app).commands)
    return [
        ("walla", ["--help"]),
        ("walla", []),
        ("walla", ["--version"]),
        *(("walla", [sub, "--help"]) for sub in COMMANDS),
        *(("walla", ["market", c, "--help"]) for c in MARKET_COMMANDS),
        *(("walla", ["store", c, "--help"]) for c in store_commands),
        *((f"walla-{a}", ["--help"]) for a in ALIASES),
    ]


def test_the_cases_cover_every_command():
    argvs = [" ".join(argv) for _, argv in _cases()]
    assert {"train --help", "market serve --help", "market replay --help", "store verify --help"} <= set(
        argvs
    )
    assert len(argvs) >= 1 + 1 + 1 + 7 + 5 + 3 + 5


def test_help_imports_nothing_heavy():
    cases = _cases()
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1)) as pool:
        results = list(pool.map(lambda c: _run(*c), cases))
    bad = []
    for (how, argv), (res, out) in zip(cases, results, strict=True):
        want = 2 if argv == [] else 0  # `walla` alone prints the help, as a usage error
        if res["code"] != want or res["heavy"] or "Usage:" not in out and argv != ["--version"]:
            bad.append(f"{how} {' '.join(argv)}: exit {res['code']}, imported {res['heavy']}\n{out[-500:]}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    ("words", "cword", "want"),
    [("walla tr", 1, "train"), ("walla market se", 2, "serve"), ("walla train --see", 2, "--seeds")],
)
def test_shell_completion_answers_without_heavy_imports(words, cword, want):
    env = {"_WALLA_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(cword)}
    res, out = _run("walla", [], env)
    assert res["code"] == 0 and not res["heavy"], out
    assert want in out.split(), out


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "--scenario", "x", "--max-batch", "0"],
        ["serve", "--scenario", "x", "--port", "70000"],
        ["serve", "--scenario", "x", "--runs", "nowhere"],
    ],
)
def test_a_bad_serve_option_answers_before_the_server_stack(argv):
    """ServeConfig is checked, and the runs directory looked at, before the server stack or a model loads."""
    res, out = _run("walla", argv)
    assert res["code"] in (1, 2) and not res["heavy"], out
    assert out.strip().startswith("walla serve: error: "), out


def _market_mistakes(tmp: str, ledger: str) -> list[list[str]]:
    db = f"{tmp}/m.db"
    agent = ["--url", "http://127.0.0.1:9", "--model", "m", "--head", tmp, "--dataset", "d"]
    return [
        ["market", "init", "--db", db, "--operator-token-file", f"{tmp}/no-token"],
        ["market", "audit", "--db", ledger, "--key-file", f"{tmp}/no-key"],
        ["market", "audit", "--db", ledger, "--head", ledger],  # a head file that is not one
        ["market", "serve", "--db", db, "--max-body", "10"],
        ["market", "serve", "--db", db, "--port", "8769"],  # no key and no --unsigned (issue 46)
        ["market", "add-agent", "bad/name", "--db", db],
        ["market", "agent", *agent, "--batch-size", "0"],
        ["market", "replay", "--limit", "0"],
        ["market", "audit", "--db", db],
        ["market", "export", "--db", db, "--to", f"{tmp}/out"],
    ]


def test_a_market_mistake_answers_before_the_ledger_or_a_model(tmp_path):
    """Each `walla market` command checks its options, then imports its one implementation module (issue
    39): a bad option, token file or ledger path answers without SQLAlchemy, FastAPI or torch, and writes
    nothing."""
    ledger = tmp_path / "given" / "market.db"  # an existing file: the audit's --head/--key-file are read
    ledger.parent.mkdir()
    ledger.write_bytes(b"SQLite format 3\x00" + bytes(84))
    work = tmp_path / "work"
    work.mkdir()
    cases = _market_mistakes(str(work), str(ledger))
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1)) as pool:
        results = list(pool.map(lambda argv: _run("walla", argv), cases))
    bad = []
    for argv, (res, out) in zip(cases, results, strict=True):
        words = out.strip().startswith("walla market: error: ") and "[Errno" not in out  # a reason in words
        if res["code"] not in (1, 2) or res["heavy"] or not words:
            bad.append(f"walla {' '.join(argv)}: exit {res['code']}, imported {res['heavy']}\n{out[-500:]}")
    assert not bad, "\n".join(bad)
    assert list(work.iterdir()) == []
