"""`walla serve`: a trained pool answers new questions live (docs/serve.md). Thin: options -> ServeConfig ->
load_pool -> the HTTP server (or `--check`).

    walla serve --runs runs --scenario demo-hetero-facts --store walla-store           # http://127.0.0.1:8766
    walla serve --runs runs --scenario demo-hetero-facts --store walla-store --check   # served = offline?

The options are ServeConfig's fields (serve/config.py), generated from them (cli/options.py); the options,
the runs directory and the scenario's name are checked before the server stack, torch or a model is
imported. Errors are one line with the exit codes of cli/exits.py: 2 a bad option or an unknown name, 1 a
run, store or ledger that cannot be served (and `--check` beyond 1e-6), 3 a database server that does not
answer.
"""

from __future__ import annotations

import time
from typing import Any

from walla.cli import options
from walla.cli.exits import DATA, USAGE, fail
from walla.manifests.names import trained_scenarios, unknown
from walla.serve.config import ServeConfig

SUB = "serve"
HELP = "Serve a trained pool: new questions answered live, calibrated and wager-weighted, OpenAI-compatible."
app = options.app()


def _check_run(cfg: ServeConfig) -> None:
    """The runs directory and the scenario, before anything loads (as `walla eval` checks them)."""
    if not cfg.runs.is_dir():
        what = "is a file, expected" if cfg.runs.exists() else "does not exist; expected"
        raise fail(SUB, f"runs directory {cfg.runs} {what} the directory walla train wrote (--runs)", DATA)
    have = trained_scenarios(cfg.runs)
    if cfg.scenario not in have:
        where = f"trained under {cfg.runs}"
        listing = f"{where}: {', '.join(have) or 'none; run walla train first'}"
        message = unknown("scenario", cfg.scenario, {where: (have, "--scenario {name}")}, listing)
        raise fail(SUB, message, USAGE if have else DATA)


def serve(given: dict[str, Any], extras: dict[str, Any]) -> None:
    t0 = time.perf_counter()
    cfg = options.checked_config(ServeConfig, given, SUB, _check_run)  # CUDA that cannot be, then the names
    from walla.serve import command  # the server stack, torch and the models: once the options hold

    command.run(cfg, t0)


options.config_command(app, ServeConfig, serve, name=SUB, help=HELP)
