"""`--dtype auto` decision logic (extract/dtype_probe.py) with fake timings: no real timing is asserted."""

from __future__ import annotations

import json
import subprocess
import sys
import time

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


def test_pairs_alternate_their_order_and_the_median_ratio_decides():
    seq = iter([100.0, 10.0, 20.0, 200.0, 50.0, 600.0])  # f32, bf16 | bf16, f32 | f32, bf16
    calls: list = []

    def noisy(dtype: str, device: str) -> float:
        calls.append(dtype)
        return next(seq)

    m = dp.measure_pairs("cpu", noisy, samples=3, pause_s=0)
    assert calls == ["float32", "bfloat16", "bfloat16", "float32", "float32", "bfloat16"]
    assert m.ratios == (0.1, 0.1, 12.0) and m.ratio == 0.1  # one odd pair cannot turn the median
    assert "disagree" in m.contended  # ... but the spread says the machine was not quiet


def test_contention_is_read_from_the_threads_share_of_wall_time():
    quiet = dp.measure_pairs("cpu", lambda d, dev: dp.Timing(100.0, 0.97), pause_s=0)
    assert quiet.contended == "" and quiet.ratio == 1.0
    busy = dp.measure_pairs("cpu", lambda d, dev: dp.Timing(100.0, 0.4), pause_s=0)
    assert busy.contended.startswith("GEMM threads ran 40% of the time") and "load" in busy.contended
    calls: list = []
    dp.measure_pairs("cpu", lambda d, dev: calls.append(d) or dp.Timing(1.0, 0.4), pause_s=0, give_up=True)
    assert len(calls) == 2  # the features will decide: one pair is enough to know


def test_the_prior_reads_the_cpus_bf16_flags(monkeypatch):
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    assert dp.prior("cpu", {"avx2", "avx512f", "amx_bf16", "amx_tile"}) == ("bfloat16", "amx_bf16")
    assert dp.prior("cpu", {"avx2", "avx512f", "avx512_bf16"})[0] == "bfloat16"
    assert dp.prior("cpu", {"sse2", "avx2"}) == ("float32", "avx2, no amx_bf16/avx512_bf16 (bf16 emulated)")
    assert dp.prior("cpu", {"fp", "asimd"})[0] is None  # arm: no known flag
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert dp.prior("cpu", {"avx2", "amx_bf16"})[0] == "float32"  # oneDNN capped below AMX
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX")
    assert dp.prior("cpu", {"avx2", "amx_bf16"})[0] == "bfloat16"


def test_cpu_candidates_never_include_float16():
    assert dp.candidates("cpu") == ["float32", "bfloat16"]


def _prior(monkeypatch, dtype: str | None) -> None:
    monkeypatch.setattr(dp, "prior", lambda device: (dtype, "test flags" if dtype else "none"))


def test_a_quiet_verdict_that_agrees_with_the_features_is_cached(tmp_path, monkeypatch):
    _prior(monkeypatch, "bfloat16")
    calls: list = []
    first = dp.probe("cpu", tmp_path, measure=fake({"float32": 100.0, "bfloat16": 900.0}, calls), pause_s=0)
    assert first.dtype == "bfloat16" and first.cached is None and first.stored
    assert len(calls) == 2 * dp.SAMPLES and {c[1] for c in calls} == {"cpu"}
    (cache_file,) = tmp_path.glob("*.json")
    assert cache_file.name == f"{dp.machine_key('cpu')}.json"
    again = dp.probe("cpu", tmp_path, measure=fake({"float32": 100.0, "bfloat16": 1.0}, calls), pause_s=0)
    assert again.dtype == "bfloat16" and again.cached == str(cache_file)
    assert len(calls) == 2 * dp.SAMPLES  # no new measurement
    assert "bfloat16/float32 9.00" in again.why() and "9.0x float32" in again.why()
    assert "features: test flags" in again.why()


