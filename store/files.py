"""Reading store files with one-line errors: every failure names the file and what was expected.

A truncated Parquet file, a meta.json that is not JSON (or not UTF-8), a directory where a file should
be, a full disk: each becomes a StoreError (or an OSError carrying the path) whose message is one line,
so the CLIs print it without a traceback.

    meta = read_json(path / "meta.json")            # StoreError: "<path>: not valid JSON (...)"
    rows = read_parquet(path / "rows.parquet")
"""

from __future__ import annotations

import errno
import json
from pathlib import Path

import polars as pl
from walla.store.features import StoreError
from walla.store.location import as_location, is_remote, read_parquet_remote

_REASONS = {
    errno.ENOENT: "does not exist",
    errno.EISDIR: "is a directory, expected a file",
    errno.ENOTDIR: "a parent of it is a file, expected a directory",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.ENOSPC: "disk full (no space left on the device)",
    errno.EROFS: "read-only file system",
    errno.EDQUOT: "disk quota exceeded",
}


def describe_os_error(e: OSError, path: Path | str | None = None) -> str:
    """'<path>: <what went wrong>' for an OSError, in words (no '[Errno 21]')."""
    where = e.filename if e.filename is not None else path
    reason = _REASONS.get(e.errno, (e.strerror or str(e)).lower())
    return f"{where}: {reason}" if where is not None else reason


def read_json(path: Path, what: str = "a JSON object") -> dict:
    """The JSON object in `path`.

    Raises:
        StoreError: missing/unreadable file, not UTF-8, not valid JSON, or not an object (file named).
    """
    try:
        text = as_location(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise StoreError(f"{path}: not UTF-8 text, expected {what} (the file is corrupt)") from None
    except OSError as e:
        raise StoreError(describe_os_error(e, path)) from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise StoreError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}); expected {what}") from None
    if not isinstance(obj, dict):
        raise StoreError(f"{path}: expected {what}, got a JSON {type(obj).__name__}")
    return obj


def read_parquet(path: Path, columns: list[str] | None = None) -> pl.DataFrame:
    """A Parquet file as a DataFrame.

    Raises:
        StoreError: missing/unreadable file or not a readable Parquet file (the file named, one line).
    """
    try:
        if is_remote(path):
            return read_parquet_remote(path, columns)
        return pl.read_parquet(path, columns=columns)
    except OSError as e:
        raise StoreError(describe_os_error(e, path)) from None
    except Exception as e:  # polars: ComputeError, SchemaError, ...; pyarrow: ArrowInvalid
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise StoreError(f"{path}: not a readable Parquet file ({first})") from None
