"""CUDA paths of the extraction: they run wherever a GPU is present and are skipped, saying why, elsewhere.

A tiny random Llama with the default initialisation (small logits, as a real model's) stands in for a real
one: what is checked is the device path (placement, sizing, batching, compile, the overlapped pipeline),
not the weights.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from tiny_model import (
    CORPUS,
    register_jsonl_dataset,
    register_local_model,
    save_tiny_checkpoint,
    spy_from_pretrained,
    tiny_model,
    tiny_tokenizer,
)
from transformers import LlamaConfig, LlamaForCausalLM
from walla.extract import dtype_probe, sizing
from walla.extract import run as run_mod
from walla.extract.backends import BackendRequest
from walla.extract.backends.hf import HFBackend, load_hf_backend
from walla.extract.backends.hf_compile import explain_compile
from walla.extract.backends.hf_kind import HF
from walla.extract.config import ExtractConfig
from walla.extract.models import ResolvedModel
from walla.store.featureset import read_feature_set

pytestmark = pytest.mark.gpu

GPU_MODEL = {"hidden_size": 64, "weight_scale": 1.0}  # default init: small logits, as a real model's
TOL_LOGPROB = 0.05  # bf16, padded batches vs a left-padded bare loop: max |d option log-prob| (nats)
TOL_HIDDEN = 0.05  # max |d hidden| / max |hidden|
QUESTIONS = [
    "Which gas do plants take in ?",
    "Is the door red ?",
    "Is the cat on the mat and the dog in the park with a ball ?",
    "Which star ?",
    "Is the door of room 42 painted blue ?",
    "Which gas ?",
]


@pytest.fixture
def local_model(tmp_path, monkeypatch):
    """(model `gputiny` in the catalog, its directory); WALLA_CACHE in tmp_path. The default init (small
    logits, as a real model's), hidden size 64."""
    monkeypatch.setenv("WALLA_CACHE", str(tmp_path / "cache"))
    mdir = save_tiny_checkpoint(tmp_path / "gputiny", **GPU_MODEL)
    register_local_model(monkeypatch, "gputiny", mdir, hidden_size=64)
    return mdir


@pytest.fixture
def dataset(tmp_path, monkeypatch):
    rows = [
        {"id": f"r{i}", "question": q, "options": ["oxygen", "helium", "water"], "label": i % 3}
        for i, q in enumerate(QUESTIONS)
    ]
    return register_jsonl_dataset(monkeypatch, tmp_path / "mine.jsonl", rows)


def bare_loop(model, tok, prompts: list[str], cand: list[int]):
    """Left padding with the attention mask, logits_to_keep=1: (option log-probs [N, U], hidden [N, d])."""
    tok.padding_side = "left"
    with torch.inference_mode():
        enc = tok(prompts, return_tensors="pt", padding=True).to("cuda")
        out = model(**enc, logits_to_keep=1, output_hidden_states=True)
    lp = torch.log_softmax(out.logits[:, -1].float(), dim=-1)[:, cand]
    return lp.cpu().numpy(), out.hidden_states[-1][:, -1].float().cpu().numpy()


def test_default_flags_on_cuda_equal_a_bare_loop(tmp_path, local_model, dataset):
    cfg = ExtractConfig(
        model="gputiny",
        dataset="mine",
        data_file=dataset,
        store=tmp_path / "s",
        dtype="bfloat16",
        progress=False,
    )
    assert cfg.device is None  # the default device: cuda here
    lines: list[str] = []
    (path,) = run_mod.run(cfg, out=lines.append)
    assert any(x.startswith("batch-invariant auto -> off: padded batches on cuda") for x in lines)
    assert any(x.startswith("batch tokens auto -> 65,536 on cuda: ") and "GiB free" in x for x in lines)
    assert any(x.startswith("compile auto -> off") for x in lines)  # a few hundred tokens
    fs = read_feature_set(path)
    assert fs.meta["inputs"]["determinism"] == "batch-recorded" and fs.meta["inputs"]["device"] == "cuda"
    assert fs.meta["inputs"]["batching"]["batch_tokens"] == 65_536
    assert fs.meta["inputs"]["batching"]["shard_rows"] == 8192
    assert fs.meta["compute"]["device"].startswith("cuda")
    tok = tiny_tokenizer()
    model = LlamaForCausalLM.from_pretrained(local_model, dtype=torch.bfloat16, device_map="cuda").eval()
    letters = [tok.convert_tokens_to_ids(x) for x in "ABC"]
    lp, hid = bare_loop(model, tok, fs.rows["prompt"].to_list(), letters)
    raw = np.array(fs.rows["raw_option_logprobs"].to_list(), dtype=np.float32)
    assert np.abs(raw - lp).max() <= TOL_LOGPROB
    stored = np.asarray(fs.hidden[:]).astype(np.float32)
    assert np.abs(stored - hid).max() / np.abs(hid).max() <= TOL_HIDDEN


def test_sizing_reads_the_real_free_memory_and_the_config(local_model):
    rm = ResolvedModel("gputiny", str(local_model), None, None, {"source": "local"})
    req = BackendRequest(rm, "bfloat16", "cuda", False, 64)
    free = torch.cuda.mem_get_info()[0]
    settled = HF.settle(req, HF.Options())
    why = " ".join(settled.why)
    shape = sizing.ModelShape.from_config(LlamaConfig.from_pretrained(local_model), "bfloat16")
    want = sizing.settle_sizes("cuda", None, None, shape, free, fixed_bytes=0)
    assert settled.batch_tokens == want.batch_tokens == 65_536  # a tiny model: the cap
    assert settled.shard_rows == 8192 and settled.options.batch_invariant == "off"
    assert settled.identity["accelerator"] == torch.cuda.get_device_name(0)  # batch-recorded bf16 on CUDA
    assert "GiB free" in why and "2 layers, hidden 64" in why


def test_weights_load_straight_onto_the_gpu(local_model, monkeypatch):
    rm = ResolvedModel("gputiny", str(local_model), None, None, {"source": "local", "files_sha256": "x"})
    seen = spy_from_pretrained(monkeypatch)
    be = load_hf_backend(rm, dtype="bfloat16", device="cuda", batch_tokens=1024)
    assert seen[0]["device_map"] == "cuda" and seen[0]["dtype"] == torch.bfloat16  # read onto the device
    assert {p.device.type for p in be.model.parameters()} == {"cuda"}
    assert {p.dtype for p in be.model.parameters()} == {torch.bfloat16}
    assert list(be.load_times)[:3] == ["dtype", "tokenizer", "weights"]


def test_compile_auto_on_cuda_and_compiled_equals_eager():
    assert explain_compile("auto", 200_000, "cuda")[0] is True
    tok = tiny_tokenizer()
    model = tiny_model(len(tok), **GPU_MODEL).to("cuda", torch.bfloat16)
    eager = HFBackend(model, tok, batch_tokens=256, batch_invariant=False)
    fast = HFBackend(copy.deepcopy(model), tok, batch_tokens=256, batch_invariant=False, compiled=True)
    prompts = [CORPUS[0] + " " + c for c in CORPUS[1:]] * 3
    a, b = eager.score(prompts, [5, 6, 7]), fast.score(prompts, [5, 6, 7])
    np.testing.assert_allclose(b.raw_logprobs, a.raw_logprobs, atol=TOL_LOGPROB)
    np.testing.assert_allclose(b.prompt_nll, a.prompt_nll, atol=TOL_LOGPROB)
    assert np.abs(b.hidden - a.hidden).max() / np.abs(a.hidden).max() <= TOL_HIDDEN


def test_batch_invariant_on_gives_the_same_bits_in_any_mix_on_cuda(tmp_path, monkeypatch):
    monkeypatch.setenv("WALLA_CACHE", str(tmp_path))  # the row-invariance probe's cache
    tok = tiny_tokenizer()
    be = HFBackend(
        tiny_model(len(tok), **GPU_MODEL).to("cuda", torch.bfloat16),
        tok,
        batch_tokens=512,
        batch_invariant=True,
    )
    mix = [CORPUS[i % len(CORPUS)] for i in range(9)]
    together, alone = be.score(mix, [5, 6]), be.score(mix[3:4], [5, 6])
    np.testing.assert_array_equal(together.raw_logprobs[3], alone.raw_logprobs[0])
    np.testing.assert_array_equal(together.hidden[3], alone.hidden[0])
    np.testing.assert_array_equal(together.prompt_nll[3], alone.prompt_nll[0])


def test_dtype_probe_measures_a_realistic_gemm_on_cuda(tmp_path):
    choice = dtype_probe.probe("cuda", tmp_path, refresh=True)
    assert choice.n == 8192 and "(8192x8192x8192, best of 3)" in choice.why() and "TFLOP/s" in choice.why()
    low = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    assert choice.gflops[low] > choice.gflops["float32"] > 0  # tensor cores vs plain fp32 (no TF32)


def test_second_compile_on_cuda_is_served_from_the_cache(tmp_path, monkeypatch):
    """torch's compile caches (AOT autograd, FX graphs, Triton kernels) under $WALLA_CACHE/compile/<key>/: the
    same model and dtype compiled again, as a second run would, is a cache hit (inductor compiles no graph
    afresh), in the same folder. Prints the seconds of both (pytest -s)."""
    from tiny_model import compile_runs
    from torch._dynamo.utils import counters
    from walla.extract.backends import hf_compile

    monkeypatch.setenv("WALLA_CACHE", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)  # restored after the test
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)  # Triton's kernels go under the keyed folder too
    counters.clear()
    times, folders = compile_runs(tmp_path, "cuda", ["bfloat16", "bfloat16"], **GPU_MODEL)
    cold, warm = times[0].get("compile"), times[1].get("compile (cached)")
    print(f"compile on cuda: first {cold} s, second {warm} s; counters {dict(counters['inductor'])}")
    assert cold is not None and warm is not None and folders[0] == folders[1]
    assert counters["inductor"]["fxgraph_cache_hit"] >= 1 and hf_compile.user_cache_dir() is None


