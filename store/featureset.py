"""Feature sets: one (model, dataset, prompt variant) extraction, keyed by a content fingerprint.

Layout (readable path, hash last):

    <store>/features/<model>/<dataset>/<variant>/<fp>/          complete: the only kind readers accept
        rows.parquet      schema.ROW_COLUMNS (+ optional "prompt"), one row per question
        hidden.zarr/      [N, H] float16, chunked along rows only (~4 MiB chunks), same row order
        writer.json       shape and inputs the writer was opened with
        meta.json         fingerprint inputs, counts, per-file checksums, versions: written LAST
    <store>/features/<model>/<dataset>/<variant>/<fp>.incomplete/   a write in progress (or killed)
        shards/rows-<start>-<end>.parquet   one per durable shard
    <store>/features/<model>/<dataset>/<variant>/<fp>.lock          filelock: one writer per key

Write protocol (every step is an atomic rename, so SIGKILL anywhere leaves a resumable state):
  1. hidden rows of a shard go into the zarr array (each chunk file is replaced atomically by zarr),
  2. then the shard's rows are renamed into shards/ -- this rename makes the shard durable,
  3. commit(): shards -> rows.parquet, checksums, meta.json, then one rename `<fp>.incomplete` -> `<fp>`.
A rerun reopens the `.incomplete` dir and resumes after the last durable shard (`done_rows`); chunks
touched by a killed shard are simply rewritten, so the result is byte-identical to an uninterrupted run.

    spec = FeatureSetSpec("smollm2-135m", "facts", "none", inputs={...,"questions_fp": qfp})
    with open_writer(store, spec, hidden_size=576, total_rows=len(rows)) as w:
        for start in range(w.done_rows, n, 256):
            w.write_shard(rows[start:start + 256], hidden[start:start + 256])
        w.commit()
    fs = read_feature_set(find_complete(store, spec))     # fs.rows, fs.hidden (lazy zarr), fs.meta
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import filelock
import numpy as np
import polars as pl
import zarr
from walla.store import atomic
from walla.store.fingerprint import canonical, checksum_matches, fingerprint
from walla.store.layout import (  # noqa: F401  (re-exported: the store API lives in this module)
    FEATURES_DIR,
    HIDDEN_DIR,
    INCOMPLETE,
    LOCK,
    META_FILE,
    ROWS_FILE,
    SHARDS_DIR,
    WRITER_FILE,
    IncompleteError,
    LockedError,
    StaleSchemaError,
    StoreError,
    check_name,
    durable_shards,
    extract_command,
    remove_temp_files,
)
from walla.store.listing import FeatureSetInfo, list_feature_sets, remove_feature_set  # noqa: F401
from walla.store.rows import ROW_DTYPES, validate_rows  # noqa: F401
from walla.store.schema import FEATURE_SCHEMA_VERSION, ROW_COLUMNS, VARIANTS

CHUNK_BYTES = 4 << 20  # target bytes per zarr chunk (zarr guide: >= ~1 MB; one file per chunk)


@dataclass(frozen=True)
class FeatureSetSpec:
    """What a feature set is: (model, dataset, variant) plus every resolved input that shaped its bytes.

    `inputs` comes from the extract stage: model id + revision or GGUF file hash, backend + version,
    dtype, dataset source + split, prompt template text, option tokens, and `questions_fp` (the
    fingerprint write_question_table returned; required -- assembly joins on it). Anything that changes
    which rows are extracted (e.g. a row limit) must be in it too.
    """

    model: str
    dataset: str
    variant: str
    inputs: dict = field(hash=False)

    def __post_init__(self) -> None:
        check_name(self.model, "model")
        check_name(self.dataset, "dataset")
        if self.variant not in VARIANTS:
            raise ValueError(f"variant {self.variant!r} is not one of {VARIANTS}")
        if not isinstance(self.inputs, dict):
            raise TypeError(f"FeatureSetSpec.inputs must be a dict, got {type(self.inputs).__name__}")
        qfp = self.inputs.get("questions_fp")
        if not isinstance(qfp, str) or not qfp:
            raise ValueError(
                "FeatureSetSpec.inputs must contain 'questions_fp': the fingerprint returned by "
                "write_question_table for the question table these rows were extracted from"
            )
        canonical(self.inputs)  # fail now, not at commit, on unhashable inputs

    def fingerprint_inputs(self) -> dict:
        """Everything hashed into the key (recorded verbatim in meta.json and the zarr attrs)."""
        return {
            "kind": "features",
            "model": self.model,
            "dataset": self.dataset,
            "variant": self.variant,
            "inputs": self.inputs,
            "schema_version": FEATURE_SCHEMA_VERSION,
        }

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.fingerprint_inputs())

    def path(self, store: Path) -> Path:
        return Path(store) / FEATURES_DIR / self.model / self.dataset / self.variant / self.fingerprint


# ---------------------------------------------------------------------------------------------------------
# writing


def _write_hidden(arr: zarr.Array, start: int, hidden: np.ndarray) -> None:
    """Region write of one shard's hidden states (module-level so crash tests can interpose)."""
    arr[start : start + hidden.shape[0]] = hidden