def test_a_contended_measurement_leaves_the_verdict_to_the_features_and_is_not_cached(tmp_path, monkeypatch):
    """What issue 45 saw: bf16 measured slower under load on an AMX machine, cached as float32 for good."""
    _prior(monkeypatch, "bfloat16")
    loaded = lambda d, dev: dp.Timing({"float32": 257.0, "bfloat16": 150.0}[d], 0.35)  # noqa: E731
    choice = dp.probe("cpu", tmp_path, measure=loaded, pause_s=0)
    assert choice.dtype == "bfloat16" and choice.decided_by == "features" and not choice.stored
    assert not list(tmp_path.glob("*.json"))
    assert "contended (GEMM threads ran 35% of the time" in choice.why()
    assert "the features decide (bfloat16) (measured now, not cached)" in choice.why()


def test_a_verdict_against_the_features_is_measured_again_and_never_cached(tmp_path, monkeypatch):
    monkeypatch.setattr(dp, "RECHECK_PAUSE_S", 0)
    _prior(monkeypatch, "float32")
    calls: list = []
    confirmed = dp.probe(
        "cpu", tmp_path, measure=fake({"float32": 100.0, "bfloat16": 300.0}, calls), pause_s=0
    )
    assert confirmed.dtype == "bfloat16" and len(calls) == 4 * dp.SAMPLES  # measured twice
    assert "against the features" in confirmed.decided_by and not list(tmp_path.glob("*.json"))
    seq = iter([100.0, 300.0, 300.0, 100.0, 100.0, 300.0] + [100.0, 10.0] * 3)  # the recheck says float32
    flip = dp.probe("cpu", tmp_path, measure=lambda d, dev: next(seq), pause_s=0)
    assert flip.dtype == "float32" and flip.decided_by == "features" and not flip.stored


def test_a_device_without_a_prior_is_decided_by_its_measurement(tmp_path, monkeypatch):
    _prior(monkeypatch, None)
    choice = dp.probe("cpu", tmp_path, measure=fake({"float32": 100.0, "bfloat16": 20.0}), pause_s=0)
    assert choice.dtype == "float32" and choice.stored and "no feature prior" in choice.why()
    assert "no lower-precision dtype is >= 1.2x faster than float32" in choice.why()


def test_a_changed_verdict_names_the_one_it_replaces(tmp_path, monkeypatch):
    """A cache of the old probe (one timing per dtype, best of 3) that said float32 on an AMX machine: measured
    again, and the line says which dtype the sets extracted before hold."""
    _prior(monkeypatch, "bfloat16")
    path = tmp_path / f"{dp.machine_key('cpu')}.json"
    path.write_text(json.dumps({"gflops": {"float32": 98.0, "bfloat16": 58.0}, "n": 1024}))
    choice = dp.probe("cpu", tmp_path, measure=fake({"float32": 150.0, "bfloat16": 1500.0}), pause_s=0)
    assert choice.dtype == "bfloat16" and choice.replaces == "float32" and choice.stored
    assert "replaces the cached verdict float32" in choice.why() and "`--dtype float32`" in choice.why()
    assert json.loads(path.read_text())["version"] == dp.VERSION


def test_the_verdict_alone_and_beside_two_busy_loops_is_the_same(tmp_path):
    """The real probe, on this machine, then again while two processes spin: the same dtype (the features'
    on a contended machine), and a contended verdict is never cached. Bounded: 512^3 GEMMs, a few seconds."""
    alone = dp.probe("cpu", tmp_path / "alone", refresh=True)
    spin = "import time\nend = time.time() + 60\nwhile time.time() < end: pass"
    loops = [subprocess.Popen([sys.executable, "-S", "-c", spin]) for _ in range(2)]
    try:
        time.sleep(0.2)
        busy = dp.probe("cpu", tmp_path / "busy", refresh=True)
    finally:
        for p in loops:
            p.kill()
            p.wait()
    print(f"\nalone: {alone.why()}\nbusy:  {busy.why()}")
    assert alone.dtype == busy.dtype == (dp.prior("cpu")[0] or alone.dtype)
    for choice, where in ((alone, "alone"), (busy, "busy")):
        assert choice.stored == (not choice.contended and choice.dtype == choice.prior)
        assert bool(list((tmp_path / where).glob("*.json"))) == choice.stored


