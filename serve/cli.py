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

import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import typer
from walla.cli import options
from walla.cli.exits import DATA, USAGE, answered, fail
from walla.cli.torch_build import refuse_cuda_early
from walla.manifests.names import trained_scenarios, unknown
from walla.serve.config import ServeConfig

SUB = "serve"
PROG = f"walla {SUB}"
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
    cfg = options.build_config(ServeConfig, given, SUB)
    refuse_cuda_early(SUB, cfg.device)  # a machine that can never give CUDA: answered without torch
    _check_run(cfg)
    # the server stack, torch and the models are imported once the options hold: walla.cli.lazy
    from walla.market.cli_operator import _check_port, _setup_operator, open_ledger

    if not cfg.check:
        _check_port(cfg.host, cfg.port, SUB)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    # a database server before the models (one that does not answer is told before minutes of loading); a
    # SQLite file once the pool has loaded, so that a run that cannot be served leaves no file behind
    ledger = open_ledger(cfg.db, SUB) if not cfg.check and "://" in cfg.db else None
    try:
        with answered(SUB):
            from walla.market.errors import ClientError
            from walla.market.ledger import Ledger
            from walla.serve.check import TOLERANCE, check_served
            from walla.serve.forecast import Forecaster
            from walla.serve.loading import load_pool

            pool = load_pool(cfg)
    except BaseException:
        if ledger is not None:
            ledger.close()
        raise
    with tempfile.TemporaryDirectory(prefix="walla-serve-check-") as tmp:
        if ledger is None:
            ledger = Ledger.open(str(Path(tmp) / "check.db")) if cfg.check else open_ledger(cfg.db, SUB)
        try:
            if not cfg.check:
                _setup_operator(ledger, cfg.operator_token_file, SUB)
            fc = Forecaster(pool, ledger, cfg.learn, **cfg.batching()).start()
        except ClientError as e:
            raise fail(SUB, e.message, DATA) from None
        agents = ", ".join(f"{a.model} ({a.llm.tier})" for a in pool.agents)
        typer.echo(
            f"{PROG}: {pool.model_id} (run key {pool.choice.method}/{pool.choice.key_id}): {agents}", err=True
        )
        for a in {id(a.llm): a.llm for a in pool.agents}.values():
            if a.differs:
                typer.echo(f"{PROG}: {a.name}: serving another identity than recorded: {a.differs}", err=True)
        if cfg.check:
            try:
                res = check_served(fc, cfg.limit)
            finally:
                fc.stop()
                pool.close()
                ledger.close()
            typer.echo(
                f"{PROG} --check: {pool.model_id}: {res['n']} test questions: max |served - offline| pooled "
                f"probabilities {res['pool']:.3e}, wagers {res['wagers']:.3e} (tolerance {TOLERANCE:g})"
            )
            if res["pool"] > TOLERANCE:
                raise fail(
                    SUB, f"--check: served differs from offline by {res['pool']:.3e} > {TOLERANCE:g}", DATA
                )
            return
    serve_forever(fc, cfg.host, cfg.port, cfg.open_access, t0)


def serve_forever(fc, host: str, port: int, open_access: bool, t0: float) -> None:
    import uvicorn
    from walla.serve.app import create_serve_app

    app = create_serve_app(fc, open_access)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    ready = server.startup

    async def startup(sockets=None):
        await ready(sockets)
        typer.echo(
            f"{PROG}: ready in {time.perf_counter() - t0:.1f} s on http://{host}:{port} "
            f"({'open' if open_access else 'a ledger token needed'}; POST /v1/forecast, /v1/chat/completions)",
            err=True,
        )

    server.startup = startup
    try:
        server.run()
    finally:
        fc.stop()
        fc.pool.close()
        fc.ledger.close()


options.config_command(app, ServeConfig, serve, name=SUB, help=HELP)
