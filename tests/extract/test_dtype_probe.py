"""`--dtype auto` decision logic (extract/dtype_probe.py) with fake timings: no real timing is asserted."""

from __future__ import annotations

import json

import pytest
import torch
from walla.extract import dtype_probe as dp


def fake(rates: dict[str, float], calls: list | None = None):
    """A Measure that returns fixed GFLOP/s per dtype and records what it was asked."""

    def measure(dtype: str, device: str) -> float:
        if calls is not None:
            calls.append((dtype, device))
        return rates[dtype]

    return measure


def test_decide_prefers_native_bf16_and_rejects_emulated_bf16():
    assert dp.decide({"float32": 110.0, "bfloat16": 1300.0}) == "bfloat16"  # AMX
    assert dp.decide({"float32": 110.0, "bfloat16": 25.0}) == "float32"  # emulated: 4x slower
    assert dp.decide({"float32": 100.0, "bfloat16": 110.0}) == "float32"  # within the margin: not worth it
    assert dp.decide({"float32": 100.0, "bfloat16": 130.0}) == "bfloat16"
    assert dp.decide({"float32": 100.0}) == "float32"
    assert dp.decide({"float32": 10.0, "float16": 80.0}) == "float16"


def test_measure_all_keeps_the_best_of_interleaved_rounds():
    seq = iter([50.0, 10.0, 120.0, 30.0, 80.0, 20.0])  # f32, bf16, f32, bf16, ...

    def noisy(dtype: str, device: str) -> float:
        return next(seq)

    assert dp.measure_all("cpu", noisy, rounds=3) == {"float32": 120.0, "bfloat16": 30.0}


def test_cpu_candidates_never_include_float16():
    assert dp.candidates("cpu") == ["float32", "bfloat16"]


def test_probe_measures_once_then_reads_the_per_machine_cache(tmp_path):
    calls: list = []
    first = dp.probe("cpu", tmp_path, measure=fake({"float32": 100.0, "bfloat16": 900.0}, calls))
    assert first.dtype == "bfloat16" and first.cached is None and len(calls) == 2 * dp.ROUNDS
    assert {c[1] for c in calls} == {"cpu"}
    (cache_file,) = tmp_path.glob("*.json")
    assert cache_file.name == f"{dp.machine_key('cpu')}.json"
    again = dp.probe("cpu", tmp_path, measure=fake({"float32": 100.0, "bfloat16": 1.0}, calls))
    assert again.dtype == "bfloat16" and again.cached == str(cache_file)
    assert len(calls) == 2 * dp.ROUNDS  # no new measurement
    assert "bfloat16 900" in again.why() and "float32 100" in again.why() and "9.0x float32" in again.why()
    fresh = dp.probe("cpu", tmp_path, refresh=True, measure=fake({"float32": 100.0, "bfloat16": 1.0}))
    assert fresh.dtype == "float32" and "no lower-precision dtype" in fresh.why()
    assert json.loads(cache_file.read_text())["gflops"] == {"float32": 100.0, "bfloat16": 1.0}


def test_unreadable_cache_is_measured_again(tmp_path):
    (tmp_path / f"{dp.machine_key('cpu')}.json").write_text("{not json")
    choice = dp.probe("cpu", tmp_path, measure=fake({"float32": 100.0, "bfloat16": 20.0}))
    assert choice.dtype == "float32" and choice.cached is None


def test_machine_key_depends_on_threads():
    n = torch.get_num_threads()
    try:
        a = dp.machine_key("cpu")
        torch.set_num_threads(n + 1)
        assert dp.machine_key("cpu") != a and a.startswith("cpu-")
    finally:
        torch.set_num_threads(n)


def test_resolve_explicit_and_unknown(tmp_path, monkeypatch):
    monkeypatch.setattr(dp, "gemm_gflops", fake({"float32": 100.0, "bfloat16": 130.0}))
    assert dp.resolve("float32", "cpu", tmp_path) == ("float32", "float32: as given, not measured")
    with pytest.raises(ValueError, match="dtype must be one of auto"):
        dp.resolve("fp8", "cpu", tmp_path)
    name, why = dp.resolve("auto", "cpu", tmp_path)
    assert name == "bfloat16" and why.startswith(
        "auto -> bfloat16: GEMM probe on cpu (1024x1024x1024, best of 3) bfloat16 130, float32 100 GFLOP/s"
    )


def test_real_gemm_probe_returns_a_positive_rate():
    assert dp.gemm_gflops("float32", "cpu", n=64, reps=1) > 0


def test_the_probe_is_sized_to_the_device_and_says_what_it_measured():
    assert dp.probe_shape("cpu") == (1024, 2, 1)  # unchanged on a CPU: ~1 s in all
    assert dp.probe_shape("cuda:0") == (8192, 10, 3)  # compute-bound on a GPU, with warm-up
    h100 = dp.DtypeChoice("bfloat16", {"float32": 52_000.0, "bfloat16": 785_000.0}, "cuda", n=8192)
    assert h100.why() == (
        "bfloat16: GEMM probe on cuda (8192x8192x8192, best of 3) bfloat16 785.0, float32 52.0 TFLOP/s; "
        "15.1x float32 (measured now)"
    )


def test_a_cache_of_another_gemm_side_is_measured_again(tmp_path):
    path = tmp_path / f"{dp.machine_key('cpu')}.json"
    path.write_text(json.dumps({"gflops": {"float32": 100.0, "bfloat16": 900.0}}))  # before "n": PROBE_N
    assert dp.probe("cpu", tmp_path, measure=fake({"float32": 1.0, "bfloat16": 1.0})).cached == str(path)
    path.write_text(json.dumps({"gflops": {"float32": 100.0, "bfloat16": 900.0}, "n": 2048}))
    again = dp.probe("cpu", tmp_path, measure=fake({"float32": 100.0, "bfloat16": 20.0}))
    assert again.cached is None and again.dtype == "float32"
    assert json.loads(path.read_text())["n"] == 1024
