"""The operator's commands: `walla market init | serve | add-agent` (the ledger and its HTTP server).

    walla market init --db market.db                 # tables + the operator's token (printed once)
    walla market serve --db market.db --port 8765    # the HTTP API and the dashboard at /
    walla market add-agent alice --db market.db      # an agent's token (printed once)

The operator's token: `init` (or the first `serve` of a new database) creates one and prints it once;
set WALLA_MARKET_OPERATOR_TOKEN (or pass --operator-token-file FILE) to choose it instead, e.g. in CI.
Only its sha256 is stored.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from walla.cli import exits, options
from walla.cli.exits import DATA, UNREACHABLE, USAGE
from walla.market.cli_common import fail
from walla.market.errors import ClientError

if TYPE_CHECKING:
    from walla.market.ledger import Ledger

TOKEN_ENV = "WALLA_MARKET_OPERATOR_TOKEN"

app = options.app()

DB = typer.Option("market.db", "--db", help="SQLite file or SQLAlchemy URL (postgresql://user@host/db)")
TOKEN_FILE = typer.Option(
    None, "--operator-token-file", help=f"file holding the operator token (or ${TOKEN_ENV})"
)


def _fail(sub: str, message: object, code: int = DATA) -> typer.Exit:
    """The one error line of `walla <sub>`: these helpers serve `walla market` and `walla serve` alike."""
    return exits.fail(sub, message, code)


def open_ledger(db: str, sub: str = "market") -> Ledger:
    """The ledger at `db`, or one clear error line of `walla <sub>` (unreachable server, unwritable path, bad
    URL)."""
    # SQLAlchemy is imported when a command opens the ledger, not for --help: walla.cli.lazy
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError, OperationalError, SQLAlchemyError
    from walla.market.ledger import Ledger

    path = Path(db)
    if "://" not in db and path.is_dir():
        raise _fail(sub, f"--db {db}: is a directory, expected a database file (e.g. market.db) or a URL")
    if "://" not in db and not path.parent.is_dir():
        raise _fail(sub, f"--db {db}: directory {path.parent} does not exist")
    try:
        return Ledger.open(db)
    except ValueError as e:  # a URL of a database the ledger does not support (db.database_url)
        raise _fail(sub, f"--db {db}: {e}") from None
    except (ArgumentError, NoSuchModuleError, ImportError) as e:
        raise _fail(sub, f"--db {db}: not a database path or URL ({str(e).splitlines()[0]})", USAGE) from None
    except OperationalError as e:  # a database server that does not answer (a SQLite file: its directory)
        code = UNREACHABLE if "://" in db else DATA
        raise _fail(
            sub, f"--db {db}: cannot open ({str(getattr(e, 'orig', e) or e).splitlines()[0]})", code
        ) from None
    except SQLAlchemyError as e:
        raise _fail(
            sub, f"--db {db}: cannot open ({str(getattr(e, 'orig', e) or e).splitlines()[0]})"
        ) from None


def _operator_token(token_file: Path | None, sub: str) -> str | None:
    if token_file is not None:
        try:
            token = token_file.read_text(encoding="utf-8").strip()
        except OSError as e:
            raise _fail(sub, f"--operator-token-file {token_file}: {e.strerror}") from None
        if len(token) < 16:
            raise _fail(
                sub, f"--operator-token-file {token_file}: expected a token of >= 16 characters", USAGE
            )
        return token
    token = os.environ.get(TOKEN_ENV)
    if token is not None and len(token.strip()) < 16:
        raise _fail(sub, f"{TOKEN_ENV}: expected a token of >= 16 characters", USAGE)
    return token.strip() if token else None


def _setup_operator(ledger: Ledger, token_file: Path | None, sub: str = "market") -> None:
    token = _operator_token(token_file, sub)
    try:
        made = ledger.ensure_operator(token)
    except ClientError as e:
        where = f"--operator-token-file {token_file}" if token_file is not None else TOKEN_ENV
        raise _fail(sub, f"{where}: {e.message}") from None
    if made is not None and token is None:
        typer.echo(f"operator token (shown once, store it): {made}")


@app.command()
def init(db: str = DB, operator_token_file: Path = TOKEN_FILE) -> None:
    """Create the ledger's tables and the operator (its token is printed once)."""
    ledger = open_ledger(db)
    _setup_operator(ledger, operator_token_file)
    typer.echo(f"walla market: ledger ready at {db}")


