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
import datetime
import hashlib
import os
import re
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
from walla.store.schema import FEATURE_SCHEMA_VERSION, OPTIONAL_ROW_COLUMNS, ROW_COLUMNS, VARIANTS

FEATURES_DIR = "features"
ROWS_FILE = "rows.parquet"
HIDDEN_DIR = "hidden.zarr"
META_FILE = "meta.json"  # completion marker
WRITER_FILE = "writer.json"  # written when a write starts; checked on resume
SHARDS_DIR = "shards"
INCOMPLETE = ".incomplete"
LOCK = ".lock"
CHUNK_BYTES = 4 << 20  # target bytes per zarr chunk (zarr guide: >= ~1 MB; one file per chunk)
LOGSUMEXP_TOL = 1e-3  # option_logprobs must be renormalized over the options

ROW_DTYPES: dict[str, pl.DataType] = {
    "question_id": pl.String(),
    "n_options": pl.Int32(),
    "option_logprobs": pl.List(pl.Float32()),
    "raw_option_logprobs": pl.List(pl.Float32()),
    "prompt_nll": pl.Float32(),
    "n_prompt_tokens": pl.Int32(),
    "context_source_id": pl.String(),
    "prompt": pl.String(),  # optional
}
assert list(ROW_DTYPES) == [*ROW_COLUMNS, *OPTIONAL_ROW_COLUMNS]
_FS_DIR_RE = re.compile(r"^[0-9a-f]{16}(\.incomplete)?$")
_SHARD_RE = re.compile(r"^rows-(\d{12})-(\d{12})\.parquet$")


class StoreError(ValueError):
    """A store artifact is missing, incomplete, locked, stale or corrupt (message says what to do)."""


class StaleSchemaError(StoreError):
    """A feature set written by another FEATURE_SCHEMA_VERSION."""


class IncompleteError(StoreError):
    """A feature set that was never committed (still writing, or the writer died)."""


class LockedError(StoreError):
    """Another process holds the writer lock of this feature set."""


def extract_command(model: str, dataset: str, variants: str | list[str]) -> str:
    """The exact command that (re)creates feature sets; every 'missing/stale' error quotes it."""
    v = variants if isinstance(variants, str) else ",".join(variants)
    return f"make extract MODEL={model} DATASET={dataset} VARIANTS={v}"


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
        _remove_temp_files(self.tmp)  # a shard or chunk killed before its rename: not durable
        shards = _durable_shards(self.tmp)
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
            _remove_temp_files(self.tmp)  # leftovers of writes killed before their rename
            if (self.tmp / ROWS_FILE).exists():
                rows = pl.read_parquet(self.tmp / ROWS_FILE)
            else:
                parts = [pl.read_parquet(p) for p, _, _ in _durable_shards(self.tmp)]
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


def _remove_temp_files(root: Path) -> None:
    """Delete temp files of killed writes: ours (`*.tmp`) and zarr's chunk temps (`*.partial`)."""
    for dirpath, _, files in os.walk(root):
        for name in files:
            if name.endswith((atomic.TMP_SUFFIX, ".partial")):
                os.unlink(os.path.join(dirpath, name))


def _durable_shards(tmp: Path) -> list[tuple[Path, int, int]]:
    """Committed shard files of an incomplete feature set, in row order; they must tile [0, end)."""
    shards = []
    d = tmp / SHARDS_DIR
    for p in sorted(d.iterdir()) if d.is_dir() else []:
        m = _SHARD_RE.match(p.name)
        if m:
            shards.append((p, int(m.group(1)), int(m.group(2))))
    expect = 0
    for p, start, end in shards:
        if start != expect:
            raise StoreError(
                f"{p}: shard starts at row {start}, expected {expect}; the store was modified by hand"
            )
        expect = end
    return shards


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


def validate_rows(rows: pl.DataFrame, variant: str, where: str = "rows") -> pl.DataFrame:
    """Check one shard of rows against schema.ROW_COLUMNS (+ optional columns); return it cast.

    Raises:
        ValueError: naming the first offending question and column.
    """
    cols = list(rows.columns)
    base = list(ROW_COLUMNS)
    if cols[: len(base)] != base or any(c not in OPTIONAL_ROW_COLUMNS for c in cols[len(base) :]):
        raise ValueError(
            f"{where}: columns {cols}; expected {base} in this order, optionally followed by {list(OPTIONAL_ROW_COLUMNS)}"
        )
    if rows.height == 0:
        raise ValueError(f"{where}: empty shard")
    try:
        rows = rows.select([pl.col(c).cast(ROW_DTYPES[c], strict=True) for c in cols])
    except Exception as e:  # polars raises several exception types for bad casts
        raise ValueError(
            f"{where}: a column has the wrong type ({e.__class__.__name__}: {str(e).splitlines()[0]})"
        ) from e

    def fail(mask: pl.Series | np.ndarray, what: str) -> None:
        idx = np.flatnonzero(np.asarray(mask))
        if idx.size:
            raise ValueError(f"{where}: question {rows['question_id'][int(idx[0])]!r}: {what}")

    for c in cols:
        if c != "context_source_id" and rows[c].null_count():
            fail(rows[c].is_null().to_numpy(), f"{c} is null")
    if rows["question_id"].n_unique() != rows.height:
        fail(rows["question_id"].is_duplicated().to_numpy(), "question_id appears twice in the shard")
    k = rows["n_options"].to_numpy()
    fail(k < 2, "n_options must be >= 2")
    for c in ("option_logprobs", "raw_option_logprobs"):
        fail(rows[c].list.len().to_numpy() != k, f"{c} has a length different from n_options")
    lp = rows["option_logprobs"].explode().to_numpy().astype(np.float64)
    fail_idx = np.repeat(np.arange(rows.height), k)
    if not np.isfinite(lp).all():
        fail(np.isin(np.arange(rows.height), fail_idx[~np.isfinite(lp)]), "option_logprobs has NaN/inf")
    lse = np.full(rows.height, -np.inf)
    np.logaddexp.at(lse, fail_idx, lp)
    fail(
        np.abs(lse) > LOGSUMEXP_TOL, "option_logprobs are not renormalized over the options (logsumexp != 0)"
    )
    raw = rows["raw_option_logprobs"].explode().to_numpy()
    if np.isnan(raw).any():
        fail(np.isin(np.arange(rows.height), fail_idx[np.isnan(raw)]), "raw_option_logprobs has NaN")
    nll = rows["prompt_nll"].to_numpy()
    fail(~np.isfinite(nll) | (nll < 0), "prompt_nll must be finite and >= 0")
    fail(rows["n_prompt_tokens"].to_numpy() < 1, "n_prompt_tokens must be >= 1")
    src = rows["context_source_id"]
    if variant == "irrelevant":
        fail(src.is_null().to_numpy(), "irrelevant variant rows must record context_source_id")
        fail(
            (src == rows["question_id"]).to_numpy(),
            "context_source_id is the question itself (not irrelevant)",
        )
    elif variant == "none":
        fail(
            src.is_not_null().to_numpy(),
            "the none variant shows no context, so context_source_id must be null",
        )
    else:
        fail(
            (src.is_not_null() & (src != rows["question_id"])).to_numpy(),
            "the relevant variant shows the question's own context; context_source_id must be null or itself",
        )
    return rows


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


