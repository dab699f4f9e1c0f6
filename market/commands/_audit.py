"""The work of `walla market audit | export`: both read the ledger through one read-only connection.

    from walla.market import audit_commands as impl   # inside a command, once its options hold
    impl.audit_ledger("market.db", head=None, heads=None, keys=[])
    impl.export_ledger("market.db", Path("out"))

cli/audit.py checks the options without importing anything heavy; each of its commands then imports this
module, once (SQLAlchemy, the audit's replay with the mechanism, pyarrow). Neither command writes to the
database it is given or creates a table in it (audit.open_readonly): an empty file or another program's
database stays as it was and gets one line, `not a walla market ledger (no table agents)`, exit 1.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import typer
from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError, SQLAlchemyError
from walla.cli.exits import DATA, UNREACHABLE
from walla.market.audit import audit, head_line, not_a_ledger, open_readonly, parse_heads
from walla.market.export import export
from walla.market.launch import fail, first_line


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


def audit_ledger(
    db: str, head: Path | None, heads: list | None, keys: list[bytes], new: bool = False
) -> None:
    """`walla market audit`: OK and its counts, or one line naming the first bad row (exit 1). With `head`
    (its records `heads`, read by audit_heads.read_heads, None when it does not exist; `new`: it is the
    first), the chain is checked against every recorded head, and the current head appended after a clean
    audit, signed with keys[0]. `keys` verify the events' MACs and the head lines."""
    with read_only(db, "audit") as engine:
        problem, s = audit(engine, heads, keys, str(head) if head is not None else None, new)
    if problem is not None:
        raise fail(f"audit of {db}: {problem}")
    eid, h = s["head"]
    signed_file = bool(heads) and heads[-1][3] is not None
    if head is not None and (not heads or heads[-1][1:3] != (eid, h)) and (keys or not signed_file):
        # (without the key, nothing is appended to a signed head file: an unsigned line would break it)
        try:
            append_head(head, eid, h, keys[0] if keys else None)
        except OSError as e:
            raise fail(f"--head {head}: cannot record the head ({e.strerror or e})") from None
        except ValueError as e:
            raise fail(f"--head {e}") from None
    typer.echo(f"walla market audit: OK ({', '.join(summary_parts(s))}; head {eid} {h})")
    if s["open_served"]:
        ids = ", ".join(map(str, s["open_served"][:20])) + (" ..." if len(s["open_served"]) > 20 else "")
        typer.echo(
            f"walla market audit: {len(s['open_served'])} served rounds still open (cut short, only some "
            f"reports: walla serve voids its own when it starts again or its database returns): {ids}"
        )


def summary_parts(s: dict) -> list[str]:
    """What the OK line says was proved, and of what it could not be sure (no key, no head file)."""
    n, signed_from = s["events"], s.get("signed_from")
    if signed_from is None:
        signed = "unsigned (no key_set event: anyone who can write the database could have written them)"
    else:
        unsigned = f"1..{signed_from - 1} unsigned, " if signed_from > 1 else ""
        checked = "MACs verified with the key" if s.get("checked") else "MACs not checked (no --key-file)"
        signed = f"{unsigned}signed from event {signed_from}, {checked}"
    anchored = "every row proved from them" if s["anchored"] else "chain not anchored (no --head)"
    return [
        f"{n} events chained",
        signed,
        anchored,
        f"{s['payouts']} payout rows recomputed over {s['rounds']} rounds",
        f"max |stored - recomputed| {s['max_diff']:.2e}",
    ]


def append_head(path: Path, eid: int, h: str, key: bytes | None) -> None:
    """Append head `eid h` to the head file, chained to its last line, under a lock (a server may append
    too); nothing when the file already ends with it. Heads only move forward.

    Raises:
        OSError: the file cannot be written. ValueError: its last head is ahead of `eid`.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "r+", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        text = f.read()
        heads, _ = parse_heads(text, str(path))
        if heads and heads[-1][1:3] == (eid, h):
            return
        if heads and heads[-1][1] > eid:
            raise ValueError(f"{path} line {heads[-1][0]}: head {heads[-1][1]} is ahead of the audited {eid}")
        prev = (heads[-1][3] or "") if heads else ""
        f.write(("" if not text or text.endswith("\n") else "\n") + head_line(eid, h, key, prev) + "\n")
        f.flush()
        os.fsync(f.fileno())


def export_ledger(db: str, to: Path) -> None:
    """`walla market export`: every table of export.TABLES as to/<table>.parquet, read in one snapshot."""
    with read_only(db, "export") as engine:
        try:
            written = export(engine, to)
        except OSError as e:
            raise fail(f"--to {to}: {e.strerror or e}") from None
    typer.echo(f"walla market export: {', '.join(f'{k} {n}' for k, n in written.items())} rows -> {to}")