@app.command("add-agent")
def add_agent(
    name: str = typer.Argument(..., help="agent name (1-64 of A-Z a-z 0-9 _ . -)"), db: str = DB
) -> None:
    """Register an agent; prints its token once (only a hash is stored)."""
    from walla.market.text import agent_name  # light: the name is checked before the ledger loads

    try:
        name = agent_name(name)
    except ValueError as e:
        raise fail(e, USAGE) from None
    try:
        ledger = open_ledger(db)
        token = ledger.add_agent(name)
    except ClientError as e:
        raise fail(e.message) from None
    typer.echo(f"agent {name} token (shown once, store it): {token}")


def _check_port(host: str, port: int, sub: str = "market") -> None:
    if not 1 <= port <= 65535:
        raise _fail(sub, f"--port: expected 1..65535, got {port}", USAGE)
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except OSError as e:
        raise _fail(sub, f"--host {host} --port {port}: cannot listen ({e.strerror or e})") from None


@app.command()
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
    read_timeout: float = typer.Option(
        None,
        "--read-timeout",
        help="seconds a request (headers and body) may take to arrive, from its first byte "
        "(default: the server's READ_TIMEOUT_S); else 408",
    ),
    max_client_connections: int = typer.Option(
        None,
        "--max-client-connections",
        help="open connections per client address (default: the server's MAX_CLIENT_CONNECTIONS); "
        "more are refused with 429",
    ),
) -> None:
    """Serve the market's HTTP API and dashboard (GET /) on one ledger."""
    # the options are checked before the server stack (FastAPI, SQLAlchemy, torch) is imported
    if max_body is not None and max_body < 1024:
        raise fail(f"--max-body: expected >= 1024 bytes, got {max_body}", USAGE)
    if rate is not None and not 0 <= rate < float("inf"):
        raise fail(f"--rate: expected a number >= 0, got {rate}", USAGE)
    if read_timeout is not None and not 0 < read_timeout <= 3600:
        raise fail(f"--read-timeout: expected 0 < seconds <= 3600, got {read_timeout}", USAGE)
    if max_client_connections is not None and not 1 <= max_client_connections <= 100_000:
        raise fail(f"--max-client-connections: expected 1..100000, got {max_client_connections}", USAGE)
    _check_port(host, port)
    import uvicorn  # the server stack is imported when it serves, not for --help: walla.cli.lazy
    from walla.market.guard import guarded_protocol
    from walla.market.server import MAX_BODY, MAX_CLIENT_CONNECTIONS, RATE, READ_TIMEOUT_S, create_app

    max_body = MAX_BODY if max_body is None else max_body
    rate = RATE if rate is None else rate
    read_timeout = READ_TIMEOUT_S if read_timeout is None else read_timeout
    per_client = MAX_CLIENT_CONNECTIONS if max_client_connections is None else max_client_connections
    ledger = open_ledger(db)
    _setup_operator(ledger, operator_token_file)
    typer.echo(f"walla market: serving {db} on http://{host}:{port} (dashboard: /)", err=True)
    app = create_app(
        ledger, max_body, rate=rate, read_timeout=read_timeout, max_client_connections=per_client
    )
    http = guarded_protocol(read_timeout, per_client)  # guard.py: whole-request deadline, connections cap
    uvicorn.run(app, http=http, host=host, port=port, log_level="warning", access_log=False)
