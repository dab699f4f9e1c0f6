"""Atomic file operations, shared by every writer (store, train runs, caches).

A file is written to `<name>.<random>.tmp` in its own directory and `os.replace`d into place, so a
reader (or a process killed with SIGKILL mid-write) sees either the old file or the new one, never
half of one. Directories are committed by one rename (`replace`) after their marker file is written.
On a remote store (store/location.py) the file is written locally and uploaded in one PUT instead.

    write_json(path, {"a": 1})
    write_atomic(path, lambda tmp: df.write_csv(tmp))
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path

import polars as pl
from walla.store.location import is_remote, write_via_local

TMP_SUFFIX = ".tmp"


def tmp_name(path: Path) -> Path:
    """A unique temp path next to `path` (same directory, so the final rename is atomic)."""
    return path.with_name(f"{path.name}.{uuid.uuid4().hex[:8]}{TMP_SUFFIX}")


def replace(src: Path, dst: Path) -> None:
    """os.replace (files, or a directory onto a missing/empty one); module-level so crash tests interpose."""
    os.replace(src, dst)


def write_atomic(path: Path, write: Callable[[Path], None]) -> Path:
    """Run `write(tmp)` then rename tmp onto `path`; the temp file is removed on any exception."""
    if is_remote(path):
        write_via_local(path, write)
        return path
    tmp = tmp_name(path)
    try:
        write(tmp)
        replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        if e.filename is None:  # e.g. a full disk inside write(): say which file
            raise OSError(e.errno, e.strerror, str(path)) from e
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_text(path: Path, text: str) -> Path:
    return write_atomic(path, lambda p: p.write_text(text, encoding="utf-8"))


def write_json(path: Path, obj: dict, indent: int | None = 2) -> Path:
    return write_text(path, json.dumps(obj, indent=indent, sort_keys=True, ensure_ascii=False) + "\n")


def write_parquet(path: Path, df: pl.DataFrame) -> Path:
    # statistics off: they embed nothing we read, and keep identical data -> identical bytes
    return write_atomic(path, lambda p: df.write_parquet(p, compression="zstd", statistics=False))


def write_file(path: Path, write: Callable[[Path], None]) -> Path:
    """Atomically write one output file (a report's table or PNG), its directory made; an OSError becomes one
    line naming `path` (a ValueError: walla eval's one-line errors)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return write_atomic(path, write)
    except OSError as e:
        raise ValueError(f"cannot write {path}: {e.strerror or e}") from None
