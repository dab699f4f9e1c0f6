"""`--compile`: the compiled hf backend gives the eager backend's outputs; auto decides by job size."""

from __future__ import annotations

import copy
import os

import numpy as np
import pytest
import torch
from tiny_model import CORPUS, save_tiny_checkpoint, tiny_model, tiny_tokenizer
from walla.extract.backends import BackendRequest, hf_compile
from walla.extract.backends.hf import HFBackend, load_hf_backend
from walla.extract.backends.hf_compile import COMPILE_MIN_TOKENS, COMPILE_MIN_TOKENS_CUDA, explain_compile
from walla.extract.backends.registry import settle_backend
from walla.extract.command import reproduce_command
from walla.extract.config import ExtractConfig
from walla.extract.models import ResolvedModel
from walla.manifests.validate import ConfigError


def test_compiled_backend_matches_eager_with_and_without_prefix_cache():
    tok = tiny_tokenizer()
    model = tiny_model(len(tok))
    eager = HFBackend(model, tok, batch_tokens=64)
    fast = HFBackend(copy.deepcopy(model), tok, batch_tokens=64, compiled=True)
    assert fast.compiled is True and eager.compiled is False
    assert fast.prefix_cache is False  # a cached prefix would recompile the layer graph per layer index
    prompts = [CORPUS[0] + " " + c for c in CORPUS[1:]] * 2  # a shared prefix: eager takes the KV-cache path
    for prefix_cache in (True, False):
        eager.prefix_cache = prefix_cache
        a, b = eager.score(prompts, [5, 6, 7]), fast.score(prompts, [5, 6, 7])
        for x, y in ((a.raw_logprobs, b.raw_logprobs), (a.hidden, b.hidden), (a.prompt_nll, b.prompt_nll)):
            np.testing.assert_allclose(y, x, atol=1e-4, rtol=1e-4)
        np.testing.assert_array_equal(a.n_tokens, b.n_tokens)


def test_auto_compiles_large_jobs_only():
    assert explain_compile("auto", COMPILE_MIN_TOKENS, "cpu")[0] is True
    on, why = explain_compile("auto", COMPILE_MIN_TOKENS - 1, "cpu")
    assert on is False and "compile auto -> off" in why
    assert explain_compile("on", 0, "cpu")[0] is True and explain_compile("off", 10**9, "cpu")[0] is False
    with pytest.raises(ValueError, match="--backend-arg compile must be auto, on or off"):
        explain_compile("yes", 0, "cpu")


def test_auto_compiles_earlier_on_cuda():
    job = 150_000  # a few seconds of eager work on an H100, minutes on the 2-core CPU
    assert COMPILE_MIN_TOKENS_CUDA < job < COMPILE_MIN_TOKENS
    on, why = explain_compile("auto", job, "cuda:0")
    assert on is True and why.startswith("compile auto -> on: ~150,000 prompt tokens >= 100,000 on cuda:0")
    assert "was not timed on a GPU" in why  # says what is not known
    assert explain_compile("auto", job, "cpu")[0] is False  # the CPU rule is unchanged
    assert explain_compile("auto", COMPILE_MIN_TOKENS_CUDA - 1, "cuda")[0] is False


def test_bad_compile_value_and_reproduce_command():
    rm = ResolvedModel("m", "m", None, None, {})
    request = BackendRequest(rm, "bfloat16", "cpu", False, None)
    with pytest.raises(ConfigError, match="compile must be auto, on or off, got 'fast'"):
        settle_backend("hf", request, {"compile": "fast"})
    cfg = ExtractConfig(model="m", dataset="d")
    on = settle_backend("hf", request, {"compile": "on"})
    assert on.identity["compile"] is True
    assert "--backend-arg compile=on" in reproduce_command(cfg, ["none"], "hf", list(on.command_args))
    off = settle_backend("hf", request, {"compile": "off"})
    assert "compile" not in off.identity  # absent when off: sets made before the option keep their inputs
    assert "--backend-arg compile=off" in reproduce_command(cfg, ["none"], "hf", list(off.command_args))


def test_compile_cache_is_one_folder_per_model_dtype_and_device(tmp_path, monkeypatch):
    """Inductor's on-disk caches are kept per model identity, dtype and device: a cache never serves another."""
    a = {"source": "package", "gguf_sha256": "aa"}
    b = {"source": "package", "gguf_sha256": "bb"}
    base = hf_compile.compile_cache_dir(a, "torch.bfloat16", "cpu", tmp_path)
    assert base == hf_compile.compile_cache_dir(a, "bfloat16", "cpu", tmp_path)  # same key, same folder
    others = {
        hf_compile.compile_cache_dir(b, "bfloat16", "cpu", tmp_path),
        hf_compile.compile_cache_dir(a, "float32", "cpu", tmp_path),
    }
    assert base not in others and len(others) == 2 and base.parent == tmp_path / "compile"
    monkeypatch.setattr(hf_compile, "_USER_CACHE_DIR", None)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/elsewhere")
    assert hf_compile.use_compile_cache(base) == base and os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(base)
    monkeypatch.setattr(hf_compile, "_USER_CACHE_DIR", "/theirs")  # set by the user before walla ran
    assert hf_compile.use_compile_cache(tmp_path / "x") is None and os.environ[
        "TORCHINDUCTOR_CACHE_DIR"
    ] == str(base)


@pytest.mark.slow
def test_compiled_load_fills_its_own_cache_folder(tmp_path, monkeypatch):
    """load_hf_backend(compiled=True) writes inductor's caches under $WALLA_CACHE/compile/<key>/."""
    monkeypatch.setenv("WALLA_CACHE", str(tmp_path))
    mdir = save_tiny_checkpoint(tmp_path / "tiny", seed=5)
    local_tiny = ResolvedModel("tiny", str(mdir), None, None, {"source": "local", "files_sha256": "abc"})
    monkeypatch.setattr(hf_compile, "_USER_CACHE_DIR", None)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "before"))
    torch._dynamo.reset()  # an earlier test compiled the same layer class in this process: compile afresh
    load_hf_backend(local_tiny, dtype="float32", device="cpu", batch_tokens=64, compiled=True)
    want = hf_compile.compile_cache_dir(local_tiny.identity, "float32", "cpu", tmp_path)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(want) and any(want.rglob("*"))