# ---------------------------------------------------------------------------------------------------------
# listing


@dataclass
class FeatureSetInfo:
    """One directory under features/, complete or not (what `walla-store ls` shows)."""

    model: str
    dataset: str
    variant: str
    fingerprint: str
    path: Path
    status: str  # complete | stale | writing | incomplete
    n_rows: int | None  # total rows (when known)
    done_rows: int | None  # durable rows of an incomplete write
    hidden_size: int | None
    created_at: str | None
    schema_version: int | None
    questions_fp: str | None = None  # the question table the rows were cut from (complete sets)

    @property
    def size_bytes(self) -> int:
        return atomic.dir_size(self.path)


def _lock_held(lock_path: Path) -> bool:
    """True if a live process holds the flock (a dead writer's lock is released by the kernel)."""
    if not lock_path.exists():
        return False
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX
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
    if not incomplete and (d / META_FILE).exists():
        m = atomic.read_json(d / META_FILE)
        status = "complete" if m.get("schema_version") == FEATURE_SCHEMA_VERSION else "stale"
        return FeatureSetInfo(
            model,
            dataset,
            variant,
            fp,
            d,
            status,
            m.get("n_rows"),
            m.get("n_rows"),
            m.get("hidden_size"),
            m.get("created_at"),
            m.get("schema_version"),
            m.get("questions_fp"),
        )
    w = {}
    with contextlib.suppress(OSError, ValueError):
        w = atomic.read_json(d / WRITER_FILE)
    done = 0
    if (d / ROWS_FILE).exists() or (d / META_FILE).exists():
        done = w.get("total_rows", 0)
    else:
        with contextlib.suppress(StoreError, OSError):
            shards = _durable_shards(d)
            done = shards[-1][2] if shards else 0
    status = "writing" if _lock_held(d.with_name(fp + LOCK)) else "incomplete"
    return FeatureSetInfo(
        model,
        dataset,
        variant,
        fp,
        d,
        status,
        w.get("total_rows"),
        done,
        w.get("hidden_size"),
        _mtime_iso(d / WRITER_FILE),
        FEATURE_SCHEMA_VERSION if w else None,
    )


def _mtime_iso(path: Path) -> str | None:
    try:
        return datetime.datetime.fromtimestamp(path.stat().st_mtime, datetime.timezone.utc).isoformat()
    except OSError:
        return None


def list_feature_sets(
    store: Path, model: str | None = None, dataset: str | None = None, variant: str | None = None
) -> list[FeatureSetInfo]:
    """Every feature-set directory (complete, stale, writing, incomplete), optionally filtered, sorted by path."""
    root = Path(store) / FEATURES_DIR
    out = []
    for mdir in _subdirs(root, model):
        for ddir in _subdirs(mdir, dataset):
            for vdir in _subdirs(ddir, variant):
                for d in _subdirs(vdir, None):
                    if not _FS_DIR_RE.match(d.name):  # e.g. a directory `rm` is deleting right now
                        continue
                    with contextlib.suppress(FileNotFoundError):  # removed or renamed while we looked
                        out.append(_info(mdir.name, ddir.name, vdir.name, d))
    return out


def _subdirs(root: Path, only: str | None) -> list[Path]:
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and (only is None or p.name == only))


def remove_feature_set(info: FeatureSetInfo) -> None:
    """Delete one feature-set directory (complete or not) and its lock file; refuses while it is being written."""
    lock_path = info.path.with_name(info.fingerprint + LOCK)
    if _lock_held(lock_path):
        raise LockedError(f"feature set {info.path} is being written right now; stop that writer first")
    # rename first so a reader never sees a half-deleted complete directory
    doomed = info.path.with_name(f"{info.path.name}.deleting-{os.getpid()}")
    os.rename(info.path, doomed)
    shutil.rmtree(doomed)
    lock_path.unlink(missing_ok=True)
