"""The operator's commands: `walla market init | serve | add-agent` (the ledger and its HTTP server).

    walla market init --db market.db                 # tables + the operator's token (printed once)
    walla market serve --db market.db --port 8765    # the HTTP API and the dashboard at /
    walla market add-agent alice --db market.db      # an agent's token (printed once)
    walla market add-agent bob --caller --db serve.db   # a walla serve caller's token (printed once)

The operator's token: `init` (or the first `serve` of a new database) creates one and prints it once;
set WALLA_MARKET_OPERATOR_TOKEN (or pass --operator-token-file FILE) to choose it instead, e.g. in CI.
Only its sha256 is stored.

This module checks the options and imports nothing heavy; each command then imports its implementation,
commands/operator.py (the ledger and the server stack), once.
"""

from __future__ import annotations

from pathlib import Path

import typer
from walla.cli import options
from walla.cli.exits import USAGE
from walla.market.api import ConnectionLimits  # the guard's limits, each an option (light: uvicorn, h11)
from walla.market.keys import KEY_ENV
from walla.market.launch import TOKEN_ENV, check_heads_every, check_port, fail, market_keys, operator_token
from walla.market.text import agent_name

app = options.app()

DB = typer.Option("market.db", "--db", help="SQLite file or SQLAlchemy URL (postgresql://user@host/db)")
TOKEN_FILE = typer.Option(
    None, "--operator-token-file", help=f"file holding the operator token (or ${TOKEN_ENV})"
)
KEY_FILE = typer.Option(
    None,
    "--key-file",
    help=f"the market's key, kept outside the database: signs every event written (or ${KEY_ENV})",
)
UNSIGNED = typer.Option(False, "--unsigned", help="serve without a key: the events are not signed")
HEAD_FILE = typer.Option(
    None, "--head-file", help="append the chain's signed head to this file every --head-every seconds"
)
HEAD_EVERY = typer.Option(60.0, "--head-every", help="seconds between two heads written to --head-file")


@app.command()
def init(db: str = DB, operator_token_file: Path = TOKEN_FILE, key_file: Path = KEY_FILE) -> None:
    """Create the ledger's tables and the operator (its token is printed once)."""
    token = operator_token(operator_token_file)
    keys = market_keys(key_file, None)
    # each command imports its one implementation module when it runs, once its options hold: walla.cli.lazy
    from walla.market.commands import _operator as impl

    impl.init(db, token, operator_token_file, keys)


@app.command("add-agent")
def add_agent(
    name: str = typer.Argument(..., help="agent name (1-64 of A-Z a-z 0-9 _ . -)"),
    db: str = DB,
    key_file: Path = KEY_FILE,
    caller: bool = typer.Option(
        False, "--caller", help="a caller of `walla serve` (the market's API refuses its token), not an agent"
    ),
) -> None:
    """Register an agent (or, with --caller, a walla serve caller); prints its token once (only a hash is
    stored)."""
    try:
        name = agent_name(name)  # market/text.py: light, so a bad name answers before the ledger loads
    except ValueError as e:
        raise fail(e, USAGE) from None
    keys = market_keys(key_file, None)
    from walla.market.commands import _operator as impl

    impl.add_agent(name, db, keys, caller=caller)


@app.command()
@options.grouped_options(ConnectionLimits, "limits", sub="market")
def serve(
    db: str = DB,
    host: str = typer.Option("127.0.0.1", "--host", help="interface to listen on"),
    port: int = typer.Option(8765, "--port", help="TCP port"),
    operator_token_file: Path = TOKEN_FILE,
    max_body: int = typer.Option(
        None, "--max-body", help="largest request body in bytes (default: 65536, the server's MAX_BODY)"
    ),
    rate: float = typer.Option(
        None,
        "--rate",
        help="requests per second per token, bursts of 200 (0: no limit; default: the server's RATE)",
    ),
    key_file: Path = KEY_FILE,
    unsigned: bool = UNSIGNED,
    head_file: Path = HEAD_FILE,
    head_every: float = HEAD_EVERY,
    limits: ConnectionLimits | None = None,
) -> None:
    """Serve the market's HTTP API and dashboard (GET /) on one ledger."""
    # the options are checked before the server stack (FastAPI, SQLAlchemy, torch) is imported
    if max_body is not None and max_body < 1024:
        raise fail(f"--max-body: expected >= 1024 bytes, got {max_body}", USAGE)
    if rate is not None and not 0 <= rate < float("inf"):
        raise fail(f"--rate: expected a number >= 0, got {rate}", USAGE)
    check_heads_every(head_file, head_every)
    check_port(host, port)
    token = operator_token(operator_token_file)
    keys = market_keys(key_file, unsigned)
    from walla.market.commands import _operator as impl

    impl.serve(
        db,
        host,
        port,
        token,
        operator_token_file,
        max_body,
        rate,
        keys=keys,
        heads=(head_file, head_every),
        limits=limits,
    )
