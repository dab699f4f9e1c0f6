"""Batch composition, sizes and the fingerprint; the overlapped shard pipeline; what a resumed run reuses.

A tiny local HF model in bf16 on the CPU stands in for a GPU run: `--backend-arg batch_invariant=off` gives the padded
batches CUDA runs by default, so the same fingerprint rules apply (`--backend-arg batch_invariant=off`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_model import register_tiny_catalog
from walla.extract import run as run_mod
from walla.extract.backends import BackendRequest
from walla.extract.backends.dummy import DummyBackend
from walla.extract.backends.hf import BATCH_ORDER, FP32_PADDED_BOUND, HF, HFOptions, explain_batch_invariant
from walla.extract.backends.hf import _kind as hf_kind
from walla.extract.backends.hf import _modes as hf_modes
from walla.extract.config import ExtractConfig
from walla.extract.models import ResolvedModel
from walla.extract.variant import call_ranges
from walla.store.features import _writer as feature_writer
from walla.store.features import read_feature_set

QUESTIONS = [
    ("Which gas do plants take in ?", "the sun"),
    ("Is the door red ?", "the moon"),
    ("Is the cat on the mat ?", "a tree"),
    ("Which star ?", "root"),
    ("Is the door of room 42 painted blue ?", "leaf"),
    ("Which gas ?", "water light"),
    ("Is the dog in the park with a ball ?", "the sun"),
]


@pytest.fixture
def tiny_setup(tmp_path, monkeypatch):
    """A local tiny Llama checkpoint as model `tiny` and a 7-question jsonl dataset `mine`; returns the data file."""
    return register_tiny_catalog(tmp_path, monkeypatch, QUESTIONS, seed=3)


def _cfg(tmp_path: Path, data: Path, store: str = "s", **kw) -> ExtractConfig:
    base = dict(model="tiny", dataset="mine", backend="hf", data_file=data, progress=False, device="cpu")
    return ExtractConfig(**{**base, "store": tmp_path / store, **kw})


def _run(cfg: ExtractConfig) -> tuple[Path, list[str]]:
    lines: list[str] = []
    (path,) = run_mod.run(cfg, out=lines.append)
    return path, lines


def test_batch_invariance_auto_by_dtype_and_device(monkeypatch):
    bf16, fp32 = torch.bfloat16, torch.float32
    assert explain_batch_invariant("auto", bf16, "cpu")[0] is True
    # CUDA: the one switch hf_modes.CUDA_INVARIANT_BY_DEFAULT decides between fixed shapes and padded batches
    monkeypatch.setattr(hf_modes, "CUDA_INVARIANT_BY_DEFAULT", False)
    on_cuda, why = explain_batch_invariant("auto", bf16, "cuda:0")
    assert on_cuda is False and why.startswith("batch-invariant auto -> off: padded batches on cuda:0")
    assert "the fingerprint records batch tokens, shard rows and order" in why
    monkeypatch.setattr(hf_modes, "CUDA_INVARIANT_BY_DEFAULT", True)
    on_cuda, why = explain_batch_invariant("auto", bf16, "cuda:0")
    assert on_cuda is True and why.startswith("batch-invariant auto -> on: fixed-shape packs of 8192 tokens")
    assert explain_batch_invariant("auto", fp32, "cuda")[0] is False
    assert explain_batch_invariant("on", fp32, "cuda") == (
        True,
        "batch-invariant on (fixed path) [--backend-arg batch_invariant]",
    )
    with pytest.raises(ValueError, match="batch_invariant must be auto, on, off or fixed, got 'yes'"):
        explain_batch_invariant("yes", bf16, "cpu")


def test_the_fingerprint_holds_the_batching_only_where_outputs_depend_on_it(tmp_path, tiny_setup):
    padded, lines = _run(
        _cfg(
            tmp_path,
            tiny_setup,
            dtype="bfloat16",
            backend_args={"batch_invariant": "off"},
            batch_tokens=64,
            shard_rows=3,
        )
    )
    meta = read_feature_set(padded).meta
    assert meta["inputs"]["batching"] == {"batch_tokens": 64, "shard_rows": 3, "order": BATCH_ORDER}
    assert "batch_invariant" not in meta["inputs"]
    assert meta["inputs"]["determinism"] == "batch-recorded" and meta["inputs"]["device"] == "cpu"
    assert meta["inputs"]["accelerator"]  # batch-dependent reduced precision: the kernels' chip is recorded
    assert (
        "--dtype bfloat16 --device cpu --backend-arg compile=off --backend-arg batch_invariant=off "
        "--batch-tokens 64 --shard-rows 3" in meta["command"]
    )
    assert "batch-invariant off [--backend-arg batch_invariant]" in lines
    assert "batch tokens 64 [--batch-tokens]; shard rows 3 [--shard-rows]" in lines
    # invariant (the CPU's bf16 default): sizes stay out, so other sizes give the same feature set
    packed, _ = _run(_cfg(tmp_path, tiny_setup, dtype="bfloat16", batch_tokens=64, shard_rows=3))
    again, lines = _run(_cfg(tmp_path, tiny_setup, dtype="bfloat16", batch_tokens=4096, shard_rows=5))
    inputs = read_feature_set(packed).meta["inputs"]
    assert inputs["batch_invariant"] is True and "batching" not in inputs and again == packed
    assert any(x.startswith("batch-invariant auto -> on: packed prompts") for x in lines)
    assert "--backend-arg batch_invariant=on" in read_feature_set(packed).meta["command"]
    assert inputs["determinism"] == "bitwise" and "accelerator" not in inputs
    # float32: neither key (as before the option existed); its tier says so, with its bound
    fp32, _ = _run(
        _cfg(tmp_path, tiny_setup, dtype="float32", backend_args={"batch_invariant": "off"}, batch_tokens=64)
    )
    inputs = read_feature_set(fp32).meta["inputs"]
    assert "batching" not in inputs and "batch_invariant" not in inputs
    assert inputs["determinism"] == "tolerance" and inputs["tolerance"] == FP32_PADDED_BOUND
    assert len({padded, packed, fp32}) == 3


def test_a_resumed_run_reuses_the_recorded_sizes_instead_of_sizing_again(tmp_path, tiny_setup, monkeypatch):
    explicit = dict(dtype="bfloat16", backend_args={"batch_invariant": "off"}, batch_tokens=64, shard_rows=2)
    calls = {"n": 0}
    orig = run_mod.score_and_write.__globals__["score_range"]

    def flaky(*a, **k):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return orig(*a, **k)

    monkeypatch.setitem(run_mod.score_and_write.__globals__, "score_range", flaky)
    with pytest.raises(KeyboardInterrupt):
        _run(_cfg(tmp_path, tiny_setup, **explicit))
    monkeypatch.setitem(run_mod.score_and_write.__globals__, "score_range", orig)
    # auto sizes (8,192 / 256 on this CPU) would be another fingerprint: the recorded ones are reused
    path, lines = _run(_cfg(tmp_path, tiny_setup, dtype="bfloat16", backend_args={"batch_invariant": "off"}))
    assert any(
        x.startswith("batch tokens 64, shard rows 2: as the incomplete feature set tiny/mine/none")
        for x in lines
    )
    assert any("resuming tiny/mine/none after 4 durable rows" in x for x in lines)
    fresh, _ = _run(_cfg(tmp_path, tiny_setup, store="fresh", **explicit))
    assert path.name == fresh.name  # the same fingerprint as the uninterrupted run with those sizes
    a, b = read_feature_set(path), read_feature_set(fresh)
    assert a.rows.equals(b.rows)
    np.testing.assert_array_equal(np.asarray(a.hidden[:]), np.asarray(b.hidden[:]))
    # complete now: found again without sizing, and not extracted twice
    _, lines = _run(_cfg(tmp_path, tiny_setup, dtype="bfloat16", backend_args={"batch_invariant": "off"}))
    assert lines[-1] == f"already complete: {path}"
    # an explicit size that differs is another feature set: nothing is reused
    _, lines = _run(
        _cfg(tmp_path, tiny_setup, dtype="bfloat16", backend_args={"batch_invariant": "off"}, shard_rows=3)
    )
    assert not any("as the complete feature set" in x for x in lines)
    _run(
        _cfg(
            tmp_path,
            tiny_setup,
            dtype="bfloat16",
            backend_args={"batch_invariant": "off"},
            batch_tokens=64,
            shard_rows=3,
        )
    )
    # now two sets with 64 batch tokens differ only in their shard rows: an auto run must be told which one
    with pytest.raises(
        ValueError, match=r"differ only in their batch sizes \(64 tokens/2 rows and 64 tokens/3 rows"
    ):
        _run(
            _cfg(
                tmp_path,
                tiny_setup,
                dtype="bfloat16",
                backend_args={"batch_invariant": "off"},
                batch_tokens=64,
            )
        )


def test_overlapped_pipeline_keeps_order_and_durability(tmp_path):
    """`--device cuda` turns on the background tokenize/write thread; the fake backend runs it on a CPU."""
    base = dict(model="smollm2-135m", dataset="facts", backend="dummy", size=40, variants=("relevant",))
    cfg = ExtractConfig(**base, store=tmp_path / "s", progress=False, shard_rows=10, device="cuda")
    calls = {"n": 0}
    orig = DummyBackend.score

    def flaky(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 3:  # the write of shard 2 is in flight in the background thread now
            raise KeyboardInterrupt
        return orig(self, *a, **k)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(DummyBackend, "score", flaky)
        with pytest.raises(KeyboardInterrupt):
            run_mod.run(cfg, out=lambda s: None)
    lines: list[str] = []
    (path,) = run_mod.run(cfg, out=lines.append)
    assert any("after 20 durable rows" in s for s in lines)  # both finished shards were written
    serial = ExtractConfig(**base, store=tmp_path / "serial", progress=False, shard_rows=10, device="cpu")
    (path2,) = run_mod.run(serial, out=lambda s: None)
    a, b = read_feature_set(path), read_feature_set(path2)
    assert a.rows.equals(b.rows)
    np.testing.assert_array_equal(np.asarray(a.hidden[:]), np.asarray(b.hidden[:]))


def test_a_failed_background_write_fails_the_run(tmp_path, monkeypatch):
    cfg = ExtractConfig(
        model="smollm2-135m",
        dataset="facts",
        backend="dummy",
        size=30,
        variants=("none",),
        store=tmp_path / "s",
        progress=False,
        shard_rows=10,
        device="cuda",
    )
    orig, seen = feature_writer._write_hidden, []

    def disk_full(arr, start, hidden):
        seen.append(start)
        if start == 10:
            raise OSError(28, "No space left on device")
        return orig(arr, start, hidden)

    monkeypatch.setattr(feature_writer, "_write_hidden", disk_full)
    with pytest.raises(OSError, match="No space left"):
        run_mod.run(cfg, out=lambda s: None)
    assert seen == [0, 10]  # nothing after the failed write was written
    monkeypatch.setattr(feature_writer, "_write_hidden", orig)
    lines: list[str] = []
    run_mod.run(cfg, out=lines.append)
    assert any("after 10 durable rows" in s for s in lines)


def test_score_calls_are_cut_at_multiples_of_the_shard_rows():
    assert call_ranges(0, 10, None) == [(0, 10)]
    assert call_ranges(0, 10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert call_ranges(6, 13, 4) == [(6, 8), (8, 12), (12, 13)]  # a Ray range of whole zarr chunks
    assert call_ranges(8, 12, 4) == [(8, 12)]


def test_hf_kind_sizes_a_cuda_request_from_free_memory_and_config(tmp_path, tiny_setup, monkeypatch):
    """The glue around extract/sizing.py, with the CUDA figures faked: config read without weights."""
    rm = ResolvedModel("tiny", str(tmp_path / "tiny"), None, None, {"source": "local"})
    req = BackendRequest(rm, "bfloat16", "cuda", False, 32)
    default = HF.settle(req, HFOptions()).options.batch_invariant  # CUDA's default: one switch in hf/modes.py
    assert default == ("fixed" if hf_modes.CUDA_INVARIANT_BY_DEFAULT else "off")
    padded = HFOptions(batch_invariant="off")  # the sizes are recorded where the batching decides the bits
    # no CUDA in this process: the fallback, and why
    settled = HF.settle(req, padded)
    assert (settled.batch_tokens, settled.shard_rows, settled.options.batch_invariant) == (
        16_384,
        8192,
        "off",
    )
    assert any("CUDA is not visible from this process" in w for w in settled.why)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (3 << 30, 8 << 30))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=0: (9, 0))
    settled = HF.settle(req, padded)
    why = " ".join(settled.why)
    assert settled.batch_tokens == 65_536 and "3.0 GiB free" in why and "2 layers, hidden 32" in why
    assert hf_kind.model_shape(rm, "bfloat16").intermediate == 64
    kept = HF.settle(replace(req, batch_tokens=1024, shard_rows=16), padded)
    assert (kept.batch_tokens, kept.shard_rows) == (1024, 16)
    assert settled.identity["batching"] == {"batch_tokens": 65_536, "shard_rows": 8192, "order": BATCH_ORDER}
    assert settled.identity["accelerator"] == "NVIDIA H200" and settled.identity["device"] == "cuda"
