"""Listing and removing feature-set directories (complete, stale, being written, or left by a dead writer):
what `walla store ls` and `walla store rm` show and do, and how assembly finds candidates.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from walla.store.features import (
    FEATURES_DIR,
    FS_DIR_RE,
    INCOMPLETE,
    LOCK,
    META_FILE,
    ROWS_FILE,
    WRITER_FILE,
    LockedError,
    StoreError,
    durable_shards,
)
from walla.store.files import read_json
from walla.store.location import as_location, du, is_remote, rmtree, subdirs
from walla.store.schema import FEATURE_SCHEMA_VERSION


@dataclass
class FeatureSetInfo:
    """One directory under features/, complete or not (what `walla store ls` shows)."""

    model: str
    dataset: str
    variant: str
    fingerprint: str
    path: Path
    status: str  # complete | stale | corrupt (unreadable meta.json) | writing | incomplete
    n_rows: int | None  # total rows (when known)
    done_rows: int | None  # durable rows of an incomplete write
    hidden_size: int | None
    created_at: str | None
    schema_version: int | None
    questions_fp: str | None = None  # the question table the rows were cut from (complete sets)
    tier: str | None = None  # determinism tier its backend settled (bitwise | batch-recorded | tolerance)


def dir_size(root: Path) -> int:
    """Bytes of every file under root (files renamed away meanwhile are skipped)."""
    return du(root)


def _lock_held(lock_path: Path) -> bool:
    """True if a live process holds the flock (a dead writer's lock is released by the kernel)."""
    if is_remote(lock_path) or not lock_path.exists():
        return False
    with open(lock_path, "a") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
    return False


def _info(model: str, dataset: str, variant: str, d: Path) -> FeatureSetInfo:
    incomplete = d.name.endswith(INCOMPLETE)
    fp = d.name[: -len(INCOMPLETE)] if incomplete else d.name
    key = {"model": model, "dataset": dataset, "variant": variant, "fingerprint": fp, "path": d}
    if not incomplete and (d / META_FILE).exists():
        try:
            m = read_json(d / META_FILE)
        except StoreError:  # `walla store verify` names the file (read_feature_set)
            m = {"schema_version": None}
        if m.get("schema_version") is None:
            status = "corrupt"
        else:
            status = "complete" if m.get("schema_version") == FEATURE_SCHEMA_VERSION else "stale"
        return FeatureSetInfo(
            **key,
            status=status,
            n_rows=m.get("n_rows"),
            done_rows=m.get("n_rows"),
            hidden_size=m.get("hidden_size"),
            created_at=m.get("created_at"),
            schema_version=m.get("schema_version"),
            questions_fp=m.get("questions_fp"),
            tier=determinism_tier(m.get("inputs")),
        )
    w = {}
    with contextlib.suppress(StoreError):
        w = read_json(d / WRITER_FILE)
    done = 0
    if (d / ROWS_FILE).exists() or (d / META_FILE).exists():
        done = w.get("total_rows", 0)
    else:
        with contextlib.suppress(StoreError, OSError):
            done = sum(end - start for _, start, end in durable_shards(d, gaps=True))  # parallel: holes
    status = "writing" if _lock_held(d.with_name(fp + LOCK)) else "incomplete"
    return FeatureSetInfo(
        **key,
        status=status,
        n_rows=w.get("total_rows"),
        done_rows=done,
        hidden_size=w.get("hidden_size"),
        created_at=_mtime_iso(d / WRITER_FILE),
        schema_version=FEATURE_SCHEMA_VERSION if w else None,
        tier=determinism_tier((w.get("fingerprint_inputs") or {}).get("inputs")),
    )


def determinism_tier(inputs: dict | None) -> str | None:
    """The tier a feature set's inputs record (extract/backends: `determinism`); None for sets made before."""
    tier = (inputs or {}).get("determinism") if isinstance(inputs, dict) else None
    return tier if isinstance(tier, str) else None


def _mtime_iso(path: Path) -> str | None:
    try:
        return datetime.datetime.fromtimestamp(path.stat().st_mtime, datetime.timezone.utc).isoformat()
    except OSError:
        return None


def list_feature_sets(
    store: Path, model: str | None = None, dataset: str | None = None, variant: str | None = None
) -> list[FeatureSetInfo]:
    """Every feature-set directory (complete, stale, writing, incomplete), optionally filtered, sorted by path."""
    root = as_location(store) / FEATURES_DIR
    out = []
    for mdir in _subdirs(root, model):
        for ddir in _subdirs(mdir, dataset):
            for vdir in _subdirs(ddir, variant):
                for d in _subdirs(vdir, None):
                    if not FS_DIR_RE.match(d.name):  # e.g. a directory `rm` is deleting right now
                        continue
                    with contextlib.suppress(FileNotFoundError):  # removed or renamed while we looked
                        out.append(_info(mdir.name, ddir.name, vdir.name, d))
    return out


def _subdirs(root: Path, only: str | None) -> list[Path]:
    if only is not None:  # one name: no listing of its siblings
        return [root / only] if (root / only).is_dir() else []
    return subdirs(root)


def remove_feature_set(info: FeatureSetInfo) -> None:
    """Delete one feature-set directory (complete or not) and its lock file; refuses while it is being written."""
    lock_path = info.path.with_name(info.fingerprint + LOCK)
    if _lock_held(lock_path):
        raise LockedError(f"feature set {info.path} is being written right now; stop that writer first")
    remove_dir(info.path)
    lock_path.unlink(missing_ok=True)


def remove_dir(path: Path) -> None:
    """Rename a store directory away, then delete it: a reader never sees a half-deleted entry.

    Remote (no rename): meta.json, the commit marker, goes first, so readers refuse the rest at once."""
    if is_remote(path):
        (path / META_FILE).unlink(missing_ok=True)
        rmtree(path)
        return
    doomed = path.with_name(f"{path.name}.deleting-{os.getpid()}")
    os.rename(path, doomed)
    shutil.rmtree(doomed)
