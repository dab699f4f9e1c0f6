"""Reading a feature set: every open verifies what it reads (layout in store/features/_format.py).

`read_feature_set(path)` checks completion (meta.json), the schema version, that every recorded file is
present, the xxh3 checksum of every file (on by default: ~1.3 GB/s on this 2-core machine; a 2 MB demo store adds < 1 ms), row counts, the
question_id order shared by rows.parquet / meta.json / the zarr attrs, and the hidden array's shape.
Any failure is ONE StoreError naming the file and the command that fixes it:

    fix: `walla store rm <fp> --store S --yes && walla extract --model M --dataset D --variants V ...`

(re-running the extraction alone would find the entry complete and keep it).
"""

from __future__ import annotations

import contextlib
import shlex
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import zarr
from walla.store.features._layout import (
    FEATURES_DIR,
    HIDDEN_DIR,
    INCOMPLETE,
    META_FILE,
    ROWS_FILE,
    WRITER_FILE,
    IncompleteError,
    StaleSchemaError,
    StoreError,
    extract_command,
    fix_command,
    on_store,
)
from walla.store.features._spec import FeatureSetSpec, question_ids_sha256
from walla.store.files import read_json, read_parquet
from walla.store.fingerprint import checksum_matches
from walla.store.location import as_location, missing_files, zarr_store
from walla.store.questions import generated_size, question_command
from walla.store.schema import FEATURE_SCHEMA_VERSION, ROW_COLUMNS


@dataclass
class FeatureSet:
    """A complete, verified feature set. `hidden` is lazy: index it to read rows."""

    rows: pl.DataFrame  # [N] rows, schema.ROW_COLUMNS
    hidden: zarr.Array  # [N, H] float16, same row order as rows
    meta: dict
    path: Path

    @property
    def fingerprint(self) -> str:
        return self.meta["fingerprint"]

    @property
    def hidden_size(self) -> int:
        return int(self.meta["hidden_size"])


def find_complete(store: Path, spec: FeatureSetSpec) -> Path | None:
    """Directory of the complete feature set with exactly this spec (current schema), else None."""
    path = spec.path(store)
    return path if (path / META_FILE).exists() else None


def store_of(path: Path) -> Path:
    """The store root of `<store>/features/<model>/<dataset>/<variant>/<fp>`."""
    path = as_location(path)
    parts = path.parts
    return path.parents[4] if len(parts) >= 5 and parts[-5] == FEATURES_DIR else path.parent


def recreate_command(path: Path, meta: dict) -> str:
    """The command that re-creates this feature set: recorded at commit, else its question table's (with
    this variant), else `walla extract` (with --size  for a generated dataset)."""
    if meta.get("command"):
        return meta["command"]
    parts = as_location(path).parts
    model, dataset, variant = (
        meta.get("model") or parts[-4],
        meta.get("dataset") or parts[-3],
        meta.get("variant") or parts[-2],
    )
    qfp = meta.get("questions_fp")
    if not qfp:  # meta.json unreadable: the writer's record names the question table
        with contextlib.suppress(StoreError, KeyError, TypeError):
            qfp = read_json(path / WRITER_FILE)["fingerprint_inputs"]["inputs"]["questions_fp"]
    store = store_of(path)
    qcmd = question_command(store, dataset, qfp)
    if qcmd and "--variants" in (argv := shlex.split(qcmd)):
        argv[argv.index("--variants") + 1] = variant
        return shlex.join(argv)
    return extract_command(model, dataset, variant, size=generated_size(store, dataset, qfp))


def read_feature_set(path: Path, verify: bool = True) -> FeatureSet:
    """Open a committed feature set after checking it is complete, current, intact and consistent.

    Args:
        path: the feature-set directory.
        verify: recompute every file checksum (default; xxh3, ~1.3 GB/s here). False skips only that step.
    Raises:
        IncompleteError, StaleSchemaError, StoreError: one line naming the file and the command that fixes it.
    """
    path = as_location(path)
    fp = path.name.removesuffix(INCOMPLETE)
    if path.name.endswith(INCOMPLETE):
        raise IncompleteError(
            f"feature set {path} is incomplete (still being written, or the writer died); "
            f"resume it with `{on_store(recreate_command(path, {}), store_of(path))}`"
        )
    if not (path / META_FILE).exists():
        raise IncompleteError(
            f"{path / META_FILE} is missing: {path} is not a committed feature set; "
            f"{fix_command(fp, store_of(path), recreate_command(path, {}))}"
        )
    try:
        meta = read_json(path / META_FILE, "the feature set's meta.json")
    except StoreError as e:
        raise StoreError(f"{e}; {fix_command(fp, store_of(path), recreate_command(path, {}))}") from None
    fix = fix_command(meta.get("fingerprint", fp), store_of(path), recreate_command(path, meta))
    if meta.get("schema_version") != FEATURE_SCHEMA_VERSION:
        raise StaleSchemaError(
            f"feature set {path} has schema version {meta.get('schema_version')}, this walla reads version "
            f"{FEATURE_SCHEMA_VERSION}; {fix}"
        )
    try:
        missing = missing_files(path, meta["checksums"])
        if missing:
            raise StoreError(f"{path / missing[0]} is missing ({len(missing)} file(s) of the feature set)")
        if verify:
            verify_checksums(path, meta)
        rows = read_parquet(path / ROWS_FILE)
        try:
            hidden = zarr.open_array(zarr_store(path / HIDDEN_DIR, read_only=True), mode="r")
        except Exception as e:  # zarr raises several types for a broken zarr.json
            raise StoreError(f"{path / HIDDEN_DIR}: not a readable zarr array ({type(e).__name__})") from None
        _check_consistent(path, meta, rows, hidden)
    except (StoreError, KeyError) as e:
        what = str(e) if isinstance(e, StoreError) else f"{path / META_FILE} lacks the key {e}"
        raise StoreError(f"{what}; {fix}") from None
    return FeatureSet(rows=rows, hidden=hidden, meta=meta, path=path)


def _check_consistent(path: Path, meta: dict, rows: pl.DataFrame, hidden: zarr.Array) -> None:
    n, h = meta["n_rows"], meta["hidden_size"]
    qsha = question_ids_sha256(rows["question_id"].to_list()) if "question_id" in rows.columns else None
    problems = []
    if rows.height != n:
        problems.append(f"{ROWS_FILE} has {rows.height} rows, {META_FILE} says {n}")
    if tuple(hidden.shape) != (n, h) or str(hidden.dtype) != "float16":
        problems.append(f"{HIDDEN_DIR} is {tuple(hidden.shape)} {hidden.dtype}, expected ({n}, {h}) float16")
    if qsha != meta["question_ids_sha256"] or hidden.attrs.get("question_ids_sha256") != qsha:
        problems.append(
            f"question_id order of {ROWS_FILE} differs from the order the hidden states were written in"
        )
    if rows.columns[: len(ROW_COLUMNS)] != list(ROW_COLUMNS):
        problems.append(f"{ROWS_FILE} columns {rows.columns} differ from schema.ROW_COLUMNS")
    if problems:
        raise StoreError(f"feature set {path} is inconsistent: {'; '.join(problems)}")


def verify_checksums(path: Path, meta: dict) -> None:
    """Recompute every file checksum; raise StoreError naming the first file that changed."""
    for rel, want in sorted(meta["checksums"].items()):
        try:
            ok = checksum_matches(path / rel, want)
        except OSError as e:
            raise StoreError(f"{path / rel}: cannot be read ({e.strerror})") from None
        if not ok:
            raise StoreError(
                f"checksum mismatch: {path / rel} changed after it was written (corrupt or edited)"
            )
