from __future__ import annotations

import json
import threading

import numpy as np
import polars as pl
import pytest
from store_fixtures import make_questions, make_rows, write_feature_set
from walla.store.features import (
    FeatureSetSpec,
    HiddenReader,
    IncompleteError,
    LockedError,
    StaleSchemaError,
    StoreError,
    default_chunk_rows,
    find_complete,
    list_feature_sets,
    open_writer,
    read_feature_set,
)
from walla.store.questions import read_question_table, write_question_table


def _spec(variant="none", **extra):
    return FeatureSetSpec("m", "toy", variant, {"questions_fp": "qfp", **extra})


def test_round_trip_equality(tmp_path):
    # float16 tolerance: the stored hidden equals hidden.astype(float16) exactly; relative to the float32
    # input the error is <= 2**-11 (half an ulp), which is what we check for the float32 source.
    q = make_questions(70, k_min=2, k_max=5, seed=1)
    rows, hidden16 = make_rows(q, "irrelevant", hidden_size=16, prompt=True)
    hidden32 = hidden16.astype(np.float32) + np.float32(1e-3)  # not exactly representable in float16
    spec = _spec("irrelevant")
    with open_writer(tmp_path, spec, hidden_size=16, total_rows=70, chunk_rows=9) as w:
        assert w.done_rows == 0
        for s in range(0, 70, 25):
            w.write_shard(rows[s : s + 25], hidden32[s : s + 25])
        path = w.commit()
    assert path == find_complete(tmp_path, spec)
    fs = read_feature_set(path, verify=True)
    assert fs.rows.equals(rows.cast(fs.rows.schema))
    assert fs.rows.columns[-1] == "prompt"
    np.testing.assert_array_equal(fs.hidden[:], hidden32.astype(np.float16))
    np.testing.assert_allclose(fs.hidden[:].astype(np.float32), hidden32, rtol=2**-11, atol=2**-24)
    assert fs.meta["n_rows"] == 70 and fs.meta["hidden_size"] == 16 and fs.meta["variant"] == "irrelevant"
    assert fs.meta["inputs"] == spec.inputs and fs.meta["fingerprint"] == spec.fingerprint
    assert fs.hidden.attrs["fingerprint"] == spec.fingerprint  # inputs also live in the zarr attrs
    assert fs.hidden.chunks == (9, 16)
    r = HiddenReader(path / "hidden.zarr")
    assert r.raw
    np.testing.assert_array_equal(r.read(5, 62), fs.hidden[5:62])
    # reopening a complete feature set is a no-op
    with open_writer(tmp_path, spec, hidden_size=16, total_rows=70) as w:
        assert w.complete and w.done_rows == 70
        assert w.commit() == path
        with pytest.raises(StoreError, match="already complete"):
            w.write_shard(rows[:1], hidden16[:1])


def test_default_chunks_are_at_least_1mb():
    for h in (576, 640, 3584, 4096):
        assert default_chunk_rows(h, 10**6) * h * 2 >= 1 << 20
    assert default_chunk_rows(4096, 100) == 100


def test_bad_shards_rejected_with_one_clear_line(tmp_path):
    q = make_questions(10)
    rows, hidden = make_rows(q, "none")
    with open_writer(tmp_path, _spec(), hidden_size=8, total_rows=10) as w:
        with pytest.raises(ValueError, match="expected .* in this order"):
            w.write_shard(rows.select(reversed(rows.columns)), hidden)
        with pytest.raises(ValueError, match=r"shape \(10, 4\)"):
            w.write_shard(rows, hidden[:, :4])
        bad = rows.with_columns(option_logprobs=pl.col("option_logprobs").list.eval(pl.element() - 1.0))
        with pytest.raises(ValueError, match="q00000.*logsumexp"):
            w.write_shard(bad, hidden)
        h = hidden.copy()
        h[3, 2] = np.nan
        with pytest.raises(ValueError, match="q00003.*not finite"):
            w.write_shard(rows, h)
        with pytest.raises(ValueError, match="context_source_id must be null"):
            w.write_shard(rows.with_columns(context_source_id=pl.lit("q1")), hidden)
        w.write_shard(rows[:4], hidden[:4])
        with pytest.raises(ValueError, match="already written"):
            w.write_shard(rows[3:6], hidden[3:6])
        with pytest.raises(ValueError, match="overflows"):
            w.write_shard(
                pl.concat([rows[4:], rows[4:5].with_columns(question_id=pl.lit("extra"))]),
                np.concatenate([hidden[4:], hidden[4:5]]),
            )
        with pytest.raises(StoreError, match="after 4 of 10 rows"):
            w.commit()
    irr, h_irr = make_rows(q, "irrelevant")
    with open_writer(tmp_path, _spec("irrelevant"), hidden_size=8, total_rows=10) as w:
        with pytest.raises(ValueError, match="must record context_source_id"):
            w.write_shard(irr.with_columns(context_source_id=pl.lit(None, dtype=pl.String)), h_irr)


