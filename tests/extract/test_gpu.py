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
from transformers import Gemma2Config, Gemma2ForCausalLM, LlamaConfig, LlamaForCausalLM
from walla.extract import dtype_probe, sizing
from walla.extract import run as run_mod
from walla.extract.backends import BackendRequest
from walla.extract.backends.hf import HF, HFBackend, explain_compile, load_hf_backend
from walla.extract.backends.hf import _fixed as hf_fixed
from walla.extract.backends.hf import _fixed_probe as hf_fixed_probe
from walla.extract.backends.hf import _modes as hf_modes
from walla.extract.config import ExtractConfig
from walla.extract.models import ResolvedModel
from walla.store.features import read_feature_set

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
    assert any(x.startswith("batch tokens auto -> 65,536 on cuda: ") and "GiB free" in x for x in lines)
    assert any(x.startswith("compile auto -> off") for x in lines)  # a few hundred tokens
    fs = read_feature_set(path)
    inputs = fs.meta["inputs"]
    assert inputs["device"] == "cuda"
    # the kernel path: the GPU model and compute capability with the CUDA libraries (issue 37)
    major, minor = torch.cuda.get_device_capability(0)
    assert inputs["kernels"]["gpu"] == torch.cuda.get_device_name(0)
    assert (
        inputs["kernels"]["capability"] == f"{major}.{minor}"
        and inputs["kernels"]["cuda"] == torch.version.cuda
    )
    if hf_modes.CUDA_INVARIANT_BY_DEFAULT:  # fixed-shape packs: the tier is bitwise, the constants recorded
        assert any(
            x.startswith("batch-invariant auto -> on: fixed-shape packs of 8192 tokens") for x in lines
        )
        assert inputs["determinism"] == "bitwise", inputs
        assert inputs["invariant_scoring"] == hf_fixed.FIXED_SCORING and inputs["batch_invariant"] is True
        assert (
            inputs["fixed_shapes"] == hf_fixed.fixed_identity("cuda", torch.bfloat16)
            and "batching" not in inputs
        )
    else:
        assert any(x.startswith("batch-invariant auto -> off: padded batches on cuda") for x in lines)
        assert inputs["determinism"] == "batch-recorded", inputs
        assert inputs["batching"]["batch_tokens"] == 65_536
        assert inputs["batching"]["shard_rows"] == 8192
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
    settled = HF.settle(req, HF.Options(batch_invariant="off"))  # padded: the sizes decide the bits
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
    assert explain_compile("auto", 2_000_000, "cuda")[0] is True
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


# prompt lengths of the fixed-shape tests: each side of the quantum (16) and of a key step (128), several
# prompts per 8,192-token pack, and one longer than a pack (alone in a stream of 16,384)
FIXED_LENGTHS = (1, 2, 15, 16, 17, 40, 127, 128, 129, 300, 1000, 2500, 9000)
OTHER_LENGTHS = (60, 7, 700, 3000)


def medium_llama(vocab: int = 32_000):
    """A Llama whose GEMMs are big enough for cuBLAS to choose among its kernels (hidden 2048, GQA 16/4)."""
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=2,
        num_attention_heads=16,
        num_key_value_heads=4,
        max_position_embeddings=16_384,
    )
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg).eval().to("cuda", torch.bfloat16)


def gemma2_cuda(vocab: int):
    """A small Gemma-2 on CUDA: attention soft-capping, a 64-token window on every other layer, final-logit
    soft-capping, eager attention."""
    torch.manual_seed(0)
    cfg = Gemma2Config(
        vocab_size=vocab,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=16_384,
        sliding_window=64,
    )
    cfg._attn_implementation = "eager"
    return Gemma2ForCausalLM(cfg).eval().to("cuda", torch.bfloat16)


def random_prompts(vocab: int, lengths, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(4, vocab, (n,), generator=g).tolist() for n in lengths]


