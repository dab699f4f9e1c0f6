"""The store on an object store (moto's S3 server in this process) reads and writes like a local one.

Same bytes (per-file checksums), same listing, same verification and removal, same assembled scenario;
an interrupted remote write is resumed, and parallel writers' row ranges (with holes until every range
is in) commit to the same feature set on both kinds of store.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from store_fixtures import build_store, make_questions, make_rows
from typer.testing import CliRunner
from walla.manifests.catalog import DatasetEntry
from walla.manifests.scenario import Scenario, ScenarioSpec
from walla.store.cli import app
from walla.store.features import (
    FeatureSetSpec,
    IncompleteError,
    attach_writer,
    list_feature_sets,
    open_writer,
    read_feature_set,
    validate_rows,
)
from walla.store.location import RemotePath, as_location
from walla.store.questions import read_question_table, write_question_table
from walla.store.scenario import assemble_scenario

DATASETS = {
    "toy": DatasetEntry(name="toy", loader="jsonl", split_protocol={"mode": "uniform"}, has_context=True)
}
AGENTS = {"aloe": 1, "bio": 2}


def _entry() -> ScenarioSpec:
    return ScenarioSpec(
        name="t",
        dataset="toy",
        agents=("aloe", "bio", "aloe"),
        description="",
        context_rule="one_relevant_one_irrelevant",
        context_seed=3,
    )


def test_s3_store_equals_local_store_and_assembles_the_same(tmp_path, s3_store):
    q = make_questions(90, k_min=2, k_max=4)
    variants = ["none", "relevant", "irrelevant"]
    local = tmp_path / "store"
    for root in (local, s3_store):
        build_store(root, "toy", q, AGENTS, variants, chunk_rows=16, prompt=True)
    remote = as_location(s3_store)
    assert isinstance(remote, RemotePath) and str(remote) == s3_store
    infos = {str(root): list_feature_sets(root) for root in (local, s3_store)}
    assert [i.status for i in infos[s3_store]] == ["complete"] * 6
    assert [i.fingerprint for i in infos[s3_store]] == [i.fingerprint for i in infos[str(local)]]
    for a, b in zip(infos[str(local)], infos[s3_store], strict=True):
        fa, fb = read_feature_set(a.path), read_feature_set(b.path)  # verified: checksums recomputed
        assert fa.meta["checksums"] == fb.meta["checksums"]  # the same bytes, file by file
        assert fa.rows.equals(fb.rows)
        np.testing.assert_array_equal(fa.hidden[:], fb.hidden[:])
    assert read_question_table(s3_store, "toy")[0].equals(read_question_table(local, "toy")[0])

    want = assemble_scenario(Scenario(_entry(), {}, DATASETS), local)
    got = assemble_scenario(Scenario(_entry(), {}, DATASETS), s3_store)
    for f in dataclasses.fields(want):
        a, b = getattr(want, f.name), getattr(got, f.name)
        if f.name == "meta":
            assert a["feature_sets"].keys() == b["feature_sets"].keys()
            assert b["store"] == s3_store
        elif f.name == "hidden":
            assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
        elif isinstance(a, np.ndarray):
            np.testing.assert_array_equal(a, b, err_msg=f.name)
        else:
            assert a == b, f.name


def test_store_cli_on_s3_ls_verify_rm(s3_store):
    q = make_questions(40)
    build_store(s3_store, "toy", q, {"aloe": 1}, ["none", "relevant"], chunk_rows=8)
    runner = CliRunner()
    r = runner.invoke(app, ["ls", "--store", s3_store])
    assert r.exit_code == 0, r.output
    assert "2 feature sets (2 complete), 1 question tables" in " ".join(r.output.split())
    r = runner.invoke(app, ["verify", "--store", s3_store])
    assert r.exit_code == 0 and r.output.count("OK") == 3, r.output

    info = list_feature_sets(s3_store, variant="relevant")[0]
    chunk = info.path / "hidden.zarr" / "c" / "1" / "0"
    data = bytearray(chunk.read_bytes())
    data[5] ^= 0xFF
    chunk.write_bytes(bytes(data))  # corrupt one chunk object
    r = runner.invoke(app, ["verify", "--store", s3_store])
    assert r.exit_code == 1
    assert f"checksum mismatch: {chunk} changed after it was written" in r.stderr
    assert f"walla store rm {info.fingerprint} --store {s3_store} --yes" in r.stderr

    r = runner.invoke(app, ["rm", info.fingerprint[:8], "--store", s3_store, "--yes"])
    assert r.exit_code == 0, r.output
    assert not info.path.exists()
    assert [i.variant for i in list_feature_sets(s3_store)] == ["none"]
    r = runner.invoke(app, ["verify", "--store", s3_store])
    assert r.exit_code == 0, r.stderr


def test_interrupted_remote_write_resumes_in_place(s3_store):
    q = make_questions(50)
    qfp = write_question_table(s3_store, "toy", q, {"synthetic": True})
    rows, hidden = make_rows(q, "none", hidden_size=8)
    spec = FeatureSetSpec("aloe", "toy", "none", {"questions_fp": qfp})
    with open_writer(s3_store, spec, hidden_size=8, total_rows=50, chunk_rows=10) as w:
        w.write_shard(rows[:20], hidden[:20])  # then the writer "dies": no commit
    path = spec.path(s3_store)
    [info] = list_feature_sets(s3_store)
    assert (info.status, info.done_rows, info.n_rows, info.path) == ("incomplete", 20, 50, path)
    with pytest.raises(IncompleteError, match="meta.json is missing"):
        read_feature_set(path)
    r = CliRunner().invoke(app, ["verify", "--store", s3_store])
    assert r.exit_code == 0 and "SKIP" in r.output, r.output
    with open_writer(s3_store, spec, hidden_size=8, total_rows=50) as w:
        assert w.done_rows == 20
        for s in range(20, 50, 20):
            w.write_shard(rows[s : s + 20], hidden[s : s + 20])
        assert w.commit() == path
    fs = read_feature_set(path)
    assert fs.rows.equals(validate_rows(rows, "none")) and np.array_equal(fs.hidden[:], hidden)


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_parallel_ranges_with_holes_commit(kind, tmp_path, request):
    store = str(tmp_path / "s") if kind == "local" else request.getfixturevalue("s3_store")
    q = make_questions(70)
    qfp = write_question_table(store, "toy", q, {"synthetic": True})
    rows, hidden = make_rows(q, "none", hidden_size=8)
    spec = FeatureSetSpec("aloe", "toy", "none", {"questions_fp": qfp})
    with open_writer(store, spec, hidden_size=8, total_rows=70, chunk_rows=10) as w:
        tasks = w.missing(20)
        assert tasks == [[(0, 20)], [(20, 40)], [(40, 60)], [(60, 70)]]
        worker = attach_writer(store, spec)  # what a Ray worker does, in another process
        for a, b in [(40, 60), (0, 20), (60, 70)]:  # out of order, one range still missing
            worker.write_range(a, rows[a:b], hidden[a:b])
        with pytest.raises(ValueError, match="overlap a durable shard"):
            worker.write_range(30, rows[30:50], hidden[30:50])
        w.refresh()
        assert w.done_rows == 20 and w.missing(20) == [[(20, 40)]]
        [info] = list_feature_sets(store)
        assert info.done_rows == 50  # durable rows, holes or not
        with pytest.raises(ValueError, match="commit"):
            w.commit()
        worker.write_range(20, rows[20:40], hidden[20:40])
        path = w.commit()
    fs = read_feature_set(path)
    assert fs.rows.equals(validate_rows(rows, "none")) and np.array_equal(fs.hidden[:], hidden)
