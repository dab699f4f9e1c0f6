"""A feature-set writer that kills itself with SIGKILL at a chosen step (run in a child process).

Every durable step of the writer goes through `atomic.replace` (a rename) or `feature_writer._write_hidden`
(zarr region write). The child counts those calls and, at call number `crash_at`, does:
    _write_hidden  "before": nothing (exactly at a shard boundary)  "mid": the first half of the shard,
                   plus a stray zarr chunk temp file (as a kill inside zarr's chunk write leaves)
    replace        "before": nothing (temp file left behind)         "after"/"mid": the rename
and then SIGKILLs itself, so no `finally`, no atexit and no lock release in Python runs.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

N_ROWS, HIDDEN, SHARD, CHUNK_ROWS = 40, 8, 16, 6  # shard boundaries (16, 32) fall mid-chunk on purpose


def spec_and_data():
    import polars as pl  # noqa: F401  (imported here so the forkserver preload stays cheap)
    from store_fixtures import make_questions, make_rows
    from walla.store.features import FeatureSetSpec

    q = make_questions(N_ROWS, seed=3)
    rows, hidden = make_rows(q, "none", hidden_size=HIDDEN, seed=3)
    spec = FeatureSetSpec("crashy", "toy", "none", {"questions_fp": "qfp-crash", "note": "crash test"})
    return spec, rows, hidden


def write_all(store: Path) -> Path:
    """The writer loop an extractor runs: resume from done_rows, write shards, commit."""
    from walla.store.features import open_writer

    spec, rows, hidden = spec_and_data()
    with open_writer(store, spec, hidden_size=HIDDEN, total_rows=N_ROWS, chunk_rows=CHUNK_ROWS) as w:
        for s in range(w.done_rows, N_ROWS, SHARD):
            w.write_shard(rows[s : s + SHARD], hidden[s : s + SHARD])
        return w.commit()


def count_steps(store: Path) -> int:
    """Run a clean write in-process and return how many interceptable steps it took."""
    from walla.store import atomic
    from walla.store.features import _writer as feature_writer

    n = {"calls": 0}
    orig_replace, orig_hidden = atomic.replace, feature_writer._write_hidden

    def replace(src, dst):
        n["calls"] += 1
        orig_replace(src, dst)

    def write_hidden(arr, start, h):
        n["calls"] += 1
        orig_hidden(arr, start, h)

    atomic.replace, feature_writer._write_hidden = replace, write_hidden
    try:
        write_all(store)
    finally:
        atomic.replace, feature_writer._write_hidden = orig_replace, orig_hidden
    return n["calls"]


def crash_run(store: str, crash_at: int, flavor: str) -> None:
    """Child entry point: write, and SIGKILL ourselves at step `crash_at`."""
    from walla.store import atomic
    from walla.store.features import _writer as feature_writer

    n = {"calls": 0}
    orig_replace, orig_hidden = atomic.replace, feature_writer._write_hidden

    def hit() -> bool:
        n["calls"] += 1
        return n["calls"] - 1 == crash_at

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    def replace(src, dst):
        if hit():
            if flavor != "before":
                orig_replace(src, dst)
            die()
        orig_replace(src, dst)

    def write_hidden(arr, start, h):
        if hit():
            if flavor != "before":
                orig_hidden(arr, start, h[: len(h) // 2])
                # what a kill inside zarr's own atomic chunk write leaves behind: a temp next to the chunk
                chunk_dir = Path(store).glob("features/*/*/*/*.incomplete/hidden.zarr/c/0")
                for d in chunk_dir:
                    (d / "0.deadbeef.partial").write_bytes(b"half a chunk")
            die()
        orig_hidden(arr, start, h)

    atomic.replace, feature_writer._write_hidden = replace, write_hidden
    write_all(Path(store))


def hold_lock(store: str, ready: str) -> None:
    """Child entry point: write one shard, signal `ready`, then wait to be killed (lock held)."""
    import time

    from walla.store.features import open_writer

    spec, rows, hidden = spec_and_data()
    with open_writer(Path(store), spec, hidden_size=HIDDEN, total_rows=N_ROWS, chunk_rows=CHUNK_ROWS) as w:
        w.write_shard(rows[:SHARD], hidden[:SHARD])
        Path(ready).write_text("ok")
        time.sleep(60)