def test_unreadable_cache_is_measured_again(tmp_path):
    (tmp_path / f"{dp.machine_key('cpu')}.json").write_text("{not json")
    choice = dp.probe("cpu", tmp_path, measure=fake({"float32": 100.0, "bfloat16": 20.0}), pause_s=0)
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
    _prior(monkeypatch, "bfloat16")
    monkeypatch.setattr(dp, "gemm_timing", fake({"float32": 100.0, "bfloat16": 130.0}))
    monkeypatch.setattr(dp, "PAUSE_S", 0)
    assert dp.resolve("float32", "cpu", tmp_path) == ("float32", "float32: as given, not measured")
    with pytest.raises(ValueError, match="dtype must be one of auto"):
        dp.resolve("fp8", "cpu", tmp_path)
    name, why = dp.resolve("auto", "cpu", tmp_path)
    assert name == "bfloat16" and why.startswith(
        "auto -> bfloat16: features: test flags; GEMM probe on cpu (512x512x512, 3 pairs) bfloat16/float32 1.30, "
        "bfloat16 130, float32 100 GFLOP/s, quiet; 1.3x float32 (measured now, cached)"
    )


def test_real_gemm_probe_returns_a_positive_rate_and_share():
    t = dp.gemm_timing("float32", "cpu", n=64, reps=1)
    assert t.gflops > 0 and 0 < t.share <= 1.0
    assert dp.gemm_gflops("float32", "cpu", n=64, reps=1) > 0


def test_the_probe_is_sized_to_the_device_and_says_what_it_measured():
    assert dp.probe_shape("cpu") == (512, 1, 1)  # emulated bf16 at 1024^3 took 30-87 s on the loaded VM
    assert dp.probe_shape("cuda:0") == (8192, 10, 3)  # compute-bound on a GPU, with warm-up
    h100 = dp.DtypeChoice(
        "bfloat16",
        {"float32": 52_000.0, "bfloat16": 785_000.0},
        "cuda",
        n=8192,
        ratio=15.1,
        ratios=(15.0, 15.1, 15.2),
        prior="bfloat16",
        prior_why="tensor cores",
        stored=True,
    )
    assert h100.why() == (
        "bfloat16: features: tensor cores; GEMM probe on cuda (8192x8192x8192, 3 pairs) bfloat16/float32 15.10 "
        "(15.00-15.20), bfloat16 785.0, float32 52.0 TFLOP/s, quiet; 15.1x float32 (measured now, cached)"
    )


def test_a_cache_of_another_gemm_side_or_probe_version_is_measured_again(tmp_path, monkeypatch):
    _prior(monkeypatch, "float32")
    path = tmp_path / f"{dp.machine_key('cpu')}.json"
    first = dp.probe("cpu", tmp_path, measure=fake({"float32": 100.0, "bfloat16": 20.0}), pause_s=0)
    assert first.stored
    assert dp.probe("cpu", tmp_path, measure=fake({"float32": 1.0, "bfloat16": 1.0})).cached == str(path)
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "n": 2048}))
    again = dp.probe("cpu", tmp_path, measure=fake({"float32": 100.0, "bfloat16": 20.0}), pause_s=0)
    assert again.cached is None and again.dtype == "float32" and json.loads(path.read_text())["n"] == 512
    path.write_text(json.dumps({**record, "version": 1}))
    assert (
        dp.probe("cpu", tmp_path, measure=fake({"float32": 100.0, "bfloat16": 20.0}), pause_s=0).cached
        is None
    )
