"""`--compile`: the compiled hf backend gives the eager backend's outputs; auto decides by job size."""

from __future__ import annotations

import copy
import os

import numpy as np
import pytest
from tiny_model import CORPUS, compile_runs, tiny_model, tiny_tokenizer
from walla.extract.backends import BackendRequest
from walla.extract.backends.hf import COMPILE_MIN_TOKENS, COMPILE_MIN_TOKENS_CUDA, HFBackend, explain_compile
from walla.extract.backends.hf import _compile as hf_compile
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


def test_auto_compiles_on_cuda_only_where_the_compile_pays_back():
    """On an H100 a compile costs 5.3-14.9 s per run and saves ~1-2 s of a 200k-token 8B job: auto stays eager
    there and compiles from ~1M tokens."""
    assert COMPILE_MIN_TOKENS < COMPILE_MIN_TOKENS_CUDA
    on, why = explain_compile("auto", 213_039, "cuda:0")
    assert on is False and why.startswith("compile auto -> off: ~213,039 prompt tokens < 1,000,000 on cuda:0")
    assert "5.3 s from its cache" in why  # says what it rests on
    assert explain_compile("auto", 213_039, "cpu")[0] is False  # the CPU rule is its own
    assert explain_compile("auto", COMPILE_MIN_TOKENS_CUDA, "cuda")[0] is True


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


def test_compile_cache_takes_over_torchs_default_but_not_the_users(tmp_path, monkeypatch):
    """Importing torch._dynamo writes torch's default folder into TORCHINDUCTOR_CACHE_DIR: that is not the
    user's choice (read as one, it had kept every compile in /tmp, unkeyed); a folder the user set is."""
    import torch._dynamo  # noqa: F401  (what writes the default, as a model load does)
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    folder, other = tmp_path / "compile" / "k1", tmp_path / "compile" / "k2"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())
    assert hf_compile.user_cache_dir() is None
    assert hf_compile.use_compile_cache(folder) == folder and os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(
        folder
    )
    assert hf_compile.user_cache_dir() is None  # walla's own folder: the next model gets its own
    assert hf_compile.use_compile_cache(other) == other and os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(
        other
    )
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "theirs"))  # set by the user
    assert hf_compile.user_cache_dir() == str(tmp_path / "theirs")
    assert hf_compile.use_compile_cache(folder) is None
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "theirs")
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    assert hf_compile.user_cache_dir() is None


def test_served_from_cache_needs_a_hit_and_no_fresh_graph():
    zero = dict.fromkeys(
        ("fxgraph_cache_hit", "fxgraph_cache_miss", "autograd_cache_hit", "autograd_cache_miss"), 0
    )
    hit = {**zero, "fxgraph_cache_hit": 1, "autograd_cache_hit": 1, "autograd_cache_miss": 1}
    assert hf_compile.served_from_cache(zero, hit) is True
    assert hf_compile.served_from_cache(zero, {**hit, "fxgraph_cache_miss": 1}) is False  # one graph compiled
    assert hf_compile.served_from_cache(zero, zero) is False  # nothing compiled: nothing was served
    assert hf_compile.served_from_cache(hit, hit) is False  # counts are per process: the difference counts


@pytest.mark.slow
def test_second_compiled_load_is_served_from_its_own_cache_folder(tmp_path, monkeypatch):
    """load_hf_backend(compiled=True) writes torch's compile caches under $WALLA_CACHE/compile/<key>/; the same
    model and dtype again is a cache hit (`compile (cached)` on the load line), another dtype compiles afresh
    in a folder of its own."""
    monkeypatch.setenv("WALLA_CACHE", str(tmp_path))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "before"))  # restored after the test
    monkeypatch.setattr(hf_compile, "_ours", {str(tmp_path / "before")})  # as if walla had set it
    times, folders = compile_runs(tmp_path, "cpu", ["float32", "float32", "bfloat16"])
    assert "compile" in times[0] and "compile (cached)" in times[1]
    assert folders[0] == folders[1] != folders[2] and "compile" in times[2]
