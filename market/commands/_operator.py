"""The work of the operator's commands, `walla market init | add-agent | serve`: the ledger and its server.

    from walla.market import operator_commands as impl   # inside a command, once its options hold
    impl.init("market.db", token=None, token_file=None)

cli/operator.py parses and checks the options without importing anything heavy (`--help` and a bad option
answer at once); each of its commands then imports this module, once, which brings the ledger
(SQLAlchemy, torch through the mechanism) and the server stack (FastAPI, uvicorn). The ledger is opened and
its operator set by launch.py, as `walla serve` does. Every error is one line of `walla market` (cli/exits.py).
"""

from __future__ import annotations

import threading
from pathlib import Path

import typer
import uvicorn
from walla.cli import exits
from walla.cli.exits import DATA, USAGE
from walla.market.api import (
    MAX_BODY,
    RATE,
    ClientError,
    ConnectionLimits,
    create_app,
)
from walla.market.keys import KEY_ENV
from walla.market.launch import fail, open_ledger, setup_operator
from walla.market.ledger import Ledger


def sign_ledger(ledger: Ledger, keys: list[bytes], sub: str = "market", serving: bool = True) -> None:
    """Every event this ledger writes from now on signed with keys[0] (cli_operator.market_keys read them),
    a line printed when events before were unsigned or the key rotates (ledger/chain.py); without keys, a
    ledger already signed is refused (its next event would fail the audit), and a server says in one line
    that it serves unsigned."""
    if not keys:
        signed_from, current = ledger.signing()
        if signed_from is not None:
            ledger.close()
            raise exits.fail(
                sub,
                f"the ledger's events are signed from event {signed_from} on (key {current}): give its key "
                f"(--key-file FILE or ${KEY_ENV}); an unsigned event would fail its audit",
                USAGE,
            )
        if serving:
            typer.echo(
                f"walla {sub}: serving unsigned (--unsigned): the audit cannot tell a forged event", err=True
            )
        return
    try:
        line = ledger.sign_with(keys)
    except ValueError as e:
        ledger.close()
        raise exits.fail(sub, f"--key-file: {e}", DATA) from None
    if line is not None:
        typer.echo(f"walla {sub}: {line}", err=True)


class HeadWriter:
    """Appends the chain's signed head to a head file every `every` seconds (ledger.record_head), from a
    daemon thread; once at start (a file that cannot be written stops the server there) and once at stop.
    A failure later is one line on stderr, and it tries again at the next interval."""

    def __init__(self, ledger: Ledger, path: Path, every: float, sub: str = "market") -> None:
        self.ledger, self.path, self.every, self.sub = ledger, path, every, sub
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="walla-market-heads", daemon=True)

    def start(self) -> HeadWriter:
        try:
            self.ledger.record_head(self.path)
        except (OSError, ValueError, UnicodeDecodeError) as e:
            self.ledger.close()
            raise exits.fail(self.sub, f"--head-file {self.path}: {exits.message_of(e)}", DATA) from None
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.write()

    def write(self) -> None:
        try:
            self.ledger.record_head(self.path)
        except Exception as e:  # a server keeps serving; the line says why its head file fell behind
            typer.echo(f"walla {self.sub}: --head-file {self.path}: cannot record the head ({e})", err=True)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.write()


def start_heads(ledger: Ledger, heads: tuple[Path | None, float], sub: str = "market") -> HeadWriter | None:
    """A HeadWriter on (head file, seconds), started; None without a head file."""
    path, every = heads
    return HeadWriter(ledger, path, every, sub).start() if path is not None else None


def init(db: str, token: str | None, token_file: Path | None, keys: list[bytes] = ()) -> None:
    """`walla market init`: the ledger's tables and its operator."""
    ledger = open_ledger(db)
    sign_ledger(ledger, list(keys), serving=False)
    try:
        setup_operator(ledger, token, token_file)
    finally:
        ledger.close()
    typer.echo(f"walla market: ledger ready at {db}")


def add_agent(name: str, db: str, keys: list[bytes] = (), caller: bool = False) -> None:
    """`walla market add-agent NAME [--caller]` (a name agent_name already checked): its token, printed once."""
    from walla.market.ledger import AGENT, CALLER

    ledger = open_ledger(db)
    sign_ledger(ledger, list(keys), serving=False)
    try:
        token = ledger.add_agent(name, role=CALLER if caller else AGENT)
    except ClientError as e:
        raise fail(e.message) from None
    finally:
        ledger.close()
    typer.echo(f"{'caller' if caller else 'agent'} {name} token (shown once, store it): {token}")


def serve(
    db: str,
    host: str,
    port: int,
    token: str | None,
    token_file: Path | None,
    max_body: int | None,
    rate: float | None,
    keys: list[bytes] = (),
    heads: tuple[Path | None, float] = (None, 60.0),
    limits: ConnectionLimits | None = None,
) -> None:
    """`walla market serve` (options checked, the port free): the HTTP API and the dashboard until Ctrl-C.
    An option left None is the server's default (api/server.py); `keys` sign the events (none: --unsigned),
    `heads` (file, seconds) where and how often the chain's head is appended; `limits` the connection limits
    (api/_guard.py; None: its defaults)."""
    max_body = MAX_BODY if max_body is None else max_body
    rate = RATE if rate is None else rate
    guard = ConnectionLimits() if limits is None else limits
    ledger = open_ledger(db)
    sign_ledger(ledger, list(keys))
    setup_operator(ledger, token, token_file)
    writer = start_heads(ledger, heads)
    typer.echo(f"walla market: serving {db} on http://{host}:{port} (dashboard: /)", err=True)
    app = create_app(ledger, max_body, rate=rate, limits=guard)
    http = guard.protocol()  # api/_guard.py: deadlines, caps
    try:
        uvicorn.run(app, http=http, host=host, port=port, log_level="warning", access_log=False)
    finally:
        if writer is not None:
            writer.stop()
