"""Canonical question tables: one per dataset content, stored once and shared by all its feature sets.

Layout: `<store>/questions/<dataset>/<fp>/questions.parquet` + `meta.json` (the completion marker).
The fingerprint covers the dataset name, the table's content (every column, in canonical order) and
the schema version, so writing the same table twice is a no-op that returns the same key, and the
feature sets extracted from it name it in their inputs (`questions_fp`).

    fp = write_question_table(store, "facts", df, source={"generator": {"n": 1000, "seed": 42}})
    df, fp = read_question_table(store, "facts")          # newest table of that dataset
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import uuid
from pathlib import Path

import numpy as np
import polars as pl
from walla.store import atomic
from walla.store.features import StoreError, check_name, fix_command
from walla.store.files import read_json, read_parquet
from walla.store.fingerprint import canonical, checksum_matches, file_checksum, fingerprint
from walla.store.listing import list_feature_sets
from walla.store.location import as_location, is_remote, subdirs
from walla.store.provenance import library_versions, now_iso
from walla.store.schema import FEATURE_SCHEMA_VERSION, QUESTION_COLUMNS, SPLITS

QUESTIONS_DIR = "questions"
TABLE_FILE = "questions.parquet"
META_FILE = "meta.json"

QUESTION_DTYPES: dict[str, pl.DataType] = {
    "question_id": pl.String(),
    "split": pl.String(),
    "question": pl.String(),
    "options": pl.List(pl.String()),
    "option_labels": pl.List(pl.String()),
    "label": pl.Int64(),
    "gold_dist": pl.List(pl.Float64()),
    "context": pl.String(),
    "subject": pl.String(),
}
assert list(QUESTION_DTYPES) == list(QUESTION_COLUMNS)
NULLABLE = {"gold_dist", "context", "subject"}


def validate_question_table(df: pl.DataFrame, dataset: str) -> pl.DataFrame:
    """Check a question table against schema.QUESTION_COLUMNS; return it cast, in canonical column order.

    Raises:
        ValueError: one message listing every problem found (missing/extra columns, bad types,
            duplicate ids, unknown splits, labels out of range, option/label count mismatches,
            gold distributions that do not sum to 1).
    """
    where = f"question table of dataset {dataset!r}"
    missing = [c for c in QUESTION_COLUMNS if c not in df.columns]
    extra = [c for c in df.columns if c not in QUESTION_COLUMNS]
    if missing or extra:
        raise ValueError(
            f"{where}: missing columns {missing}, unexpected columns {extra}; expected exactly {list(QUESTION_COLUMNS)}"
        )
    if df.height == 0:
        raise ValueError(f"{where} has no rows")
    try:
        df = df.select([pl.col(c).cast(t, strict=True) for c, t in QUESTION_DTYPES.items()])
    except Exception as e:  # polars raises several exception types for bad casts
        raise ValueError(
            f"{where}: a column has the wrong type ({e.__class__.__name__}: {str(e).splitlines()[0]})"
        ) from e

    problems: list[str] = []
    for c in QUESTION_COLUMNS:
        if c not in NULLABLE and (n := df[c].null_count()):
            problems.append(f"column {c!r} has {n} null value(s)")
    ids = df["question_id"]
    if ids.n_unique() != df.height:
        dup = ids.filter(ids.is_duplicated()).unique().head(3).to_list()
        problems.append(f"question_id is not unique (e.g. {dup})")
    bad_split = df.filter(~pl.col("split").is_in(list(SPLITS)))
    if bad_split.height:
        problems.append(
            f"split must be one of {SPLITS}; row {bad_split['question_id'][0]!r} has {bad_split['split'][0]!r}"
        )
    n_opt = df["options"].list.len()
    bad = df.filter((n_opt < 2) | (n_opt > 26))
    if bad.height:
        problems.append(
            f"question {bad['question_id'][0]!r} has {bad['options'].list.len()[0]} options; expected 2..26"
        )
    bad = df.filter(pl.col("option_labels").list.len() != n_opt)
    if bad.height:
        problems.append(f"question {bad['question_id'][0]!r}: option_labels and options differ in length")
    bad = df.filter((pl.col("label") < 0) | (pl.col("label") >= n_opt))
    if bad.height:
        problems.append(
            f"question {bad['question_id'][0]!r} has label {bad['label'][0]} outside 0..{bad['options'].list.len()[0] - 1}"
        )
    gd = df.filter(pl.col("gold_dist").is_not_null())
    if gd.height:
        bad = gd.filter(pl.col("gold_dist").list.len() != pl.col("options").list.len())
        if bad.height:
            problems.append(
                f"question {bad['question_id'][0]!r}: gold_dist length differs from its option count"
            )
        else:
            sums = gd["gold_dist"].list.sum().to_numpy()
            mins = gd["gold_dist"].list.min().to_numpy()
            off = np.flatnonzero((np.abs(sums - 1.0) > 1e-6) | (mins < 0) | ~np.isfinite(sums))
            if off.size:
                problems.append(
                    f"question {gd['question_id'][int(off[0])]!r}: gold_dist must be >= 0 and sum to 1 "
                    f"(sum {sums[off[0]]:.6g})"
                )
    if problems:
        raise ValueError(f"{where}: " + "; ".join(problems))
    return df


def table_content_sha256(df: pl.DataFrame) -> str:
    """sha256 of a validated table's content: canonical JSON of each column in schema order.

    Independent of Parquet encoder versions (unlike hashing the file), so the same questions always
    get the same key.
    """
    h = hashlib.sha256()
    for c in QUESTION_COLUMNS:
        h.update(c.encode())
        h.update(json.dumps(canonical(df[c].to_list()), ensure_ascii=False, allow_nan=False).encode("utf-8"))
    return h.hexdigest()


def question_table_fingerprint(dataset: str, content_sha256: str) -> str:
    """Fingerprint of a table: dataset name + content hash + schema version."""
    return fingerprint(
        {
            "kind": "questions",
            "dataset": dataset,
            "content_sha256": content_sha256,
            "schema_version": FEATURE_SCHEMA_VERSION,
        }
    )


def question_dir(store: Path, dataset: str, fp: str) -> Path:
    return as_location(store) / QUESTIONS_DIR / dataset / fp


def write_question_table(
    store: Path, dataset: str, df: pl.DataFrame, source: dict, command: str | None = None
) -> str:
    """Validate and store a dataset's canonical question table once; return its fingerprint.

    Idempotent: an existing complete table with the same content is left alone. The table is written
    into a private temp directory and renamed into place, so concurrent writers of the same table
    never see each other's partial files (the loser of the rename discards its copy).

    Args:
        store: store root.
        dataset: dataset short name (datasets.yaml key).
        df: the table, columns = schema.QUESTION_COLUMNS.
        source: where it came from (hub id/split, local file, generator params); recorded in meta.json.
        command: the command line that re-creates it (recorded; quoted by the reader's errors).
    Returns:
        The table's 16-hex fingerprint.
    Raises:
        StoreError: a table with this fingerprint exists but fails verification (fix named).
    """
    check_name(dataset, "dataset")
    df = validate_question_table(df, dataset)
    content = table_content_sha256(df)
    fp = question_table_fingerprint(dataset, content)
    final = question_dir(store, dataset, fp)
    if (final / META_FILE).exists():
        _verify(final, read_json(final / META_FILE), dataset)  # never build on a corrupt table
        return fp
    final.parent.mkdir(parents=True, exist_ok=True)
    remote = is_remote(final)  # remote: written in place, committed by meta.json (no directory rename)
    tmp = final if remote else final.with_name(f"{fp}.{uuid.uuid4().hex[:8]}.incomplete")
    tmp.mkdir()
    try:
        atomic.write_parquet(tmp / TABLE_FILE, df)
        counts = df["split"].value_counts()
        meta = {
            "kind": "questions",
            "schema_version": FEATURE_SCHEMA_VERSION,
            "fingerprint": fp,
            "dataset": dataset,
            "source": canonical(source),
            "content_sha256": content,
            "n_rows": df.height,
            "split_counts": {s: int(n) for s, n in zip(counts["split"], counts["count"], strict=True)},
            "checksums": {TABLE_FILE: file_checksum(tmp / TABLE_FILE)},
            "versions": library_versions(),
            "created_at": now_iso(),
            "command": command,
        }
        atomic.write_json(tmp / META_FILE, meta)
        try:
            if not remote:
                atomic.replace(tmp, final)
        except OSError:
            if not (final / META_FILE).exists():  # not a lost race: a real failure
                raise
    finally:
        if not remote:
            shutil.rmtree(tmp, ignore_errors=True)
    return fp


def question_table_dirs(store: Path, dataset: str | None = None) -> list[Path]:
    """Directories of committed question tables (a meta.json; not `.incomplete` / `.deleting`), sorted."""
    out = []
    for ds_dir in subdirs(as_location(store) / QUESTIONS_DIR):
        if dataset is not None and ds_dir.name != dataset:
            continue
        out.extend(d for d in subdirs(ds_dir) if "." not in d.name and (d / META_FILE).exists())
    return out


def read_question_meta(d: Path) -> dict:
    """meta.json of the question table in `d` (+ its "path").

    Raises:
        StoreError: unreadable / not JSON / not UTF-8 (the file and the fix named).
    """
    try:
        meta = read_json(d / META_FILE, "the question table's meta.json")
    except StoreError as e:
        store = d.parents[2]
        fix = fix_command(d.name, store, recreate_question_command(store, d.parent.name, d.name))
        raise StoreError(f"{e}; {fix}") from None
    meta["path"] = str(d)
    return meta


def list_question_tables(store: Path, dataset: str | None = None) -> list[dict]:
    """meta.json of every complete question table (optionally of one dataset), newest first."""
    metas = [read_question_meta(d) for d in question_table_dirs(store, dataset)]
    return sorted(metas, key=lambda m: m.get("created_at", ""), reverse=True)


def read_question_table(
    store: Path, dataset: str, fp: str | None = None, verify: bool = True
) -> tuple[pl.DataFrame, str]:
    """Read a dataset's question table: the one with fingerprint `fp` (a unique prefix works), else the newest.

    Args:
        verify: recompute the file checksums (default); the schema version, row count and columns are
            always checked.
    Raises:
        FileNotFoundError: no such table (the message says which `walla extract` creates one).
        StoreError: schema version mismatch, unreadable/corrupt file or checksum mismatch (file and fix named).
    """
    tables = list_question_tables(store, dataset)
    if fp is not None:
        tables = [t for t in tables if t["fingerprint"].startswith(fp)]
    if not tables:
        what = (
            f"question table {fp!r} of dataset {dataset!r}"
            if fp
            else f"question table of dataset {dataset!r}"
        )
        raise FileNotFoundError(
            f"no {what} in store {store}; create it with `walla extract --model <model> --dataset {dataset}`"
        )
    if fp is not None and len({t["fingerprint"] for t in tables}) > 1:
        raise ValueError(
            f"fingerprint prefix {fp!r} matches several question tables of {dataset!r}; give more characters"
        )
    meta = tables[0]
    path = as_location(meta["path"])
    df = _verify(path, meta, dataset, checksums=verify)
    return df, meta["fingerprint"]


def _verify(path: Path, meta: dict, dataset: str, checksums: bool = True) -> pl.DataFrame:
    """The table in `path` after checking schema version, checksums, rows and columns against meta.json."""
    store = path.parents[2]
    fix = fix_command(path.name, store, recreate_question_command(store, dataset, path.name, meta))
    if meta.get("schema_version") != FEATURE_SCHEMA_VERSION:
        raise StoreError(
            f"question table {path} has schema version {meta.get('schema_version')}, this walla reads "
            f"{FEATURE_SCHEMA_VERSION}; {fix}"
        )
    try:
        for rel, want in meta["checksums"].items() if checksums else ():
            if not (path / rel).is_file() or not checksum_matches(path / rel, want):
                raise StoreError(
                    f"checksum mismatch: {path / rel} is missing or changed after it was written"
                )
        df = read_parquet(path / TABLE_FILE)
    except StoreError as e:
        raise StoreError(f"{e}; {fix}") from None
    if df.height != meta["n_rows"] or df.columns != list(QUESTION_COLUMNS):
        raise StoreError(
            f"question table {path / TABLE_FILE} does not match its meta.json (rows or columns); {fix}"
        )
    return df


def recreate_question_command(store: Path, dataset: str, fp: str, meta: dict | None = None) -> str:
    """The command that re-creates question table `fp`: recorded in its meta.json or in a feature set's."""
    if meta and meta.get("command"):
        return meta["command"]
    for info in list_feature_sets(store, dataset=dataset):
        if info.questions_fp == fp:
            with contextlib.suppress(StoreError):
                if cmd := read_json(info.path / META_FILE).get("command"):
                    return cmd
    n = _size_of(meta or {})
    return f"walla extract --model <model> --dataset {dataset}" + (f" --size {n}" if n else "")


def question_command(store: Path, dataset: str, fp: str | None) -> str | None:
    """The command recorded in question table `fp`'s meta.json, if any."""
    if not fp:
        return None
    with contextlib.suppress(StoreError):
        return read_json(question_dir(store, dataset, fp) / META_FILE).get("command")
    return None


def _size_of(meta: dict) -> int | None:
    source = meta.get("source") or {}
    return (source.get("params") or {}).get("n") if source.get("generator") else None


def generated_size(store: Path, dataset: str, fp: str | None) -> int | None:
    """Rows of a generated dataset's question table `fp` (what `--size` / `SIZE=` must repeat), else None."""
    if not fp:
        return None
    with contextlib.suppress(StoreError):
        return _size_of(read_json(question_dir(store, dataset, fp) / META_FILE))
    return None
