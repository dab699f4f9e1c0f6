"""`walla-extract --workers N`: Ray actors over row ranges of one feature set, on a local or S3 store.

A local Ray with 2 CPU workers and moto's S3 server run in this process (no network). A worker killed
(SIGKILL) midway has its range redone by another; a driver that dies midway is resumed by a rerun that
keeps the finished ranges; the result equals the single-process extraction of the same rows.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import numpy as np
import pytest
from tiny_model import tiny_model, tiny_tokenizer
from typer.testing import CliRunner
from walla.extract import distributed
from walla.extract import run as run_mod
from walla.extract.cli import app
from walla.extract.config import ExtractConfig
from walla.manifests import catalog
from walla.store.cli import app as store_app
from walla.store.features import list_feature_sets, read_feature_set


@pytest.fixture(scope="module")
def local_ray(s3_server):
    """One local Ray (2 CPUs) for the module, started after the S3 env is set (workers inherit it)."""
    ray = pytest.importorskip("ray", reason="--workers needs the ray extra: pip install 'walla[ray]'")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    yield
    ray.shutdown()


class DriverDied(Exception):
    pass


def _tiny_setup(tmp_path, monkeypatch, n: int = 36):
    """A tiny local HF model and a jsonl dataset of n questions, registered in the (driver's) catalogs."""
    tok = tiny_tokenizer()
    mdir = tmp_path / "tiny"
    tiny_model(len(tok), seed=3).save_pretrained(mdir)
    tok.save_pretrained(mdir)
    models = dict(catalog.load_models())
    models["tiny"] = catalog.ModelEntry(
        name="tiny", source="local", path=str(mdir), hidden_size=32, dtype="float32"
    )
    monkeypatch.setattr(catalog, "load_models", lambda: models)
    words = ["oxygen", "helium", "water", "light", "moon", "tree"]
    data = tmp_path / "mine.jsonl"
    data.write_text(
        "".join(
            json.dumps(
                {
                    "id": f"r{i}",
                    "question": f"Which {words[i % 6]} is the {words[(i * 5) % 6]} ?",
                    "options": words[i % 3 : i % 3 + 2 + i % 2],
                    "label": i % 2,
                    "split": ["train", "val", "test"][i % 3],
                }
            )
            + "\n"
            for i in range(n)
        )
    )
    datasets_ = dict(catalog.load_datasets())
    datasets_["mine"] = catalog.DatasetEntry(name="mine", loader="jsonl", split_protocol={"mode": "given"})
    monkeypatch.setattr(catalog, "load_datasets", lambda: datasets_)
    return ExtractConfig(
        model="tiny",
        dataset="mine",
        backend="hf",
        data_file=data,
        progress=False,
        device="cpu",
        batch_tokens=64,
        shard_rows=4,
        dtype="float32",
    )


def _assert_same(a, b) -> None:
    fa, fb = read_feature_set(a), read_feature_set(b)
    assert fa.fingerprint == fb.fingerprint
    ra, rb = fa.rows, fb.rows
    assert ra.drop("option_logprobs", "raw_option_logprobs", "prompt_nll").equals(
        rb.drop("option_logprobs", "raw_option_logprobs", "prompt_nll")
    )
    for c in ("option_logprobs", "raw_option_logprobs", "prompt_nll"):
        x = np.concatenate(ra[c].to_list()) if c != "prompt_nll" else ra[c].to_numpy()
        y = np.concatenate(rb[c].to_list()) if c != "prompt_nll" else rb[c].to_numpy()
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-6, err_msg=c)
    np.testing.assert_array_equal(np.asarray(fa.hidden[:]), np.asarray(fb.hidden[:]))  # float16, exact


