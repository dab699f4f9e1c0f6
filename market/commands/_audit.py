"""The work of `walla market audit | export`: both read the ledger through one read-only connection.

    from walla.market import audit_commands as impl   # inside a command, once its options hold
    impl.audit_ledger("market.db", head=None, heads=[], key=None)
    impl.export_ledger("market.db", Path("out"))

cli/audit.py checks the options without importing anything heavy; each of its commands then imports this
module, once (SQLAlchemy, the audit's replay with the mechanism, pyarrow). Neither command writes to the
database it is given or creates a table in it (audit.open_readonly): an empty file or another program's
database stays as it was and gets one line, `not a walla market ledger (no table agents)`, exit 1.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import typer
from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError, SQLAlchemyError
from walla.cli.exits import DATA, UNREACHABLE
from walla.market.audit import audit, head_line, not_a_ledger, open_readonly
from walla.market.cli import fail, first_line
from walla.market.export import export


@contextmanager
def read_only(db: str, what: str) -> Iterator[Engine]:
    """The ledger at `db` opened read-only for the command `what` (audit, export); an error while it is
    open, reading included, is one line: `<what> of <db>: not a walla market ledger (...)` or `cannot open`
    (exit 3 for a database server that does not answer)."""
    try:
        engine = open_readonly(db)
    except (FileNotFoundError, ValueError) as e:
        raise fail(f"--db {db}: {e}") from None
    try:
        why = not_a_ledger(engine)
        if why is not None:
            raise fail(f"{what} of {db}: not a walla market ledger ({why})")
        yield engine
    except OperationalError as e:  # unreachable server (exit 3), unreadable file
        raise fail(
            f"{what} of {db}: cannot open ({first_line(e)})", UNREACHABLE if "://" in db else DATA
        ) from None
    except SQLAlchemyError as e:  # e.g. SQLite's "file is not a database"
        raise fail(f"{what} of {db}: not a walla market ledger ({first_line(e)})") from None
    finally:
        engine.dispose()


def audit_ledger(db: str, head: Path | None, heads: list, key: bytes | None) -> None:
    """`walla market audit`: OK and its counts, or one line naming the first bad row (exit 1). With `head`
    (its records `heads`, read by audit_heads.read_heads; `key` signs them), the chain is checked against
    every recorded head, and the current head appended after a clean audit."""
    with read_only(db, "audit") as engine:
        problem, s = audit(engine, heads, key, head_source=str(head))
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


def export_ledger(db: str, to: Path) -> None:
    """`walla market export`: every table of export.TABLES as to/<table>.parquet, read in one snapshot."""
    with read_only(db, "export") as engine:
        try:
            written = export(engine, to)
        except OSError as e:
            raise fail(f"--to {to}: {e.strerror or e}") from None
    typer.echo(f"walla market export: {', '.join(f'{k} {n}' for k, n in written.items())} rows -> {to}")