def assert_fixed_mixes_bit_identical(be: HFBackend, vocab: int) -> None:
    """Each prompt alone (its own stream), all together, and in reverse after others: the same bits, per
    field; a failure names the prompt, its length, the mix and the field."""
    enc, others = random_prompts(vocab, FIXED_LENGTHS, 0), random_prompts(vocab, OTHER_LENGTHS, 1)
    cand = list(range(0, vocab, max(1, vocab // 16)))
    alone = hf_fixed.score(be, enc, cand, max_rows=1)
    together = hf_fixed.score(be, enc, cand)
    mixed = hf_fixed.score(be, others + enc[::-1], cand)
    n, k = len(enc), len(others)
    bad = []
    for name, res, at in (("together", together, range(n)), ("mixed", mixed, range(k + n - 1, k - 1, -1))):
        for i, j in enumerate(at):
            diff = hf_fixed_probe.first_difference(
                hf_fixed_probe.rows_of(alone, i), hf_fixed_probe.rows_of(res, j)
            )
            if diff is not None:
                bad.append(f"prompt {i} ({len(enc[i])} tokens) {name} vs alone: {diff}")
    assert not bad, "; ".join(bad)
    assert np.isfinite(alone.raw_logprobs).all() and np.isfinite(alone.prompt_nll).all()


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_fixed_shapes_give_the_same_bits_alone_and_in_two_mixes_on_cuda(tmp_path, monkeypatch, compiled):
    """bf16 on CUDA, a Llama large enough for cuBLAS to pick kernels by shape: fixed-shape packs (the CUDA
    invariant path) give each prompt the same bits alone and in two mixes; the load probe agrees; the numbers
    stay close to padded batches."""
    monkeypatch.setenv("WALLA_CACHE", str(tmp_path))
    tok = tiny_tokenizer()
    model = medium_llama()
    be = HFBackend(model, tok, batch_invariant=True, compiled=compiled)
    assert be.fixed_shapes and be.pack_tokens == hf_fixed.PACK_TOKENS  # the CUDA default path
    why = be.settle_invariance()
    assert be.rows_invariant, why
    assert_fixed_mixes_bit_identical(be, model.config.vocab_size)
    enc = random_prompts(model.config.vocab_size, (40, 300, 129), 2)
    got = hf_fixed.score(be, enc, [5, 6, 7])
    padded = HFBackend(model, tok, batch_invariant=False, batch_tokens=4096)
    ref = padded.score([""] * len(enc), [5, 6, 7], enc=enc)
    assert np.abs(got.raw_logprobs - ref.raw_logprobs).max() <= 0.1
    assert np.abs(got.hidden - ref.hidden).max() / np.abs(ref.hidden).max() <= TOL_HIDDEN


def test_fixed_shapes_with_softcap_and_sliding_window_on_cuda(tmp_path, monkeypatch):
    """Gemma-2 (eager, soft-capping, a 64-token window) in bf16 on CUDA: the same bits alone and in two mixes,
    and in float32 the same numbers as the model's own forward."""
    monkeypatch.setenv("WALLA_CACHE", str(tmp_path))
    tok = tiny_tokenizer()
    vocab = 4096
    be = HFBackend(gemma2_cuda(vocab), tok, batch_invariant=True)
    assert be.fixed_shapes
    assert_fixed_mixes_bit_identical(be, vocab)
    model = gemma2_cuda(vocab).float()
    f32 = HFBackend(model, tok, batch_invariant=True)
    enc = random_prompts(vocab, (3, 100, 300), 3)
    got = hf_fixed.score(f32, enc, [5, 6, 7])
    for i, ids in enumerate(enc):
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([ids], device="cuda")).logits[0, -1].float()
        want = torch.log_softmax(logits, -1)[[5, 6, 7]].cpu().numpy()
        np.testing.assert_allclose(
            got.raw_logprobs[i], want, atol=1e-3, err_msg=f"prompt {i} ({len(ids)} tokens)"
        )


def test_dtype_probe_measures_a_realistic_gemm_on_cuda(tmp_path):
    choice = dtype_probe.probe("cuda", tmp_path, refresh=True)
    assert choice.n == 8192 and "(8192x8192x8192, 3 pairs)" in choice.why() and "TFLOP/s" in choice.why()
    low = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    assert choice.gflops[low] > choice.gflops["float32"] > 0  # tensor cores vs plain fp32 (no TF32)


def test_second_compile_on_cuda_is_served_from_the_cache(tmp_path, monkeypatch):
    """torch's compile caches (AOT autograd, FX graphs, Triton kernels) under $WALLA_CACHE/compile/<key>/: the
    same model and dtype compiled again, as a second run would, is a cache hit (inductor compiles no graph
    afresh), in the same folder. Prints the seconds of both (pytest -s)."""
    from tiny_model import compile_runs
    from torch._dynamo.utils import counters
    from walla.extract.backends.hf import _compile as hf_compile

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
    from walla.extract.backends.registry import open_backend, settle_backend
    from walla.extract.backends.vllm import _backend as vb

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
