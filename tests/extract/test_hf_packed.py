"""Batch-invariant hf scoring (extract/backends/hf/_packed.py): right numbers, and the same bits in any batch mix."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from test_hf_backend import PROMPTS, naive
from tiny_model import CORPUS, tiny_model, tiny_tokenizer
from transformers import Gemma2Config, Gemma2ForCausalLM, MistralConfig, MistralForCausalLM
from walla.extract.backends.hf import INVARIANT_SCORING, MIN_PREFIX, HFBackend, hf_identity, load_hf_backend
from walla.extract.backends.hf import _lm_head as lm_head
from walla.extract.backends.hf import _packed as hf_packed
from walla.extract.config import ExtractConfig
from walla.extract.door import target_for
from walla.extract.parity import render_prompts

OTHERS = [
    "Question : Is the door of room 7 painted blue ? Answer with YES or NO . Answer :",
    "oxygen carbon dioxide nitrogen helium water light sun moon star tree leaf root . Answer :",
    "Fact : the dog ran in the park . Answer :",
]
CAND = [5, 6, 7, 9]


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def bf16_model(tok):
    return tiny_model(len(tok)).to(torch.bfloat16)


def assert_same_bits(a, b):
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


def rows(res, idx):
    """(option log-probs, hidden, NLL, n_tokens) of the rows `idx` of a ScoreResult."""
    return res.raw_logprobs[idx], res.hidden[idx], res.prompt_nll[idx], res.n_tokens[idx]


def mixes(be: HFBackend, prompts: list[str]) -> list[tuple]:
    """The rows of `prompts` scored in three batch mixes: together, among other prompts in reverse order with
    a smaller token budget, and each alone."""
    n = len(prompts)
    together = be.score(prompts, CAND)
    budget = be.batch_tokens
    be.batch_tokens = 40
    mixed = be.score(OTHERS + prompts[::-1], CAND)
    be.batch_tokens, be.max_batch_rows = budget, 1
    alone = be.score(prompts, CAND)
    be.max_batch_rows = None
    back = list(range(len(OTHERS) + n - 1, len(OTHERS) - 1, -1))
    return [rows(together, list(range(n))), rows(mixed, back), rows(alone, list(range(n)))]


def test_packed_scoring_matches_the_naive_full_computation(tok):
    """float32, packed: option log-probs, hidden state and NLL of each prompt = its own unpadded forward."""
    model = tiny_model(len(tok))
    be = HFBackend(model, tok, batch_tokens=10_000, batch_invariant=True, chunk_elems=64, vocab_chunk=16)
    prompts = PROMPTS + ["Answer"]  # a 2-token prompt (BOS + 1) among long ones
    res = be.score(prompts, CAND)
    for i, p in enumerate(prompts):
        ids = be.encode(p)
        lp, hid = naive(model, ids)
        np.testing.assert_allclose(res.raw_logprobs[i], lp[-1, CAND].numpy(), atol=2e-5)
        np.testing.assert_allclose(res.hidden[i], hid[-1].numpy(), atol=2e-5, rtol=1e-4)
        want_nll = -lp[:-1].gather(1, torch.tensor(ids[1:])[:, None]).mean().item()
        assert res.prompt_nll[i] == pytest.approx(want_nll, abs=2e-5)
        assert res.n_tokens[i] == len(ids)


def test_bf16_prompt_gives_the_same_bits_in_any_batch_mix(tok, bf16_model):
    be = HFBackend(bf16_model, tok, batch_tokens=120)
    assert be.batch_invariant
    together, mixed, alone = mixes(be, PROMPTS)
    assert_same_bits(together, mixed)
    assert_same_bits(together, alone)
    assert np.isfinite(together[0]).all() and (together[2] > 0).all()
    be.self_check()  # and the packed path still agrees with the model's own forward


@pytest.mark.parametrize("long_prefix", [False, True])
def test_a_cached_shared_prefix_gives_the_same_bits_as_another_shard_without_one(
    tok, bf16_model, long_prefix
):
    """A score() call whose prompts share a prefix runs it once (KV cache); the same prompts in a call (a shard)
    with other prompts, where nothing is shared, and alone give the same bits: one attention call per layer.
    A prefix longer than a key block has whole blocks that blocked_attention runs once for all prompts."""
    be = HFBackend(bf16_model, tok, batch_tokens=400 if long_prefix else 120)
    head = " ".join(CORPUS[:4] if long_prefix else [CORPUS[0], CORPUS[5]])
    prompts = [head + " " + c for c in CORPUS[1:5]]
    p = be.shared_prefix(be.encode_batch(prompts))
    assert p >= (hf_packed.KEY_BLOCK if long_prefix else MIN_PREFIX)
    cached = be.score(prompts, CAND)
    assert be.attention_batched, be.invariance_why  # the probe passed: one call per layer, prefix cached
    shard = be.score(OTHERS[:2] + prompts[:3] + OTHERS[2:], CAND)
    be.max_batch_rows = 1
    alone = be.score(prompts[3:], CAND)
    assert_same_bits(rows(cached, [0, 1, 2]), rows(shard, [2, 3, 4]))
    assert_same_bits(rows(cached, [3]), rows(alone, [0]))


def run_steps(steps) -> tuple[object, int]:
    """Drive a score_steps generator: (its ScoreResult, how many passes it ran)."""
    passes = 0
    while True:
        passes += 1
        try:
            next(steps)
        except StopIteration as done:
            return done.value, passes


@pytest.mark.parametrize("chunk", [3, 7, hf_packed.KEY_BLOCK, 100])
def test_long_prompts_scored_in_pieces_give_scores_bits(tok, bf16_model, chunk):
    """Chunked prefill (HFBackend.score_steps, what walla serve runs for a long prompt between other passes):
    each prompt's pieces after a growing prefix of its own give the bits of score() of the whole prompt, for
    pieces shorter than, equal to and longer than a key block, and the NLL of every token on the way."""
    be = HFBackend(bf16_model, tok, batch_tokens=400)
    prompts = [" ".join(CORPUS[:6]), PROMPTS[0], "Answer"]  # long, medium, 2 tokens
    whole = be.score(prompts, CAND)
    stepped, passes = run_steps(be.score_steps(prompts, CAND, chunk))
    assert be.chunks_exact(max(whole.n_tokens)) and be.attention_batched
    pieces = sum(max(1, -(-int(n) // chunk)) for n in whole.n_tokens)
    assert passes == pieces if max(whole.n_tokens) > chunk else passes == 1
    assert_same_bits(rows(stepped, [0, 1, 2]), rows(whole, [0, 1, 2]))


def test_a_sliding_window_shorter_than_the_prompt_is_scored_whole(tok):
    """Gemma-2's window layers keep only the window: no pieces (one pass, score() itself)."""
    be = HFBackend(gemma2(tok, torch.bfloat16), tok, batch_tokens=120)
    whole = be.score(PROMPTS, CAND)
    assert max(whole.n_tokens) > be.sliding_window and not be.chunks_exact(int(max(whole.n_tokens)))
    stepped, passes = run_steps(be.score_steps(PROMPTS, CAND, 4))
    assert passes == 1
    assert_same_bits(rows(stepped, [0, 1]), rows(whole, [0, 1]))