def _qid_sha256(ids: list[str]) -> str:
    """Hash of the row order: readers compare it between rows.parquet, meta.json and the zarr attrs."""
    return hashlib.sha256("\n".join(ids).encode("utf-8")).hexdigest()


def default_chunk_rows(hidden_size: int, total_rows: int) -> int:
    return int(max(1, min(total_rows, -(-CHUNK_BYTES // (2 * hidden_size)))))


class FeatureSetWriter:
    """Resumable shard writer of one feature set; obtain it from `open_writer` (which holds the lock)."""

    def __init__(
        self, store: Path, spec: FeatureSetSpec, hidden_size: int, total_rows: int, chunk_rows: int | None
    ):
        if not (isinstance(hidden_size, int) and hidden_size > 0):
            raise ValueError(f"hidden_size must be a positive int, got {hidden_size!r}")
        if not (isinstance(total_rows, int) and total_rows > 0):
            raise ValueError(f"total_rows must be a positive int, got {total_rows!r}")
        self.spec = spec
        self.fingerprint = spec.fingerprint
        self.hidden_size = hidden_size
        self.total_rows = total_rows
        self.final = spec.path(store)
        self.tmp = self.final.with_name(self.final.name + INCOMPLETE)
        self.complete = False
        self.done_rows = 0
        self._ids: set[str] = set()
        self._columns: list[str] | None = None  # columns of the first shard; later shards must match
        self._arr: zarr.Array | None = None
        want = {
            "fingerprint": self.fingerprint,
            "hidden_size": hidden_size,
            "total_rows": total_rows,
            "chunk_rows": chunk_rows or default_chunk_rows(hidden_size, total_rows),
        }
        if (self.final / META_FILE).exists():
            self._open_complete(want)
        elif self.final.exists():
            raise StoreError(
                f"{self.final} exists but has no {META_FILE}: not written by walla; remove it "
                f"(`walla-store rm {self.fingerprint}`) and re-run"
            )
        elif (self.tmp / WRITER_FILE).exists():
            self._resume(want)
        else:
            self._start(want)

    # -- opening -------------------------------------------------------------------------------------------

    def _open_complete(self, want: dict) -> None:
        meta = atomic.read_json(self.final / META_FILE)
        if (meta["hidden_size"], meta["n_rows"]) != (want["hidden_size"], want["total_rows"]):
            raise StoreError(
                f"{self.final} is complete with {meta['n_rows']} rows x hidden {meta['hidden_size']}, but the writer "
                f"was opened for {want['total_rows']} x {want['hidden_size']} under the same inputs; the inputs "
                "must include whatever changes the rows (e.g. a limit)"
            )
        self.complete = True
        self.done_rows = self.total_rows

    def _start(self, want: dict) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)  # an init killed before writer.json: nothing durable
        (self.tmp / SHARDS_DIR).mkdir(parents=True)
        zarr.create_array(
            str(self.tmp / HIDDEN_DIR),
            shape=(self.total_rows, self.hidden_size),
            chunks=(want["chunk_rows"], self.hidden_size),  # rows only: a row is always read whole
            dtype="float16",
            compressors=None,  # float16 activations barely compress; raw chunks read at disk speed
            fill_value=0,
            # every chunk file exists, even all-zero ones: checksums and raw reads stay simple
            config={"write_empty_chunks": True},
        )
        atomic.write_json(
            self.tmp / WRITER_FILE,
            {
                **want,
                "model": self.spec.model,
                "dataset": self.spec.dataset,
                "variant": self.spec.variant,
                "fingerprint_inputs": canonical(self.spec.fingerprint_inputs()),
            },  # no timestamps: a resumed write must end byte-identical to a clean one
        )

    def _resume(self, want: dict) -> None:
        have = atomic.read_json(self.tmp / WRITER_FILE)
        diff = {k: (have.get(k), v) for k, v in want.items() if k != "chunk_rows" and have.get(k) != v}
        if diff:
            raise StoreError(
                f"incomplete feature set {self.tmp} was started with different shape/inputs "
                f"({', '.join(f'{k}: {a} != {b}' for k, (a, b) in diff.items())}); remove it with "
                f"`walla-store rm {self.fingerprint}` and re-run"
            )
        if (self.tmp / META_FILE).exists() or (self.tmp / ROWS_FILE).exists():  # killed inside commit()
            self.done_rows = self.total_rows
            return
        remove_temp_files(self.tmp)  # a shard or chunk killed before its rename: not durable
        shards = durable_shards(self.tmp)
        for path, _start, end in shards:
            ids = pl.read_parquet(path, columns=["question_id"])["question_id"].to_list()
            self._ids.update(ids)
            self.done_rows = end
        if shards:
            self._columns = pl.read_parquet_schema(shards[0][0]).names()

    @property
    def array(self) -> zarr.Array:
        if self._arr is None:
            self._arr = zarr.open_array(
                str(self.tmp / HIDDEN_DIR), mode="r+", config={"write_empty_chunks": True}
            )
        return self._arr

    # -- writing -------------------------------------------------------------------------------------------

    def write_shard(self, rows: pl.DataFrame, hidden: np.ndarray) -> None:
        """Append the next shard: rows (schema.ROW_COLUMNS, in order) and hidden [n, H] (cast to float16).

        Raises:
            ValueError: bad columns/types/values (one message naming the row and column), shape
                mismatch, duplicate question ids, more rows than total_rows, or writing after commit.
        """
        if self.complete:
            raise StoreError(f"feature set {self.final} is already complete; nothing to write")
        start = self.done_rows
        rows = validate_rows(rows, self.spec.variant, where=f"shard at row {start} of {self.tmp.name}")
        n = rows.height
        hidden = np.asarray(hidden)
        if hidden.shape != (n, self.hidden_size):  # [n, H]
            raise ValueError(
                f"hidden has shape {hidden.shape}; expected ({n}, {self.hidden_size}) for this shard"
            )
        if start + n > self.total_rows:
            raise ValueError(f"shard of {n} rows at row {start} overflows total_rows={self.total_rows}")
        if self._columns is not None and rows.columns != self._columns:
            raise ValueError(f"shard columns {rows.columns} differ from earlier shards {self._columns}")
        h16 = hidden.astype(np.float16, copy=False)  # [n, H]
        bad = ~np.isfinite(h16).all(axis=1)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"hidden state of question {rows['question_id'][i]!r} is not finite in float16 "
                "(NaN, or |x| > 65504); fix the extractor instead of storing it"
            )
        ids = rows["question_id"].to_list()
        dup = self._ids.intersection(ids)
        if dup:
            raise ValueError(f"question_id {sorted(dup)[0]!r} was already written to this feature set")

        end = start + n
        _write_hidden(self.array, start, h16)  # 1. data first ...
        shard = self.tmp / SHARDS_DIR / f"rows-{start:012d}-{end:012d}.parquet"
        atomic.write_parquet(shard, rows)  # 2. ... then the rename that makes the shard durable
        self._ids.update(ids)
        self._columns = rows.columns
        self.done_rows = end

    def commit(self) -> Path:
        """Consolidate the shards, write meta.json last and rename the directory into place.

        Returns:
            The final feature-set directory.
        Raises:
            StoreError: if fewer than total_rows rows were written.
        """
        if self.complete:
            return self.final
        if self.done_rows != self.total_rows:
            raise StoreError(
                f"commit() after {self.done_rows} of {self.total_rows} rows of {self.tmp}; write the remaining "
                "shards first (a rerun resumes from done_rows)"
            )
        if not (self.tmp / META_FILE).exists():
            remove_temp_files(self.tmp)  # leftovers of writes killed before their rename
            if (self.tmp / ROWS_FILE).exists():
                rows = pl.read_parquet(self.tmp / ROWS_FILE)
            else:
                parts = [pl.read_parquet(p) for p, _, _ in durable_shards(self.tmp)]
                # rechunk: one contiguous table, so the same rows give the same bytes however they were sharded
                rows = pl.concat(parts, how="vertical").rechunk()
                if rows.height != self.total_rows:
                    raise StoreError(
                        f"{self.tmp}: shards hold {rows.height} rows, expected {self.total_rows}"
                    )
                atomic.write_parquet(self.tmp / ROWS_FILE, rows)
            shutil.rmtree(self.tmp / SHARDS_DIR, ignore_errors=True)
            qsha = _qid_sha256(rows["question_id"].to_list())
            fp_inputs = canonical(self.spec.fingerprint_inputs())
            attrs = {
                "fingerprint": self.fingerprint,
                "fingerprint_inputs": fp_inputs,
                "question_ids_sha256": qsha,
            }
            self.array.attrs.update(attrs)
            writer = atomic.read_json(self.tmp / WRITER_FILE)
            meta = {
                "kind": "feature_set",
                "schema_version": FEATURE_SCHEMA_VERSION,
                "fingerprint": self.fingerprint,
                "model": self.spec.model,
                "dataset": self.spec.dataset,
                "variant": self.spec.variant,
                "inputs": fp_inputs["inputs"],
                "fingerprint_inputs": fp_inputs,
                "questions_fp": self.spec.inputs["questions_fp"],
                "n_rows": self.total_rows,
                "hidden_size": self.hidden_size,
                "hidden_dtype": "float16",
                "chunk_rows": writer["chunk_rows"],
                "columns": rows.columns,
                "question_ids_sha256": qsha,
                "checksums": atomic.dir_checksums(self.tmp, exclude=(META_FILE,)),
                "versions": atomic.library_versions(),
                "created_at": atomic.now_iso(),
            }
            atomic.write_json(self.tmp / META_FILE, meta)  # the completion marker: last file written
        atomic.replace(self.tmp, self.final)  # the commit: one directory rename
        self.complete = True
        return self.final


@contextlib.contextmanager
def open_writer(
    store: Path,
    spec: FeatureSetSpec,
    hidden_size: int,
    total_rows: int,
    *,
    lock_timeout: float = 0.0,
    chunk_rows: int | None = None,
) -> Iterator[FeatureSetWriter]:
    """Open (or resume) the writer of one feature set under its file lock.

    Args:
        store: store root.
        spec: what is being written.
        hidden_size: H of the hidden states.
        total_rows: N, rows the finished feature set will hold.
        lock_timeout: seconds to wait for another writer of the same key (0: fail at once; -1: wait forever).
        chunk_rows: zarr rows per chunk (default: ~4 MiB chunks); only honoured for a new write.
    Yields:
        The writer: `done_rows` rows are already durable; call write_shard(...) then commit().
    Raises:
        LockedError: another process writes this feature set.
    """
    final = spec.path(store)
    final.parent.mkdir(parents=True, exist_ok=True)
    lock_path = final.with_name(final.name + LOCK)
    lock = filelock.FileLock(str(lock_path), timeout=lock_timeout)
    try:
        lock.acquire()
    except filelock.Timeout:
        raise LockedError(
            f"feature set {final} is being written by another process (lock {lock_path}); wait for it to finish "
            "(the lock is released automatically if that process dies)"
        ) from None
    try:
        yield FeatureSetWriter(Path(store), spec, hidden_size, total_rows, chunk_rows)
    finally:
        lock.release()


# ---------------------------------------------------------------------------------------------------------
# reading


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


def read_feature_set(path: Path, verify: bool = False) -> FeatureSet:
    """Open a committed feature set after checking it is complete, current and internally consistent.

    Checks: meta.json present (completion), schema version, every checksummed file present, row count
    and question_id order identical in rows.parquet, meta.json and hidden.zarr attrs, hidden shape
    [N, H] float16. With verify=True also recomputes every file checksum.

    Raises:
        IncompleteError, StaleSchemaError, StoreError: with the file and the command that fixes it.
    """
    path = Path(path)
    if path.name.endswith(INCOMPLETE) or not (path / META_FILE).exists():
        hint = _hint_from_writer(path)
        raise IncompleteError(
            f"feature set {path} is incomplete (no {META_FILE}: still being written, or the writer died); "
            f"resume it with `{hint}`"
        )
    meta = atomic.read_json(path / META_FILE)
    cmd = extract_command(
        meta.get("model", "<model>"), meta.get("dataset", "<dataset>"), meta.get("variant", "<variant>")
    )
    if meta.get("schema_version") != FEATURE_SCHEMA_VERSION:
        raise StaleSchemaError(
            f"feature set {path} has schema version {meta.get('schema_version')}, this walla reads version "
            f"{FEATURE_SCHEMA_VERSION}: re-run `{cmd}` (remove the old one with `walla-store rm {meta.get('fingerprint')}`)"
        )
    missing = [rel for rel in meta["checksums"] if not (path / rel).is_file()]
    if missing:
        raise StoreError(
            f"feature set {path} is missing {missing[0]} ({len(missing)} file(s)); re-run `{cmd}`"
        )
    if verify:
        verify_checksums(path, meta)
    rows = pl.read_parquet(path / ROWS_FILE)
    hidden = zarr.open_array(str(path / HIDDEN_DIR), mode="r")
    n, h = meta["n_rows"], meta["hidden_size"]
    qsha = _qid_sha256(rows["question_id"].to_list())
    problems = []
    if rows.height != n:
        problems.append(f"rows.parquet has {rows.height} rows, meta.json says {n}")
    if tuple(hidden.shape) != (n, h) or str(hidden.dtype) != "float16":
        problems.append(f"hidden.zarr is {tuple(hidden.shape)} {hidden.dtype}, expected ({n}, {h}) float16")
    if qsha != meta["question_ids_sha256"] or hidden.attrs.get("question_ids_sha256") != qsha:
        problems.append(
            "question_id order of rows.parquet differs from the order the hidden states were written in"
        )
    if rows.columns[: len(ROW_COLUMNS)] != list(ROW_COLUMNS):
        problems.append(f"rows.parquet columns {rows.columns} differ from schema.ROW_COLUMNS")
    if problems:
        raise StoreError(f"feature set {path} is inconsistent: {'; '.join(problems)}; re-run `{cmd}`")
    return FeatureSet(rows=rows, hidden=hidden, meta=meta, path=path)


def verify_checksums(path: Path, meta: dict) -> None:
    """Recompute every file checksum; raise StoreError naming the first file that changed."""
    for rel, want in sorted(meta["checksums"].items()):
        if not checksum_matches(path / rel, want):
            raise StoreError(
                f"checksum mismatch: {path / rel} changed after it was written (corrupt or edited)"
            )


def _hint_from_writer(path: Path) -> str:
    try:
        w = atomic.read_json(path / WRITER_FILE)
        return extract_command(w["model"], w["dataset"], w["variant"])
    except (OSError, ValueError, KeyError):  # killed before writer.json: the layout names it
        parts = path.parts
        if len(parts) >= 5 and parts[-5] == FEATURES_DIR:
            return extract_command(parts[-4], parts[-3], parts[-2])
        return "make extract MODEL=<model> DATASET=<dataset> VARIANTS=<variant>"
