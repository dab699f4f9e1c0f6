"""The market's key, held outside the database: it signs every event the server writes and every head line.

    keys = read_keys(Path("market.key"))   # or $WALLA_MARKET_KEY; [] when neither is set
    mac = event_mac(keys[0], event_hash)    # what events.append stores beside the chain's hash
    key_id(keys[0])                         # how the event log names a key (never the key itself)

A key file holds one key per line: the first signs, the lines below it are older keys. The audit picks
each event's key by the id its key event recorded; a server started with a new key above the old one
rotates (an event signed by the old key names the new one, ledger/chain.py). Standard library only: the
commands read and check their key before the ledger's stack loads.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

KEY_ENV = "WALLA_MARKET_KEY"
MIN_KEY = 16  # characters of a key line


def key_id(key: bytes) -> str:
    """A key's public name in the event log: 16 hex of HMAC(key, a fixed label); it does not reveal the key."""
    return hmac.new(key, b"walla market key id", hashlib.sha256).hexdigest()[:16]


def event_mac(key: bytes, event_hash: str) -> str:
    """An event's MAC: HMAC-SHA256 of its chain hash, which covers its fields and every event before it."""
    return hmac.new(key, b"walla market event " + event_hash.encode("ascii"), hashlib.sha256).hexdigest()


def verifies(mac: str, key: bytes, event_hash: str) -> bool:
    return hmac.compare_digest(mac.encode("ascii", "replace"), event_mac(key, event_hash).encode("ascii"))


def read_keys(path: Path | None) -> list[bytes]:
    """The keys in `path` (one a line, the signing key first), else $WALLA_MARKET_KEY's one; [] for neither.

    Raises:
        OSError, UnicodeDecodeError: the file cannot be read.
        ValueError: a key shorter than MIN_KEY characters, or a file with no key, naming where.
    """
    if path is not None:
        lines, where = path.read_text(encoding="utf-8").splitlines(), f"--key-file {path}"
    else:
        lines, where = os.environ.get(KEY_ENV, "").splitlines(), KEY_ENV
        if not "".join(lines).strip():
            return []
    keys = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if not keys:
        raise ValueError(f"{where}: holds no key (one key a line, the signing key first)")
    for n, k in enumerate(keys, start=1):
        if len(k) < MIN_KEY:
            raise ValueError(f"{where}: key {n} has {len(k)} characters, expected >= {MIN_KEY}")
    return [k.encode("utf-8") for k in keys]
