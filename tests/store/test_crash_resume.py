"""A writer killed with SIGKILL at every durable step leaves nothing a reader accepts; a rerun resumes
from the last complete shard and ends byte-identical (same per-file sha256) to an uninterrupted run."""

from __future__ import annotations

import multiprocessing
import signal
import time

import numpy as np
import polars as pl
import pytest
import store_crash_writer as cw
from walla.store.features import (
    IncompleteError,
    LockedError,
    find_complete,
    list_feature_sets,
    open_writer,
    read_feature_set,
)


@pytest.fixture(scope="module")
def ctx():
    # forkserver: children fork from a clean single-threaded server that has the modules imported
    # (fast: no interpreter start per crash, and no inherited zarr/polars threads).
    c = multiprocessing.get_context("forkserver")
    c.set_forkserver_preload(["store_crash_writer", "store_fixtures", "walla.store.features._format"])
    return c


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    store = tmp_path_factory.mktemp("clean")
    n_steps = cw.count_steps(store)
    spec, _, _ = cw.spec_and_data()
    return read_feature_set(find_complete(store, spec), verify=True), n_steps


def _run_child(ctx, target, *args) -> int:
    p = ctx.Process(target=target, args=args)
    p.start()
    p.join(30)
    return p.exitcode


def test_kill_at_every_step_then_resume(ctx, clean, tmp_path):
    ref, n_steps = clean
    # steps: writer.json, 3 x (hidden region write, shard rename), rows.parquet, meta.json, directory rename
    assert n_steps == 10
    spec, _, _ = cw.spec_and_data()
    boundaries = {0, cw.SHARD, 2 * cw.SHARD, cw.N_ROWS}
    checked = 0
    for crash_at in range(n_steps):
        for flavor in ("before", "mid"):
            store = tmp_path / f"s{crash_at}{flavor}"
            code = _run_child(ctx, cw.crash_run, str(store), crash_at, flavor)
            assert code == -signal.SIGKILL, f"child exit code {code} at step {crash_at}/{flavor}"
            committed = crash_at == n_steps - 1 and flavor == "mid"  # killed right after the final rename
            if not committed:
                assert find_complete(store, spec) is None, (crash_at, flavor)
                infos = list_feature_sets(store)
                assert [i.status for i in infos] in ([], ["incomplete"])
                for info in infos:
                    with pytest.raises(
                        IncompleteError, match="walla extract --model crashy --dataset toy --variants none"
                    ):
                        read_feature_set(info.path)
            with open_writer(
                store, spec, hidden_size=cw.HIDDEN, total_rows=cw.N_ROWS, chunk_rows=cw.CHUNK_ROWS
            ) as w:
                assert w.done_rows in boundaries  # resumes from the last complete shard, never mid-shard
            path = cw.write_all(store)  # the rerun
            got = read_feature_set(path, verify=True)
            assert got.meta["checksums"] == ref.meta["checksums"], (crash_at, flavor)  # byte-identical files
            assert got.rows.equals(ref.rows)
            np.testing.assert_array_equal(got.hidden[:], ref.hidden[:])
            assert [i.status for i in list_feature_sets(store)] == ["complete"]
            assert sorted(p.name for p in path.parent.iterdir()) == [path.name, path.name + ".lock"]
            checked += 1
    assert checked == 2 * n_steps


def test_dead_writer_releases_lock_and_live_one_blocks(ctx, tmp_path):
    spec, rows, hidden = cw.spec_and_data()
    ready = tmp_path / "ready"
    p = ctx.Process(target=cw.hold_lock, args=(str(tmp_path), str(ready)))
    p.start()
    try:
        for _ in range(300):
            if ready.exists():
                break
            time.sleep(0.05)
        assert ready.exists()
        with pytest.raises(LockedError, match="being written by another process"):
            with open_writer(tmp_path, spec, hidden_size=cw.HIDDEN, total_rows=cw.N_ROWS):
                pass
        assert [i.status for i in list_feature_sets(tmp_path)] == ["writing"]
    finally:
        p.kill()
        p.join()
    with open_writer(tmp_path, spec, hidden_size=cw.HIDDEN, total_rows=cw.N_ROWS) as w:
        assert w.done_rows == cw.SHARD
        for s in range(w.done_rows, cw.N_ROWS, 7):  # a different shard size on resume is fine
            w.write_shard(rows[s : s + 7], hidden[s : s + 7])
        path = w.commit()
    fs = read_feature_set(path, verify=True)
    assert fs.rows["question_id"].to_list() == rows["question_id"].to_list()
    np.testing.assert_array_equal(fs.hidden[:], hidden)
    assert fs.rows.drop("context_source_id").equals(
        rows.drop("context_source_id").cast(fs.rows.drop("context_source_id").schema)
    )
    assert pl.read_parquet(path / "rows.parquet").height == cw.N_ROWS
