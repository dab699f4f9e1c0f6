"""Writing a feature set: a resumable shard writer under a per-key file lock (layout in store/features/_format.py).

Write protocol (every step is an atomic rename, so SIGKILL anywhere leaves a resumable state):
  1. hidden rows of a shard go into the zarr array (each chunk file is replaced atomically by zarr),
  2. then the shard's rows are renamed into shards/ -- this rename makes the shard durable,
  3. commit(): shards -> rows.parquet, checksums, meta.json, then one rename `<fp>.incomplete` -> `<fp>`.
A rerun reopens the `.incomplete` dir and writes the rows no durable shard holds (`missing`); chunks
touched by a killed shard are simply rewritten, so the result is byte-identical to an uninterrupted run.

Parallel writers (extract/distributed.py): one driver opens the writer (lock, writer.json, the zarr
array), workers `attach_writer` and `write_range` disjoint chunk-aligned row ranges (shards may then
have holes until every range is in), the driver `refresh()`es and commits.
On a remote store (store/location.py) the set is written in place at `<fp>/` and committed by its
meta.json alone (no directory rename on object stores); no lock file.

    with open_writer(store, spec, hidden_size=576, total_rows=len(rows)) as w:
        for start in range(w.done_rows, n, 256):
            w.write_shard(rows[start:start + 256], hidden[start:start + 256])
        w.commit()
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import polars as pl
import zarr
from walla.store import atomic
from walla.store.features._layout import (
    HIDDEN_DIR,
    INCOMPLETE,
    META_FILE,
    ROWS_FILE,
    SHARDS_DIR,
    WRITER_FILE,
    StoreError,
    durable_shards,
    missing_pieces,
    remove_temp_files,
)
from walla.store.features._rows import validate_rows
from walla.store.features._spec import FeatureSetSpec, question_ids_sha256
from walla.store.files import read_json, read_parquet
from walla.store.fingerprint import canonical, dir_checksums
from walla.store.location import as_location, is_remote, parquet_columns, rmtree, zarr_store
from walla.store.lock import writer_lock
from walla.store.provenance import library_versions, now_iso
from walla.store.schema import FEATURE_SCHEMA_VERSION

CHUNK_BYTES = 4 << 20  # target bytes per zarr chunk (zarr guide: >= ~1 MB; one file per chunk)


def _write_hidden(arr: zarr.Array, start: int, hidden: np.ndarray) -> None:
    """Region write of one shard's hidden states (module-level so crash tests can interpose)."""
    arr[start : start + hidden.shape[0]] = hidden


