"""Atomic single-file writes, directory checksums and library versions (shared by every store writer).

A file is written to `<name>.<random>.tmp` in its own directory and `os.replace`d into place, so a
reader (or a process killed with SIGKILL mid-write) sees either the old file or the new one, never
half of one. Directories are committed by one `os.rename` after their marker file is written.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import uuid
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import polars as pl
from walla.store.fingerprint import file_checksum

TMP_SUFFIX = ".tmp"


def tmp_name(path: Path) -> Path:
    """A unique temp path next to `path` (same directory, so the final rename is atomic)."""
    return path.with_name(f"{path.name}.{uuid.uuid4().hex[:8]}{TMP_SUFFIX}")


def replace(src: Path, dst: Path) -> None:
    """os.replace; a module-level function so crash tests can interpose on every commit step."""
    os.replace(src, dst)


def write_atomic(path: Path, write: Callable[[Path], None]) -> Path:
    """Run `write(tmp)` then rename tmp onto `path`; the temp file is removed on any exception."""
    tmp = tmp_name(path)
    try:
        write(tmp)
        replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_json(path: Path, obj: dict) -> Path:
    text = json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    return write_atomic(path, lambda p: p.write_text(text, encoding="utf-8"))


def write_parquet(path: Path, df: pl.DataFrame) -> Path:
    # statistics off: they embed nothing we read, and keep identical data -> identical bytes
    return write_atomic(path, lambda p: df.write_parquet(p, compression="zstd", statistics=False))


def read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def dir_files(root: Path, exclude: tuple[str, ...] = ()) -> list[str]:
    """Relative POSIX paths of all files under root (sorted), skipping names in `exclude` and temp files."""
    out = []
    for dirpath, _, files in os.walk(root):
        for name in files:
            rel = Path(dirpath, name).relative_to(root).as_posix()
            if rel in exclude or name.endswith(TMP_SUFFIX):
                continue
            out.append(rel)
    return sorted(out)


def dir_checksums(root: Path, exclude: tuple[str, ...] = ()) -> dict[str, str]:
    """{relative path: "<algo>:<hex>"} of every file under root: the per-shard checksums `verify` recomputes."""
    return {rel: file_checksum(root / rel) for rel in dir_files(root, exclude)}


def dir_size(root: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            try:
                total += os.stat(os.path.join(dirpath, name)).st_size
            except FileNotFoundError:  # a writer renamed it meanwhile
                pass
    return total


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")


def library_versions() -> dict[str, str]:
    """Versions of the libraries that wrote an artifact (recorded, not hashed)."""
    out = {"python": platform.python_version()}
    for name in ("walla", "numpy", "polars", "pyarrow", "zarr"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "unknown"
    return out