def test_vllm_batch_invariant_mode_gives_the_same_bits_in_any_mix(tmp_path, monkeypatch):
    """`--backend vllm` on a GPU of compute capability >= 8.0 settles VLLM_BATCH_INVARIANT=1 (`auto`); a
    prompt scored among others and alone then gives the same bits (what would let its tier be `bitwise`)."""
    from walla.extract.backends import vllm as vb
    from walla.extract.backends.registry import open_backend, settle_backend

    if not vb.vllm_usable()[0]:
        pytest.skip(f"vLLM is not installed here ({vb.SETUP_HINT})")
    monkeypatch.setenv("WALLA_CACHE", str(tmp_path / "cache"))
    mdir = save_tiny_checkpoint(tmp_path / "vtiny", hidden_size=256, weight_scale=1.0)  # head_dim 64
    rm = ResolvedModel("vtiny", str(mdir), None, None, {"source": "local", "path": str(mdir)})
    req = BackendRequest(rm, "bfloat16", "cuda", False, 256, shard_rows=64)
    settled = settle_backend("vllm", req, {"gpu_memory_utilization": 0.3, "max_model_len": 256})
    assert settled.identity.get("batch_invariant") is True, settled.why
    backend = open_backend(settled)
    try:
        mix = [CORPUS[i % len(CORPUS)] + f" {i}" for i in range(9)]
        together, alone = backend.score(mix, [5, 6]), backend.score(mix[3:4], [5, 6])
    finally:
        backend.close()
    np.testing.assert_array_equal(together.raw_logprobs[3], alone.raw_logprobs[0])
    np.testing.assert_array_equal(together.hidden[3], alone.hidden[0])
    np.testing.assert_array_equal(together.prompt_nll[3], alone.prompt_nll[0])
