"""The audit's anchor outside the database: the head file (`EVENT_ID HASH [HMAC]` per line) and its key.

    heads = read_heads(Path("market.heads"))       # [] for a file not yet written; ValueError names a bad line
    key = key_from(Path("audit.key"))              # or $WALLA_MARKET_AUDIT_KEY; None: heads unsigned
    problem = check_heads(event_rows, heads, key)  # None when the chain holds every recorded head

Standard library only: `walla market audit` reads and checks --head and --key-file before it imports the
ledger and the mechanism, so a mistake in either answers at once (audit/prove.py does the rest).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

KEY_ENV = "WALLA_MARKET_AUDIT_KEY"


def sign(eid: int, h: str, key: bytes) -> str:
    return hmac.new(key, f"{eid} {h}".encode(), hashlib.sha256).hexdigest()


def head_line(eid: int, h: str, key: bytes | None) -> str:
    """One line of the head file: `ID HASH`, and its HMAC when a key is given."""
    return f"{eid} {h}" + (f" {sign(eid, h, key)}" if key is not None else "")


def read_heads(path: Path) -> list[tuple[int, int, str, str | None]]:
    """The head file's records: (line number, event id, hash, hmac or None); [] for a file not yet written.

    Raises:
        ValueError: a line that is not `ID HASH [HMAC]`, naming the file and line.
    """
    if not path.exists():
        return []
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        parts = line.split()
        if not parts or parts[0].startswith("#"):
            continue
        if len(parts) not in (2, 3) or not parts[0].isdigit() or len(parts[1]) != 64:
            raise ValueError(f"{path} line {n}: expected 'EVENT_ID HASH [HMAC]', got {line[:80]!r}")
        out.append((n, int(parts[0]), parts[1], parts[2] if len(parts) == 3 else None))
    return out


def check_heads(event_rows: list, heads: list, key: bytes | None, source: str = "head file") -> str | None:
    """The first recorded head the chain does not contain (or whose HMAC does not verify), as one line."""
    by_id = {r.id: r.hash for r in event_rows}
    for n, eid, h, mac in heads:
        if key is not None and (mac is None or not hmac.compare_digest(mac, sign(eid, h, key))):
            return f"{source} line {n}: its HMAC does not verify with the key (the head file was edited?)"
        if eid not in by_id:
            return (
                f"events: the chain ends at row {len(event_rows)}, but {source} line {n} recorded row {eid} "
                "(events were deleted and the chain rewritten)"
            )
        if by_id[eid] != h:
            return f"events: row {eid}'s hash is not the one {source} line {n} recorded (the chain was rewritten)"
    return None


def key_from(path: Path | None) -> bytes | None:
    """The audit key: the file's first line, else $WALLA_MARKET_AUDIT_KEY, else None (heads unsigned)."""
    if path is not None:
        text = path.read_text(encoding="utf-8").strip()
    else:
        text = os.environ.get(KEY_ENV, "").strip()
    return text.encode("utf-8") if text else None
