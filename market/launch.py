"""Starting a server on a ledger, shared by `walla market serve | init | add-agent` and `walla serve`: the port
free, the operator's token read, the ledger opened, its operator set. Every error is one line of
`walla <sub>` (cli/exits.py), `sub` naming the command that asked.

    check_port("127.0.0.1", 8765, "serve")            # before anything loads
    token = operator_token(token_file, "serve")        # the file's, $WALLA_MARKET_OPERATOR_TOKEN's, or None
    ledger = open_ledger("serve.db", "serve")          # tables created if missing
    setup_operator(ledger, token, token_file, "serve") # a new token printed once when none is set

Only the standard library at import: a command checks its port and token before the ledger (SQLAlchemy,
torch through the mechanism) loads; open_ledger imports the ledger when it runs.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from walla.cli import exits
from walla.cli.exits import DATA, UNREACHABLE, USAGE
from walla.market.api import ClientError
from walla.market.keys import KEY_ENV, read_keys

if TYPE_CHECKING:
    from walla.market.ledger import Ledger

TOKEN_ENV = "WALLA_MARKET_OPERATOR_TOKEN"


def fail(message: object, code: int = DATA) -> typer.Exit:
    """`walla market: error: <message>` as one line on stderr; the caller raises the returned Exit. The voice of
    every `walla market` command, its options (market/cli/) and its work (market/commands/) alike.

    `code`: walla's exit-code table (cli/exits.py): DATA by default, USAGE for a bad option, UNREACHABLE
    for a market URL or database server that does not answer."""
    return exits.fail("market", message, code)


def operator_token(token_file: Path | None, sub: str = "market") -> str | None:
    """The operator's token from `token_file` or $WALLA_MARKET_OPERATOR_TOKEN, checked (>= 16 characters);
    None: neither is set (the ledger then makes one)."""
    if token_file is not None:
        try:
            token = token_file.read_text(encoding="utf-8").strip()
        except OSError as e:
            raise exits.fail(sub, f"--operator-token-file {token_file}: {e.strerror}", DATA) from None
        if len(token) < 16:
            raise exits.fail(
                sub, f"--operator-token-file {token_file}: expected a token of >= 16 characters", USAGE
            )
        return token
    token = os.environ.get(TOKEN_ENV)
    if token is not None and len(token.strip()) < 16:
        raise exits.fail(sub, f"{TOKEN_ENV}: expected a token of >= 16 characters", USAGE)
    return token.strip() if token else None


def check_port(host: str, port: int, sub: str = "market") -> None:
    """One line of `walla <sub>` unless `host:port` can be listened on (checked before the server loads)."""
    if not 1 <= port <= 65535:
        raise exits.fail(sub, f"--port: expected 1..65535, got {port}", USAGE)
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except OSError as e:
        raise exits.fail(
            sub, f"--host {host} --port {port}: cannot listen ({e.strerror or e})", DATA
        ) from None


def first_line(e: BaseException) -> str:
    """The first line of what a database error says (SQLAlchemy's wrapped driver error, `orig`, where it has
    one): the reason an error line quotes; the error's type where it says nothing."""
    return (str(getattr(e, "orig", e) or e).splitlines() or [type(e).__name__])[0]


def open_ledger(db: str, sub: str = "market") -> Ledger:
    """The ledger at `db` (its tables and indexes created if missing), or one clear error line of
    `walla <sub>` (unreachable server, unwritable path, bad URL, a ledger of an older walla)."""
    # the ledger's stack (SQLAlchemy, torch) only now: the module's callers check their options first
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError, OperationalError, SQLAlchemyError
    from walla.market.ledger import Ledger

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
    """The operator's credentials: `token` (operator_token read it from `token_file` or
    $WALLA_MARKET_OPERATOR_TOKEN), or a new token printed once when the ledger has no operator yet."""
    try:
        made = ledger.ensure_operator(token)
    except ClientError as e:
        where = f"--operator-token-file {token_file}" if token_file is not None else TOKEN_ENV
        raise exits.fail(sub, f"{where}: {e.message}", DATA) from None
    if made is not None and token is None:
        typer.echo(f"operator token (shown once, store it): {made}")


def market_keys(key_file: Path | None, unsigned: bool | None, sub: str = "market") -> list[bytes]:
    """The market's keys from `key_file` or $WALLA_MARKET_KEY (keys.read_keys); [] with neither. A server
    (`unsigned` False) refuses to start without one unless told --unsigned (`unsigned` None: a one-shot
    command, which signs when it has a key). Errors are one line of `walla <sub>`."""
    try:
        keys = read_keys(key_file)
    except (OSError, UnicodeDecodeError) as e:
        raise exits.fail(sub, f"--key-file: {exits.message_of(e)}", DATA) from None
    except ValueError as e:
        raise exits.fail(sub, e, USAGE) from None
    if keys and unsigned:
        raise exits.fail(
            sub, f"--unsigned: a key is given ({key_file or KEY_ENV}); leave out one of them", USAGE
        )
    if not keys and unsigned is False:
        raise exits.fail(
            sub,
            f"no key to sign the ledger's events: give --key-file FILE or ${KEY_ENV} (or --unsigned to serve "
            "without one: anyone who can write the database could then append events the audit cannot tell "
            "from the server's)",
            USAGE,
        )
    return keys


def check_heads_every(head_file: Path | None, every: float, sub: str = "market") -> None:
    """One line of `walla <sub>` unless --head-every is a sane period and --head-file's directory exists."""
    if not 0.01 <= every <= 86400:  # NaN too
        raise exits.fail(sub, f"--head-every: expected 0.01..86400 seconds, got {every:g}", USAGE)
    if head_file is not None and not head_file.parent.is_dir():
        raise exits.fail(sub, f"--head-file {head_file}: directory {head_file.parent} does not exist", DATA)
