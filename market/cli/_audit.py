"""`walla market audit | export`: check a ledger end to end, or write it out as Parquet.

    walla market audit --db market.db            # exit 0 "OK", or exit 1 with one line naming the first bad row
    walla market audit --db market.db --head market.heads --key-file audit.key   # the chain anchored
    walla market export --db market.db --to out/  # out/{reports,resolutions,payouts,events,...}.parquet

This module checks the options and imports nothing heavy (`walla market --help` stays light); each command
then imports its implementation, commands/audit.py, once. Both open the ledger read-only.
"""

from __future__ import annotations

from pathlib import Path

import typer
from walla.cli import options
from walla.cli.exits import message_of
from walla.market.audit import key_from, read_heads
from walla.market.cli._voice import fail

app = options.app()

DB = typer.Option("market.db", "--db", help="SQLite file or SQLAlchemy URL (postgresql://user@host/db)")


def _check_ledger_file(db: str) -> None:
    """A SQLite ledger must exist: neither command creates one (a URL is the database server's to answer)."""
    if "://" not in db and not Path(db).is_file():
        raise fail(f"--db {db}: no such ledger file")


@app.command("audit")
def audit_command(
    db: str = DB,
    head: Path | None = typer.Option(
        None, "--head", help="head file: every recorded head is checked, then the current one appended"
    ),
    key_file: Path | None = typer.Option(
        None,
        "--key-file",
        help="HMAC key that signs and checks the head file's lines (or $WALLA_MARKET_AUDIT_KEY)",
    ),
) -> None:
    """Prove the ledger's state from its event chain, the chain from the recorded heads, and recompute every
    payout from the reports (train/mechanism.py). Opens the database read-only."""
    try:  # audit/heads.py is light: a mistake in either file answers before the ledger's stack loads
        key = key_from(key_file)
        heads = read_heads(head) if head is not None else []
    except (OSError, UnicodeDecodeError) as e:
        raise fail(f"--head/--key-file: {message_of(e)}") from None
    except ValueError as e:
        raise fail(f"--head {e}") from None
    _check_ledger_file(db)
    # each command imports its one implementation module when it runs, once its options hold: walla.cli.lazy
    from walla.market.commands import _audit as impl

    impl.audit_ledger(db, head, heads, key)


@app.command("export")
def export_command(
    db: str = DB, to: Path = typer.Option(..., "--to", help="directory for the Parquet files")
) -> None:
    """Write the ledger's tables (reports, resolutions, payouts, events, ...) as Parquet files."""
    if to.exists() and not to.is_dir():
        raise fail(f"--to {to}: exists and is not a directory")
    _check_ledger_file(db)
    from walla.market.commands import _audit as impl

    impl.export_ledger(db, to)
