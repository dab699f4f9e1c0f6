"""The work of the operator's commands, `walla market init | add-agent | serve`: the ledger and its server.

    from walla.market import operator_commands as impl   # inside a command, once its options hold
    impl.init("market.db", token=None, token_file=None)

cli/operator.py parses and checks the options without importing anything heavy (`--help` and a bad option
answer at once); each of its commands then imports this module, once, which brings the ledger
(SQLAlchemy, torch through the mechanism) and the server stack (FastAPI, uvicorn). `walla serve` opens its
ledger and sets up its operator here too. Every error is one line of `walla <sub>` (cli/exits.py).
"""

from __future__ import annotations

from pathlib import Path

import typer
import uvicorn
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, OperationalError, SQLAlchemyError
from walla.cli import exits
from walla.cli.exits import DATA, UNREACHABLE, USAGE
from walla.market.api import (
    MAX_BODY,
    MAX_CLIENT_CONNECTIONS,
    RATE,
    READ_TIMEOUT_S,
    ClientError,
    create_app,
    guarded_protocol,
)
from walla.market.cli import TOKEN_ENV, fail, first_line
from walla.market.ledger import Ledger


def open_ledger(db: str, sub: str = "market") -> Ledger:
    """The ledger at `db` (its tables and indexes created if missing), or one clear error line of
    `walla <sub>` (unreachable server, unwritable path, bad URL, a ledger of an older walla)."""
    path = Path(db)
    if "://" not in db and path.is_dir():
        raise exits.fail(
            sub, f"--db {db}: is a directory, expected a database file (e.g. market.db) or a URL", DATA
        )
    if "://" not in db and not path.parent.is_dir():
        raise exits.fail(sub, f"--db {db}: directory {path.parent} does not exist", DATA)
    try:
        return Ledger.open(db)
    # a URL of a database the ledger does not support (db.database_url), a ledger of an older walla
    except ValueError as e:
        raise exits.fail(sub, f"--db {db}: {e}", DATA) from None
    except (ArgumentError, NoSuchModuleError, ImportError) as e:
        raise exits.fail(sub, f"--db {db}: not a database path or URL ({first_line(e)})", USAGE) from None
    except OperationalError as e:  # a database server that does not answer (a SQLite file: its directory)
        code = UNREACHABLE if "://" in db else DATA
        raise exits.fail(sub, f"--db {db}: cannot open ({first_line(e)})", code) from None
    except SQLAlchemyError as e:
        raise exits.fail(sub, f"--db {db}: cannot open ({first_line(e)})", DATA) from None


def setup_operator(ledger: Ledger, token: str | None, token_file: Path | None, sub: str = "market") -> None:
    """The operator's credentials: `token` (cli_operator.operator_token read it from `token_file` or
    $WALLA_MARKET_OPERATOR_TOKEN), or a new token printed once when the ledger has no operator yet."""
    try:
        made = ledger.ensure_operator(token)
    except ClientError as e:
        where = f"--operator-token-file {token_file}" if token_file is not None else TOKEN_ENV
        raise exits.fail(sub, f"{where}: {e.message}", DATA) from None
    if made is not None and token is None:
        typer.echo(f"operator token (shown once, store it): {made}")


def init(db: str, token: str | None, token_file: Path | None) -> None:
    """`walla market init`: the ledger's tables and its operator."""
    ledger = open_ledger(db)
    try:
        setup_operator(ledger, token, token_file)
    finally:
        ledger.close()
    typer.echo(f"walla market: ledger ready at {db}")


def add_agent(name: str, db: str) -> None:
    """`walla market add-agent NAME` (a name agent_name already checked): its token, printed once."""
    ledger = open_ledger(db)
    try:
        token = ledger.add_agent(name)
    except ClientError as e:
        raise fail(e.message) from None
    finally:
        ledger.close()
    typer.echo(f"agent {name} token (shown once, store it): {token}")


def serve(
    db: str,
    host: str,
    port: int,
    token: str | None,
    token_file: Path | None,
    max_body: int | None,
    rate: float | None,
    read_timeout: float | None,
    max_client_connections: int | None,
) -> None:
    """`walla market serve` (options checked, the port free): the HTTP API and the dashboard until Ctrl-C.
    An option left None is the server's default (api/server.py)."""
    max_body = MAX_BODY if max_body is None else max_body
    rate = RATE if rate is None else rate
    read_timeout = READ_TIMEOUT_S if read_timeout is None else read_timeout
    per_client = MAX_CLIENT_CONNECTIONS if max_client_connections is None else max_client_connections
    ledger = open_ledger(db)
    setup_operator(ledger, token, token_file)
    typer.echo(f"walla market: serving {db} on http://{host}:{port} (dashboard: /)", err=True)
    app = create_app(
        ledger, max_body, rate=rate, read_timeout=read_timeout, max_client_connections=per_client
    )
    http = guarded_protocol(read_timeout, per_client)  # api/guard.py: whole-request deadline, connections cap
    uvicorn.run(app, http=http, host=host, port=port, log_level="warning", access_log=False)