def test_blocked_attention_equals_sdpa_and_reads_a_cached_prefix():
    """float32: one call over packed prompts equals each prompt's own causal SDPA; after a cached prefix the
    suffix rows are the same bits as with the prefix as the prompt's own tokens."""
    g = torch.Generator().manual_seed(0)
    lengths, hq, hkv, d = [5, 70, 1, 130], 4, 2, 8
    q, k, v = (torch.randn(1, h, sum(lengths), d, generator=g) for h in (hq, hkv, hkv))
    out = hf_packed.blocked_attention(q, k, v, lengths)[0]  # [T, Hq, D]
    start = 0
    for n in lengths:
        sl = slice(start, start + n)
        kk, vv = (x[:, :, sl].repeat_interleave(hq // hkv, 1) for x in (k, v))
        ref = torch.nn.functional.scaled_dot_product_attention(q[:, :, sl], kk, vv, is_causal=True)
        torch.testing.assert_close(out[sl], ref[0].transpose(0, 1), atol=1e-5, rtol=1e-5)
        start += n
    p = 37  # the first prompt's first 37 tokens as a cached prefix of a 33-token suffix
    full = hf_packed.blocked_attention(q[:, :, :70], k[:, :, :70], v[:, :, :70], [70])[0]
    suffix = hf_packed.blocked_attention(q[:, :, p:70], k[:, :, :70], v[:, :, :70], [70 - p], prefix=p)[0]
    assert torch.equal(full[p:], suffix)
    with pytest.raises(ValueError, match="keys for a 5-token prefix"):
        hf_packed.blocked_attention(q[:, :, :10], k[:, :, :10], v[:, :, :10], [10], prefix=5)


def reference_attention(q, k, v, n: int, scale: float, softcap: float | None = None) -> torch.Tensor:
    """The numbers of invariant scoring 2, written plainly for one prompt alone ([1, H, n, D] each ->
    [n, Hq, D]): float32; per kv head, rows (token, group); scores of all keys padded to 64-key blocks (masked:
    -inf); the row maximum; then per block in position order the 64-key sum of exp and the value GEMM, added."""
    hq, hkv, d = q.shape[1], k.shape[1], q.shape[-1]
    g, lk = hq // hkv, -(-n // 64) * 64
    out = torch.empty(n, hkv, g, d)
    for h in range(hkv):
        rows = q[0, h * g : (h + 1) * g].float().transpose(0, 1).reshape(n * g, d)  # [n*G, D]
        keys, vals = (torch.zeros(lk, d) for _ in range(2))
        keys[:n], vals[:n] = k[0, h].float(), v[0, h].float()
        s = (rows @ keys.T) * scale  # [n*G, Lk]
        s = torch.tanh(s / softcap) * softcap if softcap else s
        allowed = torch.arange(lk)[None] <= torch.arange(n).repeat_interleave(g)[:, None]
        e = torch.exp(
            s.masked_fill(~allowed, -torch.inf) - s.masked_fill(~allowed, -torch.inf).amax(-1)[:, None]
        )
        total, acc = e[:, :64].sum(-1, keepdim=True), e[:, :64] @ vals[:64]
        for b0 in range(64, lk, 64):
            total += e[:, b0 : b0 + 64].sum(-1, keepdim=True)
            acc += e[:, b0 : b0 + 64] @ vals[b0 : b0 + 64]
        out[:, h] = (acc / total).view(n, g, d)
    return out.view(n, hq, d).to(q.dtype)


@pytest.mark.parametrize("softcap", [None, 30.0])
def test_blocked_attention_numbers_are_those_its_version_names(softcap):
    """Pins what INVARIANT_SCORING (in every invariant fingerprint) stands for: blocked_attention over a pack
    (shared prefix blocks run once for all rows, the rest per prompt in length groups) gives each prompt the
    same bits as the plain per-prompt reference above. Change the numbers and this fails until the reference
    and INVARIANT_SCORING change together (hf_packed.ATTENTION_VERSION re-keys the load-time probe)."""
    assert INVARIANT_SCORING == 2
    gen = torch.Generator().manual_seed(1)
    hq, hkv, d, p = 4, 2, 16, 100  # 100 cached prefix tokens: one whole shared block, one shared in part
    lengths = [4, 30, 29, 60, 5, 23]
    q, k, v = (torch.randn(1, h, p + sum(lengths), d, generator=gen).bfloat16() for h in (hq, hkv, hkv))
    scale = d**-0.5
    plain = hf_packed.blocked_attention(q[:, :, p:], k, v, lengths, p, scale, None, softcap)[0]  # [T, Hq, D]
    alone = hf_packed.blocked_attention(q[:, :, : p + 30], k[:, :, : p + 30], v[:, :, : p + 30], [p + 30])[0]
    start = p
    for i, n in enumerate(lengths):
        own = torch.cat([torch.arange(p), torch.arange(start, start + n)])  # the prefix, then its own tokens
        want = reference_attention(q[:, :, own], k[:, :, own], v[:, :, own], p + n, scale, softcap)[p:]
        assert torch.equal(plain[start - p : start - p + n], want), f"prompt {i} ({n} tokens)"
        start += n
    want = reference_attention(q[:, :, : p + 30], k[:, :, : p + 30], v[:, :, : p + 30], p + 30, scale)
    assert torch.equal(alone, want)


def test_one_token_prompt_alone_is_padded_to_two_rows(bf16_model):
    tok = tiny_tokenizer(bos=False)
    be = HFBackend(bf16_model, tok)
    ids, pos, lengths = hf_packed.pack_inputs([[7]], be.pad_id)
    assert ids.tolist() == [[7, be.pad_id]] and pos.tolist() == [[0, 0]] and lengths == [1, 1]
    ids, pos, lengths = hf_packed.pack_inputs([[7]], be.pad_id, offset=5)  # after a 5-token cached prefix
    assert pos.tolist() == [[5, 5]]
    alone = be.score(["Answer"], CAND)
    among = be.score(["Answer", "Question : Is the door red ? Answer"], CAND)
    assert alone.prompt_nll[0] == 0.0 and alone.n_tokens[0] == 1
    assert_same_bits(rows(alone, [0]), rows(among, [0]))


def gemma2(tok, dtype):
    """A tiny Gemma-2: eager attention, attention soft-capping, an 8-token sliding window on every other layer."""
    torch.manual_seed(0)
    cfg = Gemma2Config(
        vocab_size=len(tok),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        max_position_embeddings=64,
        sliding_window=8,
        pad_token_id=1,
        bos_token_id=2,
        eos_token_id=3,
    )
    cfg._attn_implementation = "eager"
    return Gemma2ForCausalLM(cfg).eval().to(dtype)


def test_eager_attention_with_sliding_window_packs_correctly(tok):
    """The eager path (float mask) and the sliding window of prompts longer than the window, vs Gemma-2's own."""
    model = gemma2(tok, torch.float32)
    be = HFBackend(model, tok, batch_invariant=True)
    res = be.score(PROMPTS, CAND)
    assert max(res.n_tokens) > 2 * model.config.sliding_window
    for i, p in enumerate(PROMPTS):
        lp, hid = naive(model, be.encode(p))
        np.testing.assert_allclose(res.raw_logprobs[i], lp[-1, CAND].numpy(), atol=2e-5)
        np.testing.assert_allclose(res.hidden[i], hid[-1].numpy(), atol=2e-5, rtol=1e-4)
    bf16 = HFBackend(gemma2(tok, torch.bfloat16), tok, batch_tokens=120)
    together, mixed, alone = mixes(bf16, PROMPTS)
    assert_same_bits(together, mixed)
    assert_same_bits(together, alone)


def test_sdpa_with_a_sliding_window_packs_correctly(tok):
    """SDPA gets a boolean window mask for prompts longer than the window (Mistral: sdpa, window of 8)."""
    torch.manual_seed(0)
    cfg = MistralConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        sliding_window=8,
        pad_token_id=1,
        bos_token_id=2,
        eos_token_id=3,
    )
    cfg._attn_implementation = "sdpa"
    model = MistralForCausalLM(cfg).eval()
    be = HFBackend(model, tok, batch_invariant=True)
    res = be.score(PROMPTS, CAND)
    assert max(res.n_tokens) > 2 * cfg.sliding_window
    for i, p in enumerate(PROMPTS):
        lp, hid = naive(model, be.encode(p))
        np.testing.assert_allclose(res.raw_logprobs[i], lp[-1, CAND].numpy(), atol=2e-5)
        np.testing.assert_allclose(res.hidden[i], hid[-1].numpy(), atol=2e-5, rtol=1e-4)


@pytest.mark.slow
def test_compiled_bf16_packed_scoring_is_batch_invariant_too(tok):
    """Compiled layers (graph break at the per-prompt attention, no recompile per pack): same bits in any
    mix, and close to the eager packed path."""
    model = tiny_model(len(tok)).to(torch.bfloat16)
    eager = HFBackend(model, tok, batch_tokens=120).score(PROMPTS, CAND)
    be = HFBackend(copy.deepcopy(model), tok, batch_tokens=120, compiled=True)
    together, mixed, alone = mixes(be, PROMPTS)
    assert_same_bits(together, mixed)
    assert_same_bits(together, alone)
    np.testing.assert_allclose(together[0], eager.raw_logprobs, atol=0.1)  # fused ops round differently


class RowCountLinear(torch.nn.Linear):
    """A linear layer whose rows depend on whether the GEMM has more than `above` rows (as split-K kernels can)."""

    above = 64

    def forward(self, x):
        return super().forward(x) + 0.25 * (x.reshape(-1, x.shape[-1]).shape[0] > self.above)


def row_count_model(tok, above: int):
    model = tiny_model(len(tok)).to(torch.bfloat16)
    mlp = model.model.layers[0].mlp
    down = RowCountLinear(mlp.down_proj.in_features, mlp.down_proj.out_features, bias=False)
    down.weight, down.above = mlp.down_proj.weight, above
    mlp.down_proj = down
    return model


def test_gemms_that_are_not_row_invariant_make_each_prompt_run_alone(tok, tmp_path, monkeypatch):
    monkeypatch.setenv("WALLA_CACHE", str(tmp_path))  # the probes' cache keys know the class, not `above`
    model = row_count_model(tok, above=64)
    ok, min_rows, why = hf_packed.linear_rows_invariant(model, 120)
    assert (
        not ok
        and min_rows == 65
        and "64x32 linear layer's rows differ" in why
        and "each prompt runs alone" in why
    )
    be = HFBackend(model, tok, batch_tokens=120)
    seen: list[int] = []
    be.score(PROMPTS, CAND, progress=lambda n, _tokens: seen.append(n))
    assert be.rows_invariant is False and seen == [1] * len(PROMPTS)
    together, mixed, alone = mixes(be, PROMPTS)
    assert_same_bits(together, mixed)
    assert_same_bits(together, alone)


def test_gemms_invariant_from_a_few_rows_on_get_streams_padded_to_that_many(tok, tmp_path, monkeypatch):
    """Rows that agree only from 9 rows on (as MKL's float32 kernels from a few rows): packs stay, every GEMM
    gets at least 9 rows (short streams padded, the LM head's calls too), and the bits hold in any mix."""
    monkeypatch.setenv("WALLA_CACHE", str(tmp_path))
    model = row_count_model(tok, above=8)
    ok, min_rows, why = hf_packed.linear_rows_invariant(model, 120)
    assert ok and min_rows == 9 and "from 9 up" in why
    be = HFBackend(model, tok, batch_tokens=120)
    seen: list[int] = []
    be.score(PROMPTS, CAND, progress=lambda n, _tokens: seen.append(n))
    assert be.rows_invariant and be.min_rows == 9 and max(seen) > 1
    together, mixed, alone = mixes(be, PROMPTS)
    assert_same_bits(together, mixed)
    assert_same_bits(together, alone)
    ids, pos, lengths = hf_packed.pack_inputs([[7, 8]], be.pad_id, min_rows=9)
    assert ids.shape == (1, 9) and lengths == [2, 7] and pos.tolist() == [[0, 1, *range(7)]]


def kernel_for_rows(monkeypatch, rows: int, vocab: int | None = None) -> list[int]:
    """lm_head.logits as a kernel picked for calls of exactly `rows` rows (of `vocab` outputs: any when None),
    whose rows then round otherwise; returns the row counts of its calls."""
    orig, seen = lm_head.logits, []

    def logits(h, w, b=None):
        seen.append(h.shape[0])
        return orig(h, w, b) + 0.25 * (h.shape[0] == rows and vocab in (None, w.shape[0]))

    monkeypatch.setattr(lm_head, "logits", logits)
    return seen


def test_the_head_probe_runs_the_row_count_the_heads_calls_have_and_catches_a_kernel_picked_for_it(
    tok, monkeypatch
):
    """The LM head runs NLL chunks and option rows of HFBackend.head_rows() rows (here 40: chunk_elems over
    the vocabulary), and its probe's reference GEMM has exactly that many: a head kernel whose rows round
    otherwise only at that count fails it (a fixed 1,024-row reference never ran SmolLM2's 682-row chunks)."""
    model = tiny_model(len(tok)).to(torch.bfloat16)
    be = HFBackend(model, tok, batch_tokens=400, chunk_elems=40 * len(tok))
    assert be.head_rows() == 40
    ok, _, why = hf_packed.linear_rows_invariant(model, 400, head_rows=be.head_rows())
    assert ok and "(head, up to 40 rows)" in why, why
    kernel_for_rows(monkeypatch, 40)
    ok, min_rows, why = hf_packed.linear_rows_invariant(model, 400, head_rows=be.head_rows())
    assert not ok and min_rows > hf_packed.MAX_MIN_ROWS and "LM head's rows differ" in why, why
    # token_nll's vocabulary slices are probed as they run too (a vocabulary larger than vocab_chunk)
    monkeypatch.undo()
    kernel_for_rows(monkeypatch, 40, vocab=16)
    ok, _, why = hf_packed.linear_rows_invariant(model, 400, head_rows=40, vocab_chunk=16)
    assert not ok and "32x16 LM head" in why, why


def test_invariant_scoring_calls_the_head_with_head_rows_rows_at_most_and_keeps_the_bits(
    tok, tmp_path, monkeypatch
):
    """Option rows go through the head head_rows() at a time, as NLL chunks do (the probe's range); the
    bits are those of any other mix."""
    monkeypatch.setenv("WALLA_CACHE", str(tmp_path))
    model = tiny_model(len(tok)).to(torch.bfloat16)
    be = HFBackend(model, tok, batch_tokens=2000, chunk_elems=3 * len(tok))
    assert be.head_rows() == 3
    be.settle_invariance()  # the probe's own calls run up to max(head_rows, MAX_MIN_ROWS + 1) rows
    seen = kernel_for_rows(monkeypatch, -1)  # no row count picks another kernel: counts the calls only
    together, mixed, alone = mixes(be, PROMPTS)
    assert be.rows_invariant and max(seen) == max(3, be.min_rows), seen
    assert_same_bits(together, mixed)
    assert_same_bits(together, alone)


def test_plan_packs_covers_every_prompt_once_within_the_budget():
    lengths = [5, 30, 12, 12, 50, 3, 7]
    packs = hf_packed.plan_packs(lengths, 40)
    assert sorted(np.concatenate(packs).tolist()) == list(range(len(lengths)))
    assert [p.tolist() for p in packs] == [[4], [1], [2, 3, 6, 0, 5]]  # longest first; 50 > 40 alone
    assert [p.tolist() for p in hf_packed.plan_packs(lengths, 40, max_rows=2)][2:] == [[2, 3], [6, 0], [5]]
    with pytest.raises(ValueError, match="batch_tokens must be >= 1"):
        hf_packed.plan_packs(lengths, 0)


def test_identity_records_batch_invariance_in_reduced_precision_only():
    assert "batch_invariant" not in hf_identity(torch.float32, False)  # float32 fingerprints unchanged
    assert hf_identity(torch.bfloat16, False)["batch_invariant"] is True
    assert hf_identity(torch.bfloat16, False)["invariant_scoring"] == INVARIANT_SCORING == 2
    assert hf_identity(torch.float16, False)["batch_invariant"] is True
    assert hf_identity(torch.float32, False, batch_invariant=True)["batch_invariant"] is True


# as the Makefile: $REAL_DATA, else ../shared/data beside the checkout
REAL_DATA = Path(os.environ.get("REAL_DATA", Path(__file__).resolve().parents[3] / "shared" / "data"))
ARC = REAL_DATA / "arc" / "ARC-Challenge-Dev.jsonl"


@pytest.mark.slow
@pytest.mark.skipif(not ARC.exists(), reason=f"ARC dev file not found at {ARC} (dev machine only)")
def test_smollm2_bf16_arc_prompts_same_bits_in_two_batch_mixes():
    """The embedded SmolLM2-135M in bfloat16 on 6 real ARC prompts: the same bits in two batch mixes and alone
    (6, not 12: this CPU emulates bf16 at ~1 GFLOP/s; the tiny models above run many more mixes)."""
    cfg = ExtractConfig(model="smollm2-135m", dataset="arc-challenge", data_file=ARC, limit=9, progress=False)
    prompts, rm = render_prompts(cfg), target_for(cfg).model  # as walla check renders and opens them
    be = load_hf_backend(rm, dtype="bfloat16", device="cpu", batch_tokens=1024)
    texts = [p.text for p in prompts]
    cand = [be.encode_bare(s)[0] for s in "ABCD"]
    mine, others = texts[:6], texts[6:]
    a = be.score(mine, cand)
    be.batch_tokens = 500  # two packs of 4 and 5 prompts, each of mine beside other prompts
    b = be.score(others[:2] + mine[::-1] + others[2:], cand)
    be.max_batch_rows = 1
    c = be.score(mine, cand)
    back = list(range(2 + 5, 2 - 1, -1))
    assert_same_bits(rows(a, list(range(6))), rows(b, back))
    assert_same_bits(rows(a, list(range(6))), rows(c, list(range(6))))