def default_chunk_rows(hidden_size: int, total_rows: int) -> int:
    return int(max(1, min(total_rows, -(-CHUNK_BYTES // (2 * hidden_size)))))


class FeatureSetWriter:
    """Resumable shard writer of one feature set; obtain it from `open_writer` (which holds the lock)."""

    def __init__(
        self,
        store: Path,
        spec: FeatureSetSpec,
        hidden_size: int,
        total_rows: int,
        chunk_rows: int | None,
        command: str | None = None,
        attach: bool = False,
    ):
        if not (isinstance(hidden_size, int) and hidden_size > 0):
            raise ValueError(f"hidden_size must be a positive int, got {hidden_size!r}")
        if not (isinstance(total_rows, int) and total_rows > 0):
            raise ValueError(f"total_rows must be a positive int, got {total_rows!r}")
        self.spec = spec
        self.command = command  # the CLI line that re-creates this set; quoted by the reader's errors
        self.fingerprint = spec.fingerprint
        self.hidden_size = hidden_size
        self.total_rows = total_rows
        self.final = spec.path(store)
        self.remote = is_remote(self.final)
        self.tmp = self.incomplete_dir(self.final)
        self.complete = False
        self.done_rows = 0  # rows [0, done_rows) are durable
        self.shards: list = []  # durable shards (path, start, end), row order
        self._ids: set[str] = set()
        self._columns: list[str] | None = None  # columns of the first shard; later shards must match
        self._arr: zarr.Array | None = None
        want = {
            "fingerprint": self.fingerprint,
            "hidden_size": hidden_size,
            "total_rows": total_rows,
            "chunk_rows": chunk_rows or default_chunk_rows(hidden_size, total_rows),
        }
        self.chunk_rows = want["chunk_rows"]
        if attach:  # a worker of a parallel write: the driver started it; shards are its business
            self._check_writer(want)
        elif (self.final / META_FILE).exists():
            self._open_complete(want)
        elif not self.remote and self.final.exists():
            raise StoreError(
                f"{self.final} exists but has no {META_FILE}: not written by walla; remove it "
                f"(`walla store rm {self.fingerprint} --store {store} --yes`) and re-run"
            )
        elif (self.tmp / WRITER_FILE).exists():
            self._resume(want)
        else:
            self._start(want)

    # -- opening -------------------------------------------------------------------------------------------

    @staticmethod
    def incomplete_dir(final: Path) -> Path:
        """Where a write in progress lives: `<fp>.incomplete` locally; remote: `<fp>` itself (object stores
        cannot rename a directory, so meta.json written last is the commit)."""
        return final if is_remote(final) else final.with_name(final.name + INCOMPLETE)

    def _open_complete(self, want: dict) -> None:
        meta = read_json(self.final / META_FILE)
        if (meta["hidden_size"], meta["n_rows"]) != (want["hidden_size"], want["total_rows"]):
            raise StoreError(
                f"{self.final} is complete with {meta['n_rows']} rows x hidden {meta['hidden_size']}, but the writer "
                f"was opened for {want['total_rows']} x {want['hidden_size']} under the same inputs; the inputs "
                "must include whatever changes the rows (e.g. a limit)"
            )
        self.complete = True
        self.done_rows = self.total_rows

    def _start(self, want: dict) -> None:
        rmtree(self.tmp)  # an init killed before writer.json: nothing durable
        (self.tmp / SHARDS_DIR).mkdir(parents=True)
        zarr.create_array(
            zarr_store(self.tmp / HIDDEN_DIR),
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

    def _check_writer(self, want: dict) -> None:
        have = read_json(self.tmp / WRITER_FILE)
        diff = {k: (have.get(k), v) for k, v in want.items() if k != "chunk_rows" and have.get(k) != v}
        if diff:
            raise StoreError(
                f"incomplete feature set {self.tmp} was started with different shape/inputs "
                f"({', '.join(f'{k}: {a} != {b}' for k, (a, b) in diff.items())}); remove it with "
                f"`walla store rm {self.fingerprint} --store {self.final.parents[4]} --yes` and re-run"
            )
        self.chunk_rows = have["chunk_rows"]

    def _resume(self, want: dict) -> None:
        self._check_writer(want)
        if (self.tmp / META_FILE).exists() or (self.tmp / ROWS_FILE).exists():  # killed inside commit()
            self.done_rows = self.total_rows
            return
        remove_temp_files(self.tmp)  # a shard or chunk killed before its rename: not durable
        self.refresh()
        for path, _start, _end in self.shards:
            self._ids.update(read_parquet(path, columns=["question_id"])["question_id"].to_list())
        if self.shards:
            self._columns = parquet_columns(self.shards[0][0])

    def refresh(self) -> None:
        """Re-read the durable shards (parallel workers add them): `shards`, `done_rows`."""
        self.shards = durable_shards(self.tmp, gaps=True)
        self._advance()

    def _advance(self) -> None:
        self.done_rows = 0
        for _path, start, end in self.shards:
            if start != self.done_rows:
                break
            self.done_rows = end

    def missing(self, block: int) -> list[list[tuple[int, int]]]:
        """Row ranges no durable shard holds, cut at multiples of `block`, grouped per block (one task each)."""
        if self.complete or (self.tmp / ROWS_FILE).exists():
            return []
        return missing_pieces(self.shards, self.total_rows, block)

    @property
    def array(self) -> zarr.Array:
        if self._arr is None:
            self._arr = zarr.open_array(
                zarr_store(self.tmp / HIDDEN_DIR), mode="r+", config={"write_empty_chunks": True}
            )
        return self._arr

    # -- writing -------------------------------------------------------------------------------------------

    def write_shard(self, rows: pl.DataFrame, hidden: np.ndarray) -> None:
        """Append the next shard: rows (schema.ROW_COLUMNS, in order) and hidden [n, H] (cast to float16).

        Raises:
            ValueError: bad columns/types/values (one message naming the row and column), shape
                mismatch, duplicate question ids, more rows than total_rows, or writing after commit.
        """
        self.write_range(self.done_rows, rows, hidden)

    def write_range(self, start: int, rows: pl.DataFrame, hidden: np.ndarray) -> None:
        """Write rows [start, start + n) as one durable shard (as write_shard, at any start).

        Parallel writers must keep to ranges that share no zarr chunk (see `missing`).
        """
        if self.complete:
            raise StoreError(f"feature set {self.final} is already complete; nothing to write")
        rows = validate_rows(rows, self.spec.variant, where=f"shard at row {start} of {self.tmp.name}")
        n = rows.height
        hidden = np.asarray(hidden)
        if hidden.shape != (n, self.hidden_size):  # [n, H]
            raise ValueError(
                f"hidden has shape {hidden.shape}; expected ({n}, {self.hidden_size}) for this shard"
            )
        if start < 0 or start + n > self.total_rows:
            raise ValueError(f"shard of {n} rows at row {start} overflows total_rows={self.total_rows}")
        if any(a < start + n and start < b for _, a, b in self.shards):
            raise ValueError(f"rows {start}-{start + n} overlap a durable shard of {self.tmp}")
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
        self.shards = sorted([*self.shards, (shard, start, end)], key=lambda s: s[1])
        self._advance()

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
            self.refresh()  # parallel workers wrote shards this writer did not
        if self.done_rows != self.total_rows:
            raise StoreError(
                f"commit() after {self.done_rows} of {self.total_rows} rows of {self.tmp}; write the remaining "
                "shards first (a rerun resumes from done_rows)"
            )
        if not (self.tmp / META_FILE).exists():
            remove_temp_files(self.tmp)  # leftovers of writes killed before their rename
            if (self.tmp / ROWS_FILE).exists():
                rows = read_parquet(self.tmp / ROWS_FILE)
            else:
                parts = [read_parquet(p) for p, _, _ in durable_shards(self.tmp)]
                # rechunk: one contiguous table, so the same rows give the same bytes however they were sharded
                rows = pl.concat(parts, how="vertical").rechunk()
                if rows.height != self.total_rows:
                    raise StoreError(
                        f"{self.tmp}: shards hold {rows.height} rows, expected {self.total_rows}"
                    )
                if rows["question_id"].is_duplicated().any():  # parallel ranges are checked here
                    dup = rows.filter(pl.col("question_id").is_duplicated())["question_id"][0]
                    raise StoreError(f"{self.tmp}: question_id {dup!r} is in two shards")
                atomic.write_parquet(self.tmp / ROWS_FILE, rows)
            rmtree(self.tmp / SHARDS_DIR)
            qsha = question_ids_sha256(rows["question_id"].to_list())
            fp_inputs = canonical(self.spec.fingerprint_inputs())
            attrs = {
                "fingerprint": self.fingerprint,
                "fingerprint_inputs": fp_inputs,
                "question_ids_sha256": qsha,
            }
            self.array.attrs.update(attrs)
            writer = read_json(self.tmp / WRITER_FILE)
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
                "checksums": dir_checksums(self.tmp, exclude=(META_FILE,)),
                "versions": library_versions(),
                "created_at": now_iso(),
                "command": self.command,
                "compute": _compute_stats(getattr(self, "stats", None), rows),
            }
            atomic.write_json(self.tmp / META_FILE, meta)  # the completion marker: last file written
        if not self.remote:
            atomic.replace(self.tmp, self.final)  # the commit: one directory rename
        self.complete = True
        return self.final


def _compute_stats(stats: dict | None, rows: pl.DataFrame) -> dict | None:
    """What producing the set cost (issue: compute next to accuracy): prompt tokens, 2 x non-embedding
    parameters x tokens forward FLOPs (when the extractor knew the parameter count), wall time, device."""
    if not stats:
        return None
    out = dict(stats)
    if "n_prompt_tokens" in rows.columns:
        out["prompt_tokens"] = int(rows["n_prompt_tokens"].sum())
        if out.get("n_params_non_embedding"):
            out["forward_flops"] = 2.0 * out["n_params_non_embedding"] * out["prompt_tokens"]
    return out


@contextlib.contextmanager
def open_writer(
    store: Path,
    spec: FeatureSetSpec,
    hidden_size: int,
    total_rows: int,
    *,
    lock_timeout: float = 0.0,
    chunk_rows: int | None = None,
    command: str | None = None,
    locked: bool = False,
) -> Iterator[FeatureSetWriter]:
    """Open (or resume) the writer of one feature set under its file lock.

    Args:
        store: store root.
        spec: what is being written.
        hidden_size: H of the hidden states.
        total_rows: N, rows the finished feature set will hold.
        lock_timeout: seconds to wait for another writer of the same key (0: fail at once; -1: wait forever).
        chunk_rows: zarr rows per chunk (default: ~4 MiB chunks); only honoured for a new write.
        command: the command line that re-creates this set (recorded in meta.json, quoted by readers).
        locked: the caller already holds `writer_lock(store, spec)`.
    Yields:
        The writer: `done_rows` rows are already durable; call write_shard(...) then commit().
    Raises:
        LockedError: another process writes this feature set.
    """
    with contextlib.nullcontext() if locked else writer_lock(store, spec, lock_timeout):
        yield FeatureSetWriter(as_location(store), spec, hidden_size, total_rows, chunk_rows, command)


def attach_writer(store: Path, spec: FeatureSetSpec) -> FeatureSetWriter:
    """A worker's handle on a write the driver opened (no lock, no shard scan): call write_range only."""
    tmp = FeatureSetWriter.incomplete_dir(spec.path(store))
    w = read_json(tmp / WRITER_FILE, "the writer.json of a started feature set")
    return FeatureSetWriter(
        as_location(store), spec, w["hidden_size"], w["total_rows"], w["chunk_rows"], attach=True
    )
