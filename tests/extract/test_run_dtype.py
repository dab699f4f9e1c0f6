"""The dtype a feature set records is the one that ran, never `auto` (issue 20, finding 6)."""

from __future__ import annotations

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
    monkeypatch.setattr(dtype_probe, "gemm_gflops", lambda d, dev: {"float32": 100.0, "bfloat16": 400.0}[d])
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
    assert any(x.startswith("dtype auto -> bfloat16: GEMM probe on cpu (1024x1024x1024") for x in lines)
    fs = read_feature_set(path)
    assert fs.meta["inputs"]["backend"] == "vllm" and fs.meta["inputs"]["dtype"] == "bfloat16"
    assert "--dtype bfloat16" in fs.meta["command"]