def test_incomplete_is_refused_and_listed(tmp_path):
    q = make_questions(10)
    rows, hidden = make_rows(q, "none")
    with open_writer(tmp_path, _spec(), hidden_size=8, total_rows=10) as w:
        w.write_shard(rows[:5], hidden[:5])
    assert find_complete(tmp_path, _spec()) is None
    (info,) = list_feature_sets(tmp_path)
    assert (info.status, info.done_rows, info.n_rows) == ("incomplete", 5, 10)
    with pytest.raises(IncompleteError, match="walla extract --model m --dataset toy --variants none"):
        read_feature_set(info.path)
    with open_writer(tmp_path, _spec(), hidden_size=8, total_rows=10) as w:
        assert w.done_rows == 5
        w.write_shard(rows[5:], hidden[5:])
        w.commit()
    assert [i.status for i in list_feature_sets(tmp_path)] == ["complete"]


def test_resume_with_other_shape_fails_cleanly(tmp_path):
    q = make_questions(10)
    rows, hidden = make_rows(q, "none")
    with open_writer(tmp_path, _spec(), hidden_size=8, total_rows=10) as w:
        w.write_shard(rows[:5], hidden[:5])
    with pytest.raises(StoreError, match="total_rows: 10 != 12.*walla store rm"):
        with open_writer(tmp_path, _spec(), hidden_size=8, total_rows=12):
            pass


def test_second_writer_fails_or_waits(tmp_path):
    q = make_questions(60)
    rows, hidden = make_rows(q, "none")
    with open_writer(tmp_path, _spec(), hidden_size=8, total_rows=60):
        with pytest.raises(LockedError, match="being written by another process"):
            with open_writer(tmp_path, _spec(), hidden_size=8, total_rows=60):
                pass

    results, errors = [], []

    def writer():
        try:
            with open_writer(tmp_path, _spec("relevant"), hidden_size=8, total_rows=60, lock_timeout=-1) as w:
                results.append(w.done_rows)
                for s in range(w.done_rows, 60, 10):
                    w.write_shard(rows[s : s + 10], hidden[s : s + 10])
                w.commit()
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(results) == [0, 60]  # the waiter found the work done: nothing written twice
    fs = read_feature_set(find_complete(tmp_path, _spec("relevant")), verify=True)
    assert fs.rows["question_id"].to_list() == q["question_id"].to_list()
    np.testing.assert_array_equal(fs.hidden[:], hidden)


@pytest.mark.parametrize("version", [0, 2])
def test_stale_schema_is_one_clear_error(tmp_path, version):
    q = make_questions(12)
    path = write_feature_set(tmp_path, "aloe", "toy", "none", q, "qfp")
    meta = json.loads((path / "meta.json").read_text())
    meta["schema_version"] = version
    (path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(
        StaleSchemaError,
        match=f"schema version {version}.*walla extract --model aloe --dataset toy --variants none",
    ):
        read_feature_set(path)
    assert [i.status for i in list_feature_sets(tmp_path)] == ["stale"]


def test_flipped_byte_and_misaligned_rows_detected(tmp_path):
    q = make_questions(40)
    path = write_feature_set(tmp_path, "m", "toy", "none", q, "qfp", chunk_rows=16)
    chunk = path / "hidden.zarr" / "c" / "1" / "0"
    data = bytearray(chunk.read_bytes())
    data[7] ^= 0x01
    chunk.write_bytes(bytes(data))
    read_feature_set(path, verify=False)  # the opt-out skips only the hashing
    with pytest.raises(StoreError, match="checksum mismatch: .*hidden.zarr/c/1/0"):
        read_feature_set(path)  # verifies by default
    # rows.parquet reordered behind the writer's back: question_id order no longer matches hidden.zarr
    path2 = write_feature_set(tmp_path, "m2", "toy", "none", q, "qfp")
    pl.read_parquet(path2 / "rows.parquet").reverse().write_parquet(path2 / "rows.parquet")
    with pytest.raises(StoreError, match="question_id order"):
        read_feature_set(path2, verify=False)  # the alignment check runs even without hashing


def test_question_table_round_trip_and_validation(tmp_path):
    q = make_questions(30, soft=True, k_min=2, k_max=4)
    fp = write_question_table(tmp_path, "toy", q, {"generator": {"n": 30}})
    assert write_question_table(tmp_path, "toy", q, {"other": "source"}) == fp  # idempotent, content-keyed
    got, got_fp = read_question_table(tmp_path, "toy")
    assert got_fp == fp and got.equals(q.cast(got.schema))
    assert read_question_table(tmp_path, "toy", fp[:6], verify=True)[1] == fp
    fp2 = write_question_table(tmp_path, "toy", q.head(20), {})
    assert fp2 != fp and read_question_table(tmp_path, "toy")[1] == fp2  # newest wins
    with pytest.raises(FileNotFoundError, match="walla extract --model <model> --dataset nope"):
        read_question_table(tmp_path, "nope")
    with pytest.raises(ValueError, match="missing columns \\['subject'\\]"):
        write_question_table(tmp_path, "toy", q.drop("subject"), {})
    with pytest.raises(ValueError, match="split must be one of"):
        write_question_table(tmp_path, "toy", q.with_columns(split=pl.lit("dev")), {})
    with pytest.raises(ValueError, match="question_id is not unique"):
        write_question_table(tmp_path, "toy", q.with_columns(question_id=pl.lit("same")), {})
    bad_gold = q.with_columns(gold_dist=pl.col("gold_dist").list.eval(pl.element() * 2))
    with pytest.raises(ValueError, match="sum to 1"):
        write_question_table(tmp_path, "toy", bad_gold, {})