@pytest.mark.heavy
def test_killed_worker_and_killed_driver_on_s3_give_the_single_process_result(
    tmp_path, monkeypatch, s3_store, local_ray
):
    cfg = _tiny_setup(tmp_path, monkeypatch)
    [want] = run_mod.run(ExtractConfig(**{**cfg.__dict__, "store": tmp_path / "one"}), out=lambda s: None)

    done = []

    def after_range(pool, pieces):  # the driver's view after each finished range
        done.append(pieces)
        if len(done) == 1:  # SIGKILL one worker process: its range (running or next) must be redone
            os.kill(pool.info[pool.actors[0]]["pid"], signal.SIGKILL)
        if len(done) == 5:
            raise DriverDied  # then the driver itself dies, leaving finished ranges behind

    monkeypatch.setattr(distributed, "_after_range", after_range)
    lines = []
    par = ExtractConfig(**{**cfg.__dict__, "store": s3_store, "workers": 2})
    with pytest.raises(DriverDied):
        run_mod.run(par, out=lines.append)
    assert any("died during rows" in s and "redone by another worker" in s for s in lines), lines
    [info] = list_feature_sets(s3_store)
    assert info.status == "incomplete" and 5 * 4 <= info.done_rows < 36

    monkeypatch.setattr(distributed, "_after_range", lambda pool, pieces: None)
    lines.clear()
    [got] = run_mod.run(par, out=lines.append)
    assert any(s.startswith("resuming tiny/mine/none:") and "finished ranges kept" in s for s in lines), lines
    assert str(got).startswith("s3://")
    _assert_same(want, got)
    cw, cg = read_feature_set(want).meta["compute"], read_feature_set(got).meta["compute"]
    assert cg["workers"] == 2 and cg["prompt_tokens"] == cw["prompt_tokens"]
    assert cg["n_params_non_embedding"] == cw["n_params_non_embedding"] > 0
    r = CliRunner().invoke(store_app, ["verify", "--store", s3_store])
    assert r.exit_code == 0 and "OK" in r.output, (r.output, r.stderr)


@pytest.mark.heavy
def test_cli_workers_on_a_local_store_equals_one_process(tmp_path, local_ray):
    args = ["--model", "smollm2-135m", "--dataset", "facts", "--backend", "dummy", "--size", "30"]
    args += ["--shard-rows", "4", "--no-progress", "--variants", "none,irrelevant"]
    one = CliRunner().invoke(app, [*args, "--store", str(tmp_path / "one")])
    assert one.exit_code == 0, one.output
    par = CliRunner().invoke(app, [*args, "--store", f"file://{tmp_path / 'par'}", "--workers", "2"])
    assert par.exit_code == 0, (par.output, par.stderr)
    assert "2 workers on a local Ray" in par.output
    a = list_feature_sets(tmp_path / "one")
    b = list_feature_sets(tmp_path / "par")
    assert [i.status for i in b] == ["complete", "complete"]
    for x, y in zip(a, b, strict=True):
        _assert_same(x.path, y.path)


def test_without_ray_installed_workers_fail_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    r = CliRunner().invoke(
        app,
        ["--model", "smollm2-135m", "--dataset", "facts", "--backend", "dummy", "--size", "12"]
        + ["--store", str(tmp_path), "--workers", "2", "--no-progress"],
    )
    assert r.exit_code == 1
    assert r.stderr.strip().splitlines() == [
        "walla extract: error: --workers/--ray-address need Ray, which is not installed: pip install 'walla[ray]'"
    ]


def test_unusable_store_urls_fail_in_one_line(tmp_path):
    r = CliRunner().invoke(
        app, ["--model", "smollm2-135m", "--dataset", "facts", "--backend", "dummy", "--store", "foo://x/y"]
    )
    assert r.exit_code == 1
    assert r.stderr.strip() == "walla extract: error: store foo://x/y: Protocol not known: foo"
    r = CliRunner().invoke(store_app, ["ls", "--store", "foo://x/y"])
    assert (
        r.exit_code == 1
        and r.stderr.strip() == "walla store: error: store foo://x/y: Protocol not known: foo"
    )
