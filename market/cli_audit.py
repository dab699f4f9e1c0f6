"""`walla market audit | export`: check a ledger end to end, or write it out as Parquet.

    walla market audit --db market.db            # exit 0 "OK", or exit 1 with one line naming the first bad row
    walla market audit --db market.db --head market.heads --key-file audit.key   # the chain anchored
    walla market export --db market.db --to out/  # out/{reports,resolutions,payouts,events,...}.parquet

The ledger and the audit are imported inside the commands: `walla market --help` stays light.
"""

from __future__ import annotations

from pathlib import Path

import typer
from walla.cli import options
from walla.cli.exits import DATA, UNREACHABLE
from walla.market.cli_common import fail
from walla.market.cli_operator import open_ledger  # light: it imports the ledger when it opens one

app = options.app()

DB = typer.Option("market.db", "--db", help="SQLite file or SQLAlchemy URL (postgresql://user@host/db)")


def _existing_ledger(db: str):
    if "://" not in db and not Path(db).is_file():
        raise fail(f"--db {db}: no such ledger file")
    return open_ledger(db)


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
    from sqlalchemy.exc import OperationalError, SQLAlchemyError
    from walla.market.audit import audit, head_line, key_from, not_a_ledger, open_readonly, read_heads

    try:
        key = key_from(key_file)
        heads = read_heads(head) if head is not None else []
    except (OSError, UnicodeDecodeError) as e:
        raise fail(f"--head/--key-file: {e}") from None
    except ValueError as e:
        raise fail(f"--head {e}") from None
    try:
        engine = open_readonly(db)
    except (FileNotFoundError, ValueError) as e:
        raise fail(f"--db {db}: {e}") from None
    try:
        why = not_a_ledger(engine)
        if why is not None:
            raise fail(f"audit of {db}: not a walla market ledger ({why})")
        problem, s = audit(engine, heads, key, head_source=str(head))
    except OperationalError as e:  # unreachable server (exit 3), unreadable file
        raise fail(
            f"audit of {db}: cannot open ({str(getattr(e, 'orig', e) or e).splitlines()[0]})",
            UNREACHABLE if "://" in db else DATA,
        ) from None
    except SQLAlchemyError as e:  # e.g. SQLite's "file is not a database"
        why = str(getattr(e, "orig", e) or e).splitlines()[0]
        raise fail(f"audit of {db}: not a walla market ledger ({why})") from None
    finally:
        engine.dispose()
    if problem is not None:
        raise fail(f"audit of {db}: {problem}")
    eid, h = s["head"]
    if head is not None and (not heads or heads[-1][1:3] != (eid, h)):
        try:
            with head.open("a", encoding="utf-8") as f:  # append-only: past heads stay as they were checked
                f.write(head_line(eid, h, key) + "\n")
        except OSError as e:
            raise fail(f"--head {head}: cannot record the head ({e.strerror or e})") from None
    typer.echo(
        f"walla market audit: OK ({s['events']} events chained, every row proved from them, {s['payouts']} "
        f"payout rows recomputed over {s['rounds']} rounds, max |stored - recomputed| {s['max_diff']:.2e}; "
        f"head {eid} {h})"
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
