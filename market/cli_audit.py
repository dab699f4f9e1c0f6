"""`walla market audit | export`: check a ledger end to end, or write it out as Parquet.

    walla market audit --db market.db            # exit 0 "OK", or exit 1 with one line naming the first bad row
    walla market export --db market.db --to out/  # out/{reports,resolutions,payouts,events,...}.parquet

The ledger and the audit are imported inside the commands: `walla market --help` stays light.
"""

from __future__ import annotations

from pathlib import Path

import typer
from walla.cli import options
from walla.market.cli_common import fail
from walla.market.cli_operator import open_ledger  # light: it imports the ledger when it opens one

app = options.app()

DB = typer.Option("market.db", "--db", help="SQLite file or SQLAlchemy URL (postgresql://user@host/db)")


def _existing_ledger(db: str):
    if "://" not in db and not Path(db).is_file():
        raise fail(f"--db {db}: no such ledger file")
    return open_ledger(db)


@app.command("audit")
def audit_command(db: str = DB) -> None:
    """Verify the event chain and recompute every payout from the stored reports (train/mechanism.py)."""
    ledger = _existing_ledger(db)  # a missing file is answered before the audit's stack loads
    from walla.market.audit import audit

    try:
        problem, s = audit(ledger)
    finally:
        ledger.close()
    if problem is not None:
        raise fail(f"audit of {db}: {problem}")
    typer.echo(
        f"walla market audit: OK ({s['events']} events chained, {s['payouts']} payout rows recomputed over "
        f"{s['rounds']} rounds, max |stored - recomputed| {s['max_diff']:.2e})"
    )


@app.command("export")
def export_command(
    db: str = DB, to: Path = typer.Option(..., "--to", help="directory for the Parquet files")
) -> None:
    """Write the ledger's tables (reports, resolutions, payouts, events, ...) as Parquet files."""
    if to.exists() and not to.is_dir():
        raise fail(f"--to {to}: exists and is not a directory")
    ledger = _existing_ledger(db)
    from walla.market.export import export  # pyarrow: once the options hold

    try:
        written = export(ledger, to)
    except OSError as e:
        raise fail(f"--to {to}: {e.strerror or e}") from None
    finally:
        ledger.close()
    typer.echo(f"walla market export: {', '.join(f'{k} {n}' for k, n in written.items())} rows -> {to}")
