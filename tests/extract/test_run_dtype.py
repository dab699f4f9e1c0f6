"""The dtype a feature set records is the one that ran, never `auto` (issue 20, finding 6)."""

from __future__ import annotations

from dataclasses import replace

from walla.extract import dtype_probe
from walla.extract import run as run_mod
from walla.extract.backends.dummy import DummyBackend
from walla.extract.backends.vllm import _backend as vllm_mod
from walla.extract.config import ExtractConfig
from walla.manifests import catalog
from walla.store.features import read_feature_set

PAPER_MODELS = ("gemma2", "llama3.1", "aloe", "biomistral")


def test_paper_models_extract_in_float32_and_embedded_ones_measure():
    models = catalog.load_models()
    assert {m: models[m].dtype for m in PAPER_MODELS} == dict.fromkeys(PAPER_MODELS, "float32")
    assert models["smollm2-135m"].dtype == "auto" and models["gemma3-270m"].dtype == "auto"


def test_vllm_auto_dtype_is_resolved_before_the_fingerprint(tmp_path, monkeypatch):
    """`--backend vllm --dtype auto`: measured like hf, and the engine, the fingerprint and the recorded
    command all get the concrete dtype (before, the fingerprint said "auto")."""
    monkeypatch.setenv("WALLA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(dtype_probe, "gemm_timing", lambda d, dev: {"float32": 100.0, "bfloat16": 400.0}[d])
    monkeypatch.setattr(dtype_probe, "prior", lambda device: (None, "none"))
    monkeypatch.setattr(dtype_probe, "PAUSE_S", 0)
    monkeypatch.setattr(vllm_mod, "find_vllm_python", lambda: None)  # no vLLM version lookup
    loaded = []

    def fake_load(request):
        loaded.append(("vllm", request.dtype))
        return DummyBackend(request.request.hidden_size)  # scores like the dummy; the identity stays vllm's

    monkeypatch.setattr(vllm_mod.VLLM, "load", fake_load)
    cfg = ExtractConfig(
        model="smollm2-135m",
        dataset="facts",
        size=8,
        variants=("none",),
        backend="vllm",
        dtype="auto",
        device="cpu",
        store=tmp_path / "s",
        progress=False,
    )
    lines: list[str] = []
    (path,) = run_mod.run(cfg, out=lines.append)
    assert loaded == [("vllm", "bfloat16")]
    assert any(
        x.startswith("dtype auto -> bfloat16: no feature prior; GEMM probe on cpu (512x512x512")
        for x in lines
    )
    fs = read_feature_set(path)
    assert fs.meta["inputs"]["backend"] == "vllm" and fs.meta["inputs"]["dtype"] == "bfloat16"
    assert "--dtype bfloat16" in fs.meta["command"]


def test_a_changed_verdict_keeps_the_stores_sets_and_says_so(tmp_path, monkeypatch):
    """Issue 45: `--dtype auto` decided float32 when the store's set was made and bfloat16 now. The same
    command finds that set again (its fingerprint unchanged) and says which dtype it kept and why; only
    `--dtype bfloat16` makes a new set beside it."""
    monkeypatch.setenv("WALLA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(dtype_probe, "prior", lambda device: (None, "none"))
    monkeypatch.setattr(dtype_probe, "PAUSE_S", 0)
    monkeypatch.setattr(vllm_mod, "find_vllm_python", lambda: None)
    monkeypatch.setattr(vllm_mod.VLLM, "load", lambda request: DummyBackend(request.request.hidden_size))
    cfg = ExtractConfig(
        model="smollm2-135m",
        dataset="facts",
        size=8,
        variants=("none",),
        backend="vllm",
        dtype="auto",
        device="cpu",
        store=tmp_path / "s",
        progress=False,
    )
    rates = {"float32": 100.0, "bfloat16": 30.0}
    monkeypatch.setattr(dtype_probe, "gemm_timing", lambda d, dev: rates[d])
    (first,) = run_mod.run(cfg, out=lambda line: None)
    assert read_feature_set(first).meta["inputs"]["dtype"] == "float32"
    for f in dtype_probe.default_cache_dir().glob("*.json"):
        f.unlink()  # the machine's verdict is measured again ...
    rates.update(bfloat16=500.0)  # ... and now says bfloat16
    lines: list[str] = []
    assert run_mod.run(cfg, out=lines.append) == [first]
    kept = next(x for x in lines if x.startswith("dtype float32: as the complete"))
    assert first.name in kept or read_feature_set(first).fingerprint in kept
    assert "`auto` says bfloat16 now; --dtype bfloat16 makes new sets beside it" in kept
    (second,) = run_mod.run(replace(cfg, dtype="bfloat16"), out=lambda line: None)
    assert second != first and read_feature_set(second).meta["inputs"]["dtype"] == "bfloat16"
