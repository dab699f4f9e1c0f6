"""Feature sets: one (model, dataset, variant) extraction on disk, written and read here.

Rooms (private: import their public names from this door):
- `_format`: Feature sets: one (model, dataset, prompt variant) extraction, keyed by a content fingerprint.
- `_hidden_io`: Fast row-range reads of a feature set's hidden.zarr straight into caller-owned memory.
- `_layout`: Feature-store layout: directory/file names, store errors, and the shard bookkeeping that the writer, the reader and the listing share (see features/format.py for the whole picture).
- `_reader`: Reading a feature set: every open verifies what it reads (layout in store/features/_format.py).
- `_rows`: Row contract of a feature set's rows.parquet: dtypes of schema.ROW_COLUMNS and the per-shard checks the writer runs before anything reaches disk (one error naming the question and column).
- `_spec`: What a feature set is: `FeatureSetSpec` (model, dataset, variant + every resolved input) and its key.
- `_writer`: Writing a feature set: a resumable shard writer under a per-key file lock (layout in store/features/_format.py).
"""

from __future__ import annotations

from walla.cli.lazy import door

_ROOMS = {
    "_format": ("FeatureSetInfo", "list_feature_sets", "remove_feature_set", "writer_lock"),
    "_hidden_io": ("HiddenReader",),
    "_layout": (
        "FEATURES_DIR",
        "FS_DIR_RE",
        "INCOMPLETE",
        "IncompleteError",
        "LOCK",
        "LockedError",
        "META_FILE",
        "ROWS_FILE",
        "StaleSchemaError",
        "StoreError",
        "WRITER_FILE",
        "check_name",
        "durable_shards",
        "extract_command",
        "fix_command",
    ),
    "_reader": ("FeatureSet", "find_complete", "read_feature_set", "verify_checksums"),
    "_rows": ("validate_rows",),
    "_spec": ("FeatureSetSpec",),
    "_writer": ("attach_writer", "default_chunk_rows", "open_writer"),
}
__getattr__, __all__ = door(__name__, _ROOMS)
