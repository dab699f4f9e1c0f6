"""vLLM backend: pure parts with fake vLLM outputs, the keywords we pass against the INSTALLED vLLM's
signatures, and (slow) the real engine on SmolLM2 where `make setup-vllm` has been run."""

from __future__ import annotations

import ast
import inspect
import json
import subprocess
import sys
from types import SimpleNamespace as NS

import numpy as np
import pytest
import torch
from walla.extract.backends import BackendRequest
from walla.extract.backends.registry import open_backend, settle_backend
from walla.extract.backends.vllm import _backend as vb
from walla.extract.backends.vllm import _engine as ve
from walla.extract.models import ResolvedModel, resolve_model
from walla.extract.parity import compare
from walla.manifests.catalog import load_models


def fake_generate_output(prompt_ids, logp_rows, options: dict[int, float]):
    """A RequestOutput-like object: prompt_logprobs[t] = {token: Logprob} (None at t=0), 1 generated token."""
    plp = [None] + [{tid: NS(logprob=lp, rank=1)} for tid, lp in zip(prompt_ids[1:], logp_rows, strict=True)]
    step = {7: NS(logprob=-0.1, rank=1)} | {t: NS(logprob=lp, rank=2) for t, lp in options.items()}
    gen = NS(token_ids=[7], logprobs=[step])
    return NS(prompt_token_ids=list(prompt_ids), prompt_logprobs=plp, outputs=[gen])


def test_generate_parsing_options_and_nll():
    out = fake_generate_output([1, 5, 9], [-2.0, -4.0], {11: -1.5, 12: -3.0})
    opt, nll = ve.parse_generate_output(out, [1, 5, 9], [12, 11])
    np.testing.assert_allclose(opt, [-3.0, -1.5])
    assert nll == pytest.approx(3.0)
    one = fake_generate_output([1], [], {11: -1.0})
    assert ve.parse_generate_output(one, [1], [11])[1] == 0.0
    with pytest.raises(RuntimeError, match=r"no log-prob for option token ids \[13\]"):
        ve.parse_generate_output(out, [1, 5, 9], [11, 13])
    out.prompt_logprobs = out.prompt_logprobs[:2]
    with pytest.raises(RuntimeError, match="2 prompt log-probs for 3 prompt tokens"):
        ve.parse_generate_output(out, [1, 5, 9], [11])


def test_order_check():
    outs = [NS(prompt_token_ids=[1, 2]), NS(prompt_token_ids=[1, 3])]
    ve.check_order(outs, [[1, 2], [1, 3]], "generate")
    with pytest.raises(RuntimeError, match="out of order"):
        ve.check_order(outs[::-1], [[1, 2], [1, 3]], "generate")
    with pytest.raises(RuntimeError, match="1 outputs for 2 prompts"):
        ve.check_order(outs[:1], [[1, 2], [1, 3]], "pooling")


def test_pooling_parsing_both_output_kinds():
    emb = NS(outputs=NS(embedding=[0.5, -1.0]))
    pool = NS(outputs=NS(data=torch.tensor([0.5, -1.0], dtype=torch.bfloat16)))
    np.testing.assert_array_equal(ve.parse_pooling_output(emb), [0.5, -1.0])
    np.testing.assert_array_equal(ve.parse_pooling_output(pool), [0.5, -1.0])


def test_engine_kwargs_memory_budget(monkeypatch):
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    opts = {"model": "/m", "dtype": "float32", "gpu_memory_utilization": None, "enforce_eager": None}
    gen, pool = ve.engine_kwargs(opts, on_cpu=True, default_utilization=0.92)
    assert gen["kv_cache_memory_bytes"] == ve.CPU_KV_CACHE_BYTES and "gpu_memory_utilization" not in gen
    assert gen["enforce_eager"] is True and pool["runner"] == "pooling" and "runner" not in gen
    gen, _ = ve.engine_kwargs(opts, on_cpu=False, default_utilization=0.92)
    assert gen["gpu_memory_utilization"] == pytest.approx(0.46) and gen["enforce_eager"] is False
    gen, pool = ve.engine_kwargs(
        {**opts, "gpu_memory_utilization": 0.8}, on_cpu=False, default_utilization=0.9
    )
    assert gen["gpu_memory_utilization"] == pool["gpu_memory_utilization"] == pytest.approx(0.4)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "4")
    assert "kv_cache_memory_bytes" not in ve.engine_kwargs(opts, on_cpu=True, default_utilization=0.92)[0]


