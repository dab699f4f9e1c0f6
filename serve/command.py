"""What `walla serve` does once its options hold (serve/cli.py imports this one module then): load the pool
through the door, open the ledger, and either `--check` served against offline or run the HTTP server.

Order matters for the user: a database server is asked before minutes of model loading (one that does not
answer is told first); a SQLite file is created only once the pool has loaded, so that a run that cannot be
served leaves no file behind.
"""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path

import typer
import uvicorn
from walla.cli.exits import DATA, answered, fail
from walla.market.api import ClientError, guarded_config
from walla.market.commands import sign_ledger, start_heads
from walla.market.launch import (
    check_heads_every,
    check_port,
    market_keys,
    open_ledger,
    operator_token,
    setup_operator,
)
from walla.market.ledger import Ledger
from walla.serve.app import create_serve_app
from walla.serve.check import TOLERANCE, check_served
from walla.serve.config import ServeConfig
from walla.serve.forecast import Forecaster
from walla.serve.loading import load_pool

SUB = "serve"
PROG = f"walla {SUB}"


def run(cfg: ServeConfig, t0: float) -> None:
    """Serve `cfg`'s pool until stopped, or check it (`cfg.check`); `t0` is when the command started."""
    keys = []
    if not cfg.check:  # the market's key, or --unsigned, before minutes of model loading
        check_heads_every(cfg.head_file, cfg.head_every, SUB)
        check_port(cfg.host, cfg.port, SUB)
        keys = market_keys(cfg.key_file, cfg.unsigned, SUB)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    ledger = open_ledger(cfg.db, SUB) if not cfg.check and "://" in cfg.db else None
    try:
        with answered(SUB):
            pool = load_pool(cfg, say=lambda line: typer.echo(f"{PROG}: {line}", err=True))
    except BaseException:
        if ledger is not None:
            ledger.close()
        raise
    with tempfile.TemporaryDirectory(prefix="walla-serve-check-") as tmp:
        if ledger is None:
            ledger = Ledger.open(str(Path(tmp) / "check.db")) if cfg.check else open_ledger(cfg.db, SUB)
        try:
            if not cfg.check:
                token = operator_token(cfg.operator_token_file, SUB)
                sign_ledger(ledger, keys, SUB)
                setup_operator(ledger, token, cfg.operator_token_file, SUB)
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
            check(fc, cfg.limit)
            return
        t = time.perf_counter()
        fc.warm_up()  # the first caller's answer is not the one that pays for the first pass
        typer.echo(
            f"{PROG}: warmed up (one question through every model and head) in {time.perf_counter() - t:.1f} s",
            err=True,
        )
    serve_forever(fc, cfg.host, cfg.port, cfg.open_access, t0, (cfg.head_file, cfg.head_every))


def check(fc: Forecaster, limit: int | None) -> None:
    """`--check`: the pool's served answers against the offline run's, on its test questions."""
    try:
        res = check_served(fc, limit)
    finally:
        fc.stop()
        fc.pool.close()
        fc.ledger.close()
    for a in res["agents"]:
        typer.echo(
            f"{PROG} --check: {a['name']} ({a['tier']}): features vs the store: max |d log p| "
            f"{a['logprobs']:.3e}, hidden {a['hidden']:.3e}, {'bit-identical' if a['equal'] else 'not identical'} "
            f"(promise: {a['bound']}; {'holds' if a['holds'] else 'BROKEN'})"
        )
    bound = f"bound {res['pool_bound']:g}" if res["pool_bound"] is not None else "bound: the features' above"
    typer.echo(
        f"{PROG} --check: {fc.pool.model_id}: {res['n']} test questions: max |served - offline| pooled "
        f"probabilities {res['pool']:.3e}, wagers {res['wagers']:.3e} ({bound}); heads and pool on the stored "
        f"features {res['path_pool']:.3e}, wagers {res['path_wagers']:.3e} (bound {TOLERANCE:g})"
    )
    if res["problems"]:
        raise fail(SUB, f"--check: {res['problems'][0]}", DATA)


def http_server(app, host: str, port: int, **uvicorn_kwargs) -> uvicorn.Server:
    """uvicorn serving `app` behind the market's slow-client guard (market/api/_guard.py: a request whole within
    the app's read_timeout of its first byte, else 408; answers written within its write_timeout; caps on one
    address's and all open connections)."""
    kwargs = {"log_level": "warning", "access_log": False, **uvicorn_kwargs}
    return uvicorn.Server(guarded_config(app, host=host, port=port, **kwargs))


def serve_forever(
    fc: Forecaster, host: str, port: int, open_access: bool, t0: float, heads: tuple = (None, 60.0)
) -> None:
    """The HTTP server until Ctrl-C; prints one `ready in ... s` line once it listens. `heads`: (head file,
    seconds), the chain's head appended there as `walla market serve --head-file` does."""
    writer = start_heads(fc.ledger, heads, SUB)
    server = http_server(create_serve_app(fc, open_access), host, port)
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
        if writer is not None:
            writer.stop()
        fc.stop()
        fc.pool.close()
        fc.ledger.close()
