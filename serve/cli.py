"""`walla serve`: a trained pool answers new questions live (docs/serve.md).

    walla serve --runs runs --scenario demo-hetero-facts --store walla-store           # http://127.0.0.1:8766
    walla serve --runs runs --scenario demo-hetero-facts --store walla-store --check   # served = offline?

Every error is one line on stderr and exit 1 (`--check` beyond 1e-6 too); bad usage exits 2.
"""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path

import typer

PROG = "walla serve"
app = typer.Typer(add_completion=False)


def fail(message: object, code: int = 1) -> typer.Exit:
    typer.echo(f"{PROG}: error: {' '.join(str(message).split())}", err=True)
    return typer.Exit(code)


@app.command("serve")
def serve(
    runs: Path = typer.Option(Path("runs"), "--runs", help="runs root (walla train --runs)"),
    scenario: str = typer.Option(..., "--scenario", help="a trained scenario"),
    store: Path = typer.Option(Path("walla-store"), "--store", help="the feature store it was trained from"),
    method: str = typer.Option("walla-i", "--method", help="a WALLA method with saved heads (--save-states)"),
    seed: int = typer.Option(None, "--seed", help="the run's seed (default: the key's smallest)"),
    key: str = typer.Option(None, "--key", help="the run key id when the method has several"),
    device: str = typer.Option(None, "--device", help="default: the device kind the feature sets recorded"),
    other_identity: bool = typer.Option(
        False,
        "--other-identity",
        help="serve even where the recorded identity cannot be reproduced (labelled)",
    ),
    db: str = typer.Option("serve.db", "--db", help="the ledger: SQLite file or SQLAlchemy URL"),
    host: str = typer.Option("127.0.0.1", "--host", help="interface to listen on"),
    port: int = typer.Option(8766, "--port", help="TCP port"),
    learn: bool = typer.Option(
        False, "--learn", help="each head takes walla-train's step on its own payouts"
    ),
    open_access: bool = typer.Option(False, "--open", help="forecasts need no token (a local server)"),
    operator_token_file: Path = typer.Option(
        None,
        "--operator-token-file",
        help="file holding the operator token (or $WALLA_MARKET_OPERATOR_TOKEN)",
    ),
    max_wait_ms: float = typer.Option(10.0, "--max-wait-ms", help="how long a pass waits for more requests"),
    max_batch: int = typer.Option(64, "--max-batch", help="prompts per scoring pass"),
    max_queue: int = typer.Option(256, "--max-queue", help="waiting requests per model before 429"),
    ray_address: str = typer.Option(
        None,
        "--ray-address",
        help="each model on a Ray worker: a cluster address (auto, ray://...) or 'local'",
    ),
    check: bool = typer.Option(False, "--check", help="compare served with walla-train's pool; no server"),
    limit: int = typer.Option(None, "--limit", help="with --check: the first N test questions"),
) -> None:
    """Serve a trained pool: new questions answered live, calibrated and wager-weighted, OpenAI-compatible."""
    t0 = time.perf_counter()
    # the server stack, torch and the models are imported when it runs: walla.cli.lazy
    from walla.extract.door import IdentityMismatch
    from walla.market.cli_operator import _check_port, _setup_operator, open_ledger
    from walla.market.errors import ClientError
    from walla.market.ledger import Ledger
    from walla.serve.check import TOLERANCE, check_served
    from walla.serve.forecast import Forecaster
    from walla.serve.loading import ServeConfig, ServeError, load_pool
    from walla.store.layout import StoreError
    from walla.train.run_layout import RunFormatError

    if max_wait_ms < 0 or max_batch < 1 or max_queue < 1:
        raise fail("--max-wait-ms >= 0, --max-batch >= 1 and --max-queue >= 1 expected")
    if not check:
        _check_port(host, port)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    cfg = ServeConfig(runs, scenario, store, method, seed, key, device, other_identity, learn, ray_address)
    try:
        pool = load_pool(cfg)
    except (ServeError, IdentityMismatch, RunFormatError, StoreError, KeyError, ValueError, OSError) as e:
        raise fail(e.args[0] if isinstance(e, KeyError) and e.args else e) from None
    batching = {"max_wait": max_wait_ms / 1000, "max_rows": max_batch, "max_queue": max_queue}
    with tempfile.TemporaryDirectory(prefix="walla-serve-check-") as tmp:
        ledger = Ledger.open(str(Path(tmp) / "check.db")) if check else open_ledger(db)
        try:
            if not check:
                _setup_operator(ledger, operator_token_file)
            fc = Forecaster(pool, ledger, learn, **batching).start()
        except ClientError as e:
            raise fail(e.message) from None
        agents = ", ".join(f"{a.model} ({a.llm.tier})" for a in pool.agents)
        typer.echo(
            f"{PROG}: {pool.model_id} (run key {pool.choice.method}/{pool.choice.key_id}): {agents}", err=True
        )
        for a in {id(a.llm): a.llm for a in pool.agents}.values():
            if a.differs:
                typer.echo(f"{PROG}: {a.name}: serving another identity than recorded: {a.differs}", err=True)
        if check:
            try:
                res = check_served(fc, limit)
            finally:
                fc.stop()
                pool.close()
                ledger.close()
            typer.echo(
                f"{PROG} --check: {pool.model_id}: {res['n']} test questions: max |served - offline| pooled "
                f"probabilities {res['pool']:.3e}, wagers {res['wagers']:.3e} (tolerance {TOLERANCE:g})"
            )
            if res["pool"] > TOLERANCE:
                raise typer.Exit(1)
            return
    serve_forever(fc, host, port, open_access, t0)


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
