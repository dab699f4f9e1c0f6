"""Feature-store layout: directory/file names, store errors, and the shard bookkeeping that the writer,
the reader and the listing share (see features/format.py for the whole picture).
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

from walla.store import atomic
from walla.store.location import is_remote

FEATURES_DIR = "features"
ROWS_FILE = "rows.parquet"
HIDDEN_DIR = "hidden.zarr"
META_FILE = "meta.json"  # completion marker
WRITER_FILE = "writer.json"  # written when a write starts; checked on resume
SHARDS_DIR = "shards"
INCOMPLETE = ".incomplete"
LOCK = ".lock"

FS_DIR_RE = re.compile(r"^[0-9a-f]{16}(\.incomplete)?$")
SHARD_RE = re.compile(r"^rows-(\d{12})-(\d{12})\.parquet$")


class StoreError(ValueError):
    """A store artifact is missing, incomplete, locked, stale or corrupt (message says what to do)."""


class StaleSchemaError(StoreError):
    """A feature set written by another FEATURE_SCHEMA_VERSION."""


class IncompleteError(StoreError):
    """A feature set that was never committed (still writing, or the writer died)."""


class LockedError(StoreError):
    """Another process holds the writer lock of this feature set."""


def extract_command(model: str, dataset: str, variants: str | list[str], size: int | None = None) -> str:
    """The `walla extract` command that (re)creates feature sets; 'missing' errors quote it.

    `size`: rows of a generated dataset (its question table, hence its fingerprints, depend on it).
    """
    v = variants if isinstance(variants, str) else ",".join(variants)
    return f"walla extract --model {model} --dataset {dataset} --variants {v}" + (
        f" --size {size}" if size else ""
    )


def fix_command(fingerprint: str, store: Path, recreate: str) -> str:
    """The remedy a 'corrupt / stale / inconsistent' error quotes: remove the entry, then re-create it.

    Re-running the extraction alone is not enough: it would find the entry complete and keep it.
    """
    return f"fix: `walla store rm {fingerprint} --store {shlex.quote(str(store))} --yes && {on_store(recreate, store)}`"


def on_store(command: str, store: Path) -> str:
    """`command` pointed at `store`: a recorded command names the store it ran on, and stores move."""
    argv = shlex.split(command)
    if "--store" in argv[:-1]:
        argv[argv.index("--store") + 1] = str(store)
    elif argv[:2] == ["walla", "extract"]:
        argv += ["--store", str(store)]
    return shlex.join(argv)


def check_name(name: str, what: str) -> None:
    """Names become directory names: refuse anything that could escape or collide in the store layout."""
    if (
        not isinstance(name, str)
        or not name
        or "/" in name
        or "\\" in name
        or name.startswith(".")
        or name != name.strip()
    ):
        raise ValueError(
            f"{what} name {name!r} is not usable as a directory name (non-empty, no '/', no leading '.')"
        )


def remove_temp_files(root: Path) -> None:
    """Delete temp files of killed writes: ours (`*.tmp`) and zarr's chunk temps (`*.partial`).

    A remote store has none: its objects appear whole (one PUT) or not at all."""
    if is_remote(root):
        return
    for dirpath, _, files in os.walk(root):
        for name in files:
            if name.endswith((atomic.TMP_SUFFIX, ".partial")):
                os.unlink(os.path.join(dirpath, name))


def durable_shards(tmp: Path, gaps: bool = False) -> list[tuple[Path, int, int]]:
    """Committed shard files of an incomplete feature set, in row order.

    A sequential write's shards tile [0, end); with `gaps` (row ranges written by parallel workers)
    holes are allowed, overlaps never.
    """
    shards = []
    d = tmp / SHARDS_DIR
    for p in d.iterdir() if d.is_dir() else []:
        m = SHARD_RE.match(p.name)
        if m:
            shards.append((p, int(m.group(1)), int(m.group(2))))
    shards.sort(key=lambda s: s[1])
    expect = 0
    for p, start, end in shards:
        if start < expect or (start != expect and not gaps):
            raise StoreError(
                f"{p}: shard starts at row {start}, expected {expect}; the store was modified by hand"
            )
        expect = end
    return shards


def missing_pieces(
    shards: list[tuple[Path, int, int]], total: int, block: int
) -> list[list[tuple[int, int]]]:
    """Row ranges [a, b) not covered by `shards`, cut at multiples of `block` and grouped per block.

    One group is one task: with `block` a multiple of the zarr chunk rows, two groups never share a
    chunk, so parallel workers can write them at the same time.
    """
    groups: dict[int, list[tuple[int, int]]] = {}
    covered = [(s, e) for _, s, e in shards] + [(total, total)]
    pos = 0
    for s, e in covered:
        a = pos
        while a < s:
            b = min(s, (a // block + 1) * block)
            groups.setdefault(a // block, []).append((a, b))
            a = b
        pos = max(pos, e)
    return [groups[k] for k in sorted(groups)]
