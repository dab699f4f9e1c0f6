"""Feature sets: one (model, dataset, prompt variant) extraction, keyed by a content fingerprint.

The store API of feature sets, in three modules: what a set is (features/spec.py), writing it
(features/writer.py) and reading it with verification (features/reader.py); listing and removal are
in listing.py. Layout (readable path, hash last):

    <store>/features/<model>/<dataset>/<variant>/<fp>/          complete: the only kind readers accept
        rows.parquet      schema.ROW_COLUMNS (+ optional "prompt"), one row per question
        hidden.zarr/      [N, H] float16, chunked along rows only (~4 MiB chunks), same row order
        writer.json       shape and inputs the writer was opened with
        meta.json         fingerprint inputs, counts, per-file checksums, versions, command: written LAST
    <store>/features/<model>/<dataset>/<variant>/<fp>.incomplete/   a write in progress (or killed)
        shards/rows-<start>-<end>.parquet   one per durable shard
    <store>/features/<model>/<dataset>/<variant>/<fp>.lock          filelock: one writer per key

The store may be a local directory or any fsspec URL (store/location.py). On an object store there is
no directory rename and no flock: a set is written in place at `<fp>/` (shards/ included) and is
complete once meta.json, written last, exists. Parallel writers (extract/distributed.py) fill
chunk-aligned row ranges of one set: `attach_writer(store, spec).write_range(start, rows, hidden)`.

    spec = FeatureSetSpec("smollm2-135m", "facts", "none", inputs={...,"questions_fp": qfp})
    with open_writer(store, spec, hidden_size=576, total_rows=len(rows)) as w:
        for start in range(w.done_rows, n, 256):
            w.write_shard(rows[start:start + 256], hidden[start:start + 256])
        w.commit()
    fs = read_feature_set(find_complete(store, spec))     # verified; fs.rows, fs.hidden (lazy zarr), fs.meta
"""

from walla.store.features._layout import (
    IncompleteError,
    LockedError,
    StaleSchemaError,
    StoreError,
    extract_command,
    fix_command,
)
from walla.store.features._reader import FeatureSet, find_complete, read_feature_set, verify_checksums
from walla.store.features._spec import FeatureSetSpec
from walla.store.features._writer import FeatureSetWriter, attach_writer, open_writer, writer_lock
from walla.store.listing import FeatureSetInfo, list_feature_sets, remove_feature_set

__all__ = [
    "FeatureSet",
    "FeatureSetInfo",
    "FeatureSetSpec",
    "FeatureSetWriter",
    "IncompleteError",
    "LockedError",
    "StaleSchemaError",
    "StoreError",
    "attach_writer",
    "extract_command",
    "find_complete",
    "fix_command",
    "list_feature_sets",
    "open_writer",
    "read_feature_set",
    "remove_feature_set",
    "verify_checksums",
    "writer_lock",
]
