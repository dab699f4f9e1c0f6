from __future__ import annotations

import polars as pl
from store_fixtures import build_store, make_questions, make_rows
from typer.testing import CliRunner
from walla.store.cli import app
from walla.store.features import FeatureSetSpec, list_feature_sets, open_writer

runner = CliRunner()


def _filled(tmp_path):
    q = make_questions(50)
    qfp = build_store(tmp_path, "toy", q, {"aloe": 1}, ["none", "relevant"])
    rows, hidden = make_rows(q, "none")
    with open_writer(tmp_path, FeatureSetSpec("gemma2", "toy", "none", {"questions_fp": qfp}), 8, 50) as w:
        w.write_shard(rows[:20], hidden[:20])  # an interrupted extraction
    return qfp


def test_ls_empty_and_missing(tmp_path):
    r = runner.invoke(app, ["ls", "--store", str(tmp_path)])
    assert r.exit_code == 0 and "is empty" in r.output
    r = runner.invoke(app, ["ls", "--store", str(tmp_path / "nope")])
    assert r.exit_code == 0 and "does not exist" in r.output


def test_ls_filled(tmp_path):
    qfp = _filled(tmp_path)
    r = runner.invoke(app, ["ls", "--store", str(tmp_path)])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    for info in list_feature_sets(tmp_path):
        (line,) = [ln for ln in lines if info.fingerprint in ln]
        assert info.model in line and info.variant in line
        assert (
            ("complete" in line and " 50 " in line)
            if info.model == "aloe"
            else ("incomplete" in line and "20/50" in line)
        )
    assert any(qfp in ln and "questions" in ln for ln in lines)
    assert "3 feature sets (2 complete, 1 incomplete), 1 question tables" in r.output


def test_verify_detects_flipped_byte_and_rm(tmp_path):
    _filled(tmp_path)
    r = runner.invoke(app, ["verify", "--store", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert r.output.count("OK") == 3 and "SKIP" in r.output
    target = next(
        i for i in list_feature_sets(tmp_path) if i.variant == "relevant" and i.status == "complete"
    )
    rows_file = target.path / "rows.parquet"
    data = bytearray(rows_file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    rows_file.write_bytes(bytes(data))
    r = runner.invoke(app, ["verify", "--store", str(tmp_path)])
    assert r.exit_code == 1
    assert "FAIL" in r.output and str(rows_file) in r.output.replace("\n", "")
    r = runner.invoke(app, ["verify", target.fingerprint[:6], "--store", str(tmp_path)])
    assert r.exit_code == 1 and r.output.count("FAIL") == 1 and "OK" not in r.output

    r = runner.invoke(app, ["rm", target.fingerprint[:8], "--store", str(tmp_path), "--yes"])
    assert r.exit_code == 0 and "removed" in r.output
    assert target.fingerprint not in {i.fingerprint for i in list_feature_sets(tmp_path)}
    assert not target.path.exists()
    r = runner.invoke(app, ["rm", "ab", "--store", str(tmp_path), "--yes"])
    assert r.exit_code == 2 and "too short" in r.output
    r = runner.invoke(app, ["rm", "ffffffff", "--store", str(tmp_path), "--yes"])
    assert r.exit_code == 1 and "no entry" in r.output
    incomplete = next(i for i in list_feature_sets(tmp_path) if i.status == "incomplete")
    r = runner.invoke(app, ["rm", incomplete.fingerprint, "--store", str(tmp_path), "--yes"])
    assert r.exit_code == 0 and not incomplete.path.exists()
    r = runner.invoke(app, ["verify", "--store", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert pl.read_parquet(next(i for i in list_feature_sets(tmp_path)).path / "rows.parquet").height == 50