def test_identity_and_unusable_message(monkeypatch, tmp_path):
    monkeypatch.setenv("WALLA_VLLM_PYTHON", str(tmp_path / "nope" / "python"))
    ok, why = vb.VLLM.usable()
    assert not ok and why == f"WALLA_VLLM_PYTHON={tmp_path / 'nope' / 'python'} does not exist"
    rm = ResolvedModel("m", "/m", None, None, {"source": "local"})
    settled = settle_backend("vllm", BackendRequest(rm, "bfloat16", "cpu", True, None))
    assert settled.identity["vllm"] is None  # no engine here: recorded as unknown, never guessed
    with pytest.raises(
        RuntimeError, match="--backend vllm cannot run here: WALLA_VLLM_PYTHON=.* does not exist"
    ):
        vb.VLLM.load(settled)


def test_the_vllm_parent_imports_no_hf_scoring_code():
    """The parent of --backend vllm keeps a tokenizer and runs the dtype probe: the hf scoring modules (and
    transformers' modeling code, torch._dynamo, sympy: ~1.5-5 s of imports) stay out of it."""
    code = (
        "import sys, walla.extract.run, walla.extract.backends.vllm._backend\n"
        "heavy = ('walla.extract.backends.hf._backend', 'walla.extract.backends.hf._modes', 'walla.extract.backends.hf._load',\n"
        "         'transformers.modeling_utils', 'torch._dynamo', 'sympy')\n"
        "print([m for m in heavy if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_batch_invariant_mode_where_vllm_and_the_gpu_have_it():
    h100, t4 = (9, 0), (7, 5)
    on, why = vb.explain_batch_invariant("auto", "cuda", True, h100)
    assert on and why.startswith("vLLM batch-invariant auto -> on: VLLM_BATCH_INVARIANT=1")
    assert "compute capability 9.0" in why
    for device, has_env, cap, reason in (
        ("cpu", True, None, "runs on NVIDIA GPUs (compute capability >= 8.0), not on cpu"),
        ("cuda", True, t4, "compute capability 7.5 < 8.0"),
        ("cuda:1", False, h100, "the worker's vLLM has no VLLM_BATCH_INVARIANT"),
        ("cuda", True, None, "CUDA is not visible to this process"),
    ):
        on, why = vb.explain_batch_invariant("auto", device, has_env, cap)
        assert not on and why.startswith("vLLM batch-invariant auto -> off: ") and reason in why
        with pytest.raises(ValueError, match=f"batch_invariant=on: .*{reason[:20]}"):
            vb.explain_batch_invariant("on", device, has_env, cap)  # never claimed where it cannot run
    assert vb.explain_batch_invariant("on", "cuda", True, h100)[0] is True
    assert vb.explain_batch_invariant("off", "cuda", True, h100)[0] is False


def test_installed_vllm_is_read_for_the_variable_without_importing_it(tmp_path):
    py = vb.find_vllm_python()
    if py is None or not vb.vllm_usable()[0]:
        pytest.skip(f"vLLM is not installed ({vb.SETUP_HINT})")
    assert vb.has_batch_invariant_env(py) is True  # vLLM 0.32's envs.py has VLLM_BATCH_INVARIANT
    fake = tmp_path / "python"  # an interpreter without vLLM
    fake.write_text('#!/bin/sh\nexec python3 -I -S "$@"\n')
    fake.chmod(0o755)
    assert vb.has_batch_invariant_env(str(fake)) is False


def test_settled_invariance_is_in_the_identity_command_and_worker_env(monkeypatch, tmp_path):
    """On an H100 with a vLLM that has the mode, `auto` turns it on: the identity says so (a fingerprint of
    its own), the command repeats it, and the worker is started with VLLM_BATCH_INVARIANT=1; `off` starts it
    with 0 over an exported 1 and keeps the identity of sets made before the option existed."""
    from tiny_model import save_tiny_checkpoint
    from walla.extract import device as devices
    from walla.store.features import FeatureSetSpec

    monkeypatch.setattr(vb, "vllm_usable", lambda: (True, ""))
    monkeypatch.setattr(
        vb, "vllm_versions", lambda py: {"vllm": "0.32.0", "vllm_dist": "vllm", "torch": "2.11"}
    )
    monkeypatch.setattr(vb, "find_vllm_python", lambda: "/vllm/python")
    monkeypatch.setattr(vb, "has_batch_invariant_env", lambda py: True)
    monkeypatch.setattr(vb, "cuda_capability", lambda device: (9, 0))
    monkeypatch.setattr(devices, "accelerator", lambda device: "NVIDIA H100 80GB HBM3")
    mdir = save_tiny_checkpoint(tmp_path / "tiny", seed=5)
    rm = ResolvedModel("m", str(mdir), None, None, {"source": "local", "path": str(mdir)})
    req = BackendRequest(rm, "bfloat16", "cuda", False, 32, shard_rows=64)
    on, off = settle_backend("vllm", req), settle_backend("vllm", req, {"batch_invariant": "off"})
    assert on.identity["batch_invariant"] is True and "batch_invariant" not in off.identity
    assert on.tier == off.tier == "batch-recorded"  # not yet checked bit for bit on a GPU: batching recorded
    assert {k: v for k, v in on.identity.items() if k != "batch_invariant"} == off.identity
    fp = [
        FeatureSetSpec("m", "facts", "none", {"questions_fp": "q", **s.identity}).fingerprint
        for s in (on, off)
    ]
    assert fp[0] != fp[1]
    assert on.command_args[-2:] == ("--backend-arg", "batch_invariant=on")
    assert off.command_args[-2:] == ("--backend-arg", "batch_invariant=off")
    assert any(x.startswith("vLLM batch-invariant auto -> on") for x in on.why)

    started: list[dict] = []

    def popen(argv, **kw):  # the worker is never started: record its environment, then it "dies"
        started.append(kw["env"])
        return NS(poll=lambda: 1)

    monkeypatch.setattr(vb.subprocess, "Popen", popen)
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")  # exported by the user: the settled option wins
    for settled, want in ((on, "1"), (off, "0")):
        with pytest.raises(RuntimeError, match="the vLLM worker died"):
            vb.VLLM.load(settled)
        assert started[-1]["VLLM_BATCH_INVARIANT"] == want


# ----------------------------------------------------------------------------- against the installed vLLM

_SIGNATURES = """
import dataclasses, inspect, json
from vllm import LLM, SamplingParams
from vllm.config import PoolerConfig
from vllm.engine.arg_utils import EngineArgs
fields = lambda c: sorted(f.name for f in dataclasses.fields(c))
print(json.dumps({
    "LLM": sorted(inspect.signature(LLM.__init__).parameters),
    "EngineArgs": fields(EngineArgs),
    "PoolerConfig": fields(PoolerConfig),
    "SamplingParams": sorted(inspect.signature(SamplingParams.__init__).parameters)
        + sorted(getattr(SamplingParams, "__struct_fields__", ())),
}))
"""


@pytest.fixture(scope="module")
def vllm_signatures():
    py = vb.find_vllm_python()
    if py is None or not vb.vllm_usable()[0]:
        pytest.skip(f"vLLM is not importable anywhere ({vb.SETUP_HINT})")
    out = subprocess.run([py, "-c", _SIGNATURES], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_every_keyword_we_pass_exists_in_installed_vllm(vllm_signatures):
    sig = vllm_signatures
    llm_keys = set(sig["LLM"]) | set(sig["EngineArgs"])  # LLM(**kwargs) forwards the rest to EngineArgs
    for on_cpu in (True, False):
        opts = {"model": "/m", "revision": None, "gpu_memory_utilization": 0.5 if on_cpu else None}
        gen, pool = ve.engine_kwargs(opts, on_cpu=on_cpu, default_utilization=0.9)
        assert set(gen) | set(pool) | {"pooler_config"} <= llm_keys, set(gen) | set(pool) - llm_keys
    assert set(ve.pooler_kwargs()) <= set(sig["PoolerConfig"])
    assert set(ve.sampling_kwargs([1, 2])) <= set(sig["SamplingParams"])


def test_the_keyword_check_itself_catches_a_removed_keyword(vllm_signatures):
    """PoolerConfig(normalize=...) was removed in vLLM 0.16+: the check above would have caught it."""
    assert "normalize" not in vllm_signatures["PoolerConfig"]
    assert "pooling_type" in vllm_signatures["PoolerConfig"]


def test_engine_module_imports_nothing_from_walla():
    """The worker runs under the vLLM venv, where walla is not installed."""
    tree = ast.parse(inspect.getsource(ve))
    mods = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    mods |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not [m for m in mods if m.startswith("walla")], mods


@pytest.mark.slow
def test_real_vllm_matches_hf_on_smollm2():
    """The real engines (CPU here) against the hf backend on a few prompts: same options, states, NLL."""
    if not vb.vllm_usable()[0]:
        pytest.skip(f"vLLM is not installed ({vb.SETUP_HINT})")
    rm = resolve_model(load_models()["smollm2-135m"])
    req = BackendRequest(rm, "float32", "cpu", False, 576)
    prompts = ["The capital of France is", "Question: Which gas do plants take in? Answer:"]
    hf = open_backend(settle_backend("hf", req))
    cand = [hf.encode_bare(s)[0] for s in (" Paris", " carbon", " A")]
    ref = hf.score(prompts, cand)
    hf.close()
    settled = settle_backend("vllm", req)
    v = open_backend(settled)  # through the registry's door, as walla extract --backend vllm opens it
    try:
        assert settled.identity["vllm"] is not None and settled.identity["device"] == "cpu"
        got = v.score(prompts, cand)
    finally:
        v.close()
    m = compare(ref, got, [[0, 1, 2]] * len(prompts))
    assert m["lp_max"] < 5e-3 and m["cos_min"] > 0.9999 and m["nll_max"] < 5e-3 and m["same_tokens"], m
