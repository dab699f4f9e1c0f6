"""The audit's anchor outside the database: the head file, one `EVENT_ID HASH [HMAC]` per line.

    heads = read_heads(Path("market.heads"))   # None for a missing file; ValueError names a bad line
    problem = check_heads(event_rows, heads, keys, "market.heads")   # None when every line holds

A line's HMAC (under the market's key, _keys.py) covers the line before it too: HMAC(key, "PREV ID HASH"),
PREV the previous line's HMAC ("ID HASH" alone on line 1). The lines are a hash chain of heads, so with the
key a reordered, edited or removed line fails at the first line after it; without it, heads must still move
forward (an event id below the line before fails). Whether lines were cut from the end, or the whole file
deleted, the lines alone cannot say: the ledger can, since a server notes each head line it writes in a
signed head_recorded event (ledger/chain.py), and the file must hold the last one noted.

Standard library only: `walla market audit` reads --head and --key-file before it imports the ledger and
the mechanism, so a mistake in either answers at once (audit/prove.py does the rest).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path

Head = tuple[int, int, str, str | None]  # (line number, event id, hash, hmac or None)


def sign(eid: int, h: str, key: bytes, prev: str = "") -> str:
    message = f"{prev} {eid} {h}" if prev else f"{eid} {h}"
    return hmac.new(key, message.encode(), hashlib.sha256).hexdigest()


def head_line(eid: int, h: str, key: bytes | None, prev: str = "") -> str:
    """One line of the head file: `ID HASH`, and its HMAC (chained to `prev`, the line before's) with a key."""
    return f"{eid} {h}" + (f" {sign(eid, h, key, prev)}" if key is not None else "")


def identity(head: Head) -> str:
    """What names a head file: its first line's HMAC, or hash when unsigned (head_recorded's `first`)."""
    return head[3] or head[2]


def parse_heads(text: str, source: str) -> tuple[list[Head], int]:
    """The records of a head file's text, and its number of lines.

    Raises:
        ValueError: a line that is not `ID HASH [HMAC]`, naming the file and line.
    """
    out, lines = [], text.splitlines()
    for n, line in enumerate(lines, start=1):
        parts = line.split()
        if not parts or parts[0].startswith("#"):
            continue
        if len(parts) not in (2, 3) or not parts[0].isdigit() or len(parts[1]) != 64:
            raise ValueError(f"{source} line {n}: expected 'EVENT_ID HASH [HMAC]', got {line[:80]!r}")
        out.append((n, int(parts[0]), parts[1], parts[2] if len(parts) == 3 else None))
    return out, len(lines)


def read_heads(path: Path) -> list[Head] | None:
    """The head file's records; None for a file that does not exist (the audit decides if it should).

    Raises:
        ValueError: a line that is not `ID HASH [HMAC]`, naming the file and line.
    """
    if not path.exists():
        return None
    return parse_heads(path.read_text(encoding="utf-8"), str(path))[0]


def check_heads(
    event_rows: list, heads: list[Head] | None, keys: list[bytes], source: str, new: bool = False
) -> str | None:
    """The first recorded head the chain does not contain, whose HMAC does not verify or that moves back, or
    the last line a head_recorded event noted for `source` and the file no longer holds; as one line.
    `heads` None: the file does not exist, which only `new` (--new-head-file) allows once lines were noted."""
    noted = noted_in(event_rows, source)
    if heads is None:
        if noted and not new:
            eid, d = noted[-1]
            return (
                f"{source}: no such head file, but the ledger's event {eid} (head_recorded) says line "
                f"{d['line']} was written to it (deleted? --new-head-file starts a new one)"
            )
        heads, noted = [], []  # a new file: the lines noted were another file's
    by_id = {r.id: r.hash for r in event_rows}
    prev, before = "", None
    for n, eid, h, mac in heads:
        if keys and (mac is None or not any(hmac.compare_digest(mac, sign(eid, h, k, prev)) for k in keys)):
            return (
                f"{source} line {n}: its HMAC does not verify with the key (the head file was edited, "
                "reordered, or a line before it removed)"
            )
        if before is not None and eid < before[1]:
            return (
                f"{source} line {n}: head {eid} is older than line {before[0]}'s head {before[1]} (heads only "
                "move forward: the lines were reordered?)"
            )
        if eid not in by_id:
            return (
                f"events: the chain ends at row {len(event_rows)}, but {source} line {n} recorded row {eid} "
                "(events were deleted and the chain rewritten)"
            )
        if by_id[eid] != h:
            return f"events: row {eid}'s hash is not the one {source} line {n} recorded (the chain was rewritten)"
        prev, before = mac or "", (n, eid)
    return holds_noted(heads, noted, source)


def noted_in(event_rows: list, source: str) -> list[tuple[int, dict]]:
    """The head_recorded events of the file at `source` (the path a server wrote, resolved), oldest first."""
    path = str(Path(source).resolve())
    out = []
    for r in event_rows:
        if r.kind == "head_recorded":
            d = json.loads(r.data)
            if isinstance(d, dict) and d.get("file") == path:
                out.append((r.id, d))
    return out


def holds_noted(heads: list[Head], noted: list[tuple[int, dict]], source: str) -> str | None:
    """The last noted line of this file (the noted lines whose first line is this file's) must be in it; an
    empty file holds none of the lines noted."""
    if not heads and noted:
        eid, d = noted[-1]
        return (
            f"{source}: holds no head, but the ledger's event {eid} (head_recorded) says line {d['line']} was "
            "written (the head file was cut)"
        )
    mine = [(eid, d) for eid, d in noted if heads and d.get("first") == identity(heads[0])]
    if not mine:
        return None
    eid, d = mine[-1]
    have = {n: (head, h, mac) for n, head, h, mac in heads}
    if d["line"] not in have:
        return (
            f"{source}: ends at line {heads[-1][0]}, but the ledger's event {eid} (head_recorded) says line "
            f"{d['line']} was written (the head file was cut)"
        )
    head, _, mac = have[d["line"]]
    if head != d["head"] or mac != d.get("mac"):
        return f"{source} line {d['line']} is not the head the ledger's event {eid} (head_recorded) noted"
    return None
