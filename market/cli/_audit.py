"""`walla market audit | export`: check a ledger end to end, or write it out as Parquet.

    walla market audit --db market.db            # exit 0 "OK", or exit 1 with one line naming the first bad row
    walla market audit --db market.db --head market.heads --key-file market.key  # MACs and heads checked
    walla market export --db market.db --to out/  # out/{reports,resolutions,payouts,events,...}.parquet

This module checks the options and imports nothing heavy (`walla market --help` stays light); each command
then imports its implementation, commands/audit.py, once. Both open the ledger read-only.
"""

from __future__ import annotations

from pathlib import Path

import typer
from walla.cli import options
from walla.cli.exits import USAGE, message_of
from walla.market.audit import read_heads
from walla.market.keys import KEY_ENV, read_keys
from walla.market.launch import fail

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
    new_head_file: bool = typer.Option(
        False, "--new-head-file", help="the --head file does not exist yet: this audit writes its first line"
    ),
    key_file: Path | None = typer.Option(
        None,
        "--key-file",
        help=f"the market's key: checks the events' MACs, signs and checks the head lines (or ${KEY_ENV})",
    ),
) -> None:
    """Prove the ledger's state from its event chain, the chain from its MACs and the recorded heads, and
    recompute every payout from the reports (train/mechanism.py). Opens the database read-only."""
    if new_head_file and (head is None or head.exists()):
        what = "goes with --head FILE" if head is None else f"{head} exists (it is not the first)"
        raise fail(f"--new-head-file: {what}", USAGE)
    try:  # audit/heads.py and _keys.py are light: a mistake in either file answers before the ledger loads
        keys = read_keys(key_file)
        heads = read_heads(head) if head is not None else None
    except (OSError, UnicodeDecodeError) as e:
        raise fail(f"--head/--key-file: {message_of(e)}") from None
    except ValueError as e:
        raise fail(e if str(e).startswith(("--key-file", KEY_ENV)) else f"--head {e}") from None
    _check_ledger_file(db)
    # each command imports its one implementation module when it runs, once its options hold: walla.cli.lazy
    from walla.market.commands import _audit as impl

    impl.audit_ledger(db, head, heads, keys, new_head_file)


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
