"""The hf backend against a naive full-logits computation on a tiny random Llama (no download)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_model import tiny_model, tiny_tokenizer
from transformers import Gemma2Config, Gemma2ForCausalLM
from walla.extract.backends.hf import HFBackend, load_model
from walla.extract.backends.hf import _lm_head as lm_head
from walla.extract.models import ResolvedModel
from walla.extract.scoring import renormalize

PROMPTS = [
    "Question : Is the door of room 42 painted red ? Answer :",
    "Fact : the cat sat on the mat . Question : Is the door painted blue ? Answer with YES or NO . Answer :",
    "Question : Which gas do plants take in ? Choices : A ) oxygen B ) carbon dioxide C ) helium Answer :",
    "Answer :",
    "the dog ran in the park with a ball and the cat sat on the mat and the sun and the moon . Answer :",
]


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return tiny_model(len(tok))


def naive(model, ids: list[int]):
    """Full forward of one unpadded sequence: (log-probs [L, V], last-layer hidden [L, d])."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    return torch.log_softmax(out.logits[0].double(), -1), out.hidden_states[-1][0]


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize(
    "chunks", [{"chunk_elems": 64, "vocab_chunk": 16}, {}], ids=["vocab-slices", "default"]
)
def test_outputs_match_naive_full_logits(model, tok, side, chunks):
    # small chunks exercise the vocabulary x token chunking of the NLL; the default is one vocabulary pass
    be = HFBackend(model, tok, batch_tokens=10_000, padding_side=side, **chunks)
    cand = [tok.convert_tokens_to_ids(t) for t in ["A", "B", "C", "YES", "NO"]]
    res = be.score(PROMPTS, cand)
    lengths = {len(be.encode(p)) for p in PROMPTS}
    assert len(lengths) > 3  # a genuinely padded batch
    for i, p in enumerate(PROMPTS):
        ids = be.encode(p)
        lp, hid = naive(model, ids)
        np.testing.assert_allclose(res.raw_logprobs[i], lp[-1, cand].numpy(), atol=2e-5)
        np.testing.assert_allclose(res.hidden[i], hid[-1].numpy(), atol=2e-5, rtol=1e-4)
        want_nll = -lp[:-1].gather(1, torch.tensor(ids[1:])[:, None]).mean().item() if len(ids) > 1 else 0.0
        assert res.prompt_nll[i] == pytest.approx(want_nll, abs=2e-5)
        assert res.n_tokens[i] == len(ids)
        # restricted + renormalized == softmax of the naive logits over the option tokens only
        logits = torch.log_softmax(lp[-1, cand], -1).numpy()
        np.testing.assert_allclose(renormalize(res.raw_logprobs[i]), logits, atol=2e-5)


@pytest.mark.parametrize(
    "chunks", [{"chunk_elems": 64, "vocab_chunk": 16}, {}], ids=["vocab-slices", "default"]
)
def test_softcapped_prompt_nll_matches_naive(model, tok, chunks):
    """Final-logit soft-capping (Gemma-2) enters the prompt NLL on both NLL paths."""
    be = HFBackend(model, tok, **chunks)
    be.softcap = 2.0
    ids = be.encode(PROMPTS[1])
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].double()  # [L, V]
    lp = torch.log_softmax(torch.tanh(logits / 2.0) * 2.0, -1)
    want = -lp[:-1].gather(1, torch.tensor(ids[1:])[:, None]).mean().item()
    assert be.score([PROMPTS[1]], [5]).prompt_nll[0] == pytest.approx(want, abs=2e-5)


def test_hidden_equals_models_own_left_padded_batch(model, tok):
    """Our hidden state == the model's own hidden_states[-1] in a properly left-padded batch."""
    be = HFBackend(model, tok, padding_side="left")
    enc = tok(PROMPTS[:3], padding=True, padding_side="left", return_tensors="pt")
    pos = (enc["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        own = model(**enc, position_ids=pos, output_hidden_states=True).hidden_states[-1][:, -1]
    res = be.score(PROMPTS[:3], [5])
    np.testing.assert_allclose(res.hidden, own.numpy(), atol=2e-5, rtol=1e-4)


def test_batching_returns_input_order(model, tok):
    """Many small buckets (sorted by length) must come back in input order, none lost."""
    prompts = [PROMPTS[i % len(PROMPTS)] + " the" * (i % 7) for i in range(23)]
    one = HFBackend(model, tok, batch_tokens=1)  # one prompt per forward pass
    many = HFBackend(model, tok, batch_tokens=120)
    seen = []
    a = one.score(prompts, [5, 6])
    b = many.score(prompts, [5, 6], progress=lambda rows, toks: seen.append(rows))
    assert sum(seen) == len(prompts) and len(seen) > 2
    np.testing.assert_allclose(a.hidden, b.hidden, atol=2e-5)
    np.testing.assert_allclose(a.raw_logprobs, b.raw_logprobs, atol=2e-5)
    np.testing.assert_array_equal(a.n_tokens, [len(one.encode(p)) for p in prompts])


def test_self_check_passes_and_catches_a_wrong_head(tok):
    model = tiny_model(len(tok), seed=1)
    be = HFBackend(model, tok)
    assert be.self_check() < 1e-3
    be.softcap = 0.5  # a head the model does not have: our logits no longer match model(...).logits
    with pytest.raises(RuntimeError, match="self-check failed"):
        be.self_check()


def test_self_check_in_bfloat16_tells_rounding_from_a_wrong_head(tok):
    """bf16, batch-invariant (float32 attention sums vs the model's bf16 SDPA): the check passes on the model
    as it is, and still fails for a head the model does not have (the head part compares our head with the
    model's on the model's own hidden states, so rounding in the forward cannot hide or fake a difference)."""
    model = tiny_model(len(tok), seed=1, weight_scale=1.0).to(torch.bfloat16)
    be = HFBackend(model, tok, batch_invariant=True)
    assert be.self_check() < 0.05
    be.softcap = 0.5
    with pytest.raises(
        RuntimeError, match=r"self-check failed: our LM head.*logits \(tolerance [^;]*\); this"
    ):
        be.self_check()


def test_self_check_in_bfloat16_catches_a_wrong_forward(tok):
    """A forward that is wrong rather than rounded (here: the hidden state of another position) is off by far
    more than bf16 rounding (hf.HIDDEN_TOL_REDUCED), so the hidden part of the check fails it."""
    model = tiny_model(len(tok), seed=1, weight_scale=1.0).to(torch.bfloat16)
    be = HFBackend(model, tok, batch_invariant=True)
    right = be.forward_packed
    be.forward_packed = lambda enc, cand, *a, **k: right([ids[:-2] for ids in enc], cand, *a, **k)
    with pytest.raises(RuntimeError, match="self-check failed: our forward.s last hidden state"):
        be.self_check()


def test_single_token_prompt_has_zero_nll(model):
    tok = tiny_tokenizer(bos=False)
    be = HFBackend(model, tok)
    res = be.score(["Answer"], [5])
    assert res.n_tokens[0] == 1 and res.prompt_nll[0] == 0.0


def test_shared_prefix_is_cached_with_identical_outputs(model, tok):
    """Prompts sharing a long token prefix (few-shot examples): the prefix runs once, outputs unchanged."""
    shots = "Fact : the cat sat on the mat . Question : Is the door painted blue ? No . " * 3
    prompts = [shots + p for p in PROMPTS]
    cached = HFBackend(model, tok, batch_tokens=150, chunk_elems=64, vocab_chunk=16)
    enc = cached.encode_batch(prompts)
    assert cached.shared_prefix(enc) >= 16
    plain = HFBackend(model, tok, batch_tokens=150, prefix_cache=False)
    assert plain.shared_prefix(enc) == 0
    cand = [5, 6, 7]
    a, b = cached.score(prompts, cand), plain.score(prompts, cand)
    np.testing.assert_allclose(a.hidden, b.hidden, atol=5e-5, rtol=1e-4)
    np.testing.assert_allclose(a.raw_logprobs, b.raw_logprobs, atol=5e-5)
    np.testing.assert_allclose(a.prompt_nll, b.prompt_nll, atol=5e-5)
    np.testing.assert_array_equal(a.n_tokens, b.n_tokens)
    for i, p in enumerate(prompts):  # and against the naive full computation
        ids = cached.encode(p)
        lp, hid = naive(model, ids)
        want_nll = -lp[:-1].gather(1, torch.tensor(ids[1:])[:, None]).mean().item()
        assert a.prompt_nll[i] == pytest.approx(want_nll, abs=5e-5)
        np.testing.assert_allclose(a.raw_logprobs[i], lp[-1, cand].numpy(), atol=5e-5)


def test_gemma2_loads_with_transformers_attention_choice(tmp_path, tok):
    """Gemma-2 refuses attn_implementation="sdpa" (its message never says "sdpa"): load_model must not force it."""
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
    Gemma2ForCausalLM(cfg).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    rm = ResolvedModel("g2", str(tmp_path), None, None, {"source": "local"})
    model, _ = load_model(rm, torch.float32, "cpu")
    assert model.config._attn_implementation in ("eager", "sdpa")  # eager on transformers 5.23
    backend = HFBackend(model, tok)
    assert backend.self_check() < 1e-3  # soft-capped Gemma-2 logits reproduced by the head path


def test_last_position_head_in_row_chunks_and_ids_given_ahead(model, tok, monkeypatch):
    """Many short prompts: the [rows, V] head runs HEAD_ROWS rows at a time, with the same numbers; ids
    tokenized ahead (the GPU pipeline's background thread) give the same result as score() tokenizing."""
    be = HFBackend(model, tok, batch_tokens=10_000, prefix_cache=False)
    cand = [tok.convert_tokens_to_ids(t) for t in ["A", "B", "YES"]]
    whole = be.score(PROMPTS, cand)
    monkeypatch.setattr(lm_head, "HEAD_ROWS", 2)  # 5 prompts in one batch -> head chunks of 2, 2, 1
    chunked = be.score(PROMPTS, cand, enc=be.encode_batch(PROMPTS))
    np.testing.assert_allclose(chunked.raw_logprobs, whole.raw_logprobs, atol=1e-6)
    np.testing.assert_array_equal(chunked.hidden, whole.hidden)
    np.testing.assert_array_equal(chunked.prompt_nll, whole.prompt_nll)


def test_a_cached_prefix_raises_no_library_deprecation(capfd):
    """transformers 5.2x renamed the cache argument (`past_key_values` -> `cache`) and warns on every call with
    the old name, a site-packages path on every extraction: both scoring paths that reuse a shared prefix's
    cache pass it by the installed name, and print nothing."""
    import warnings

    tok = tiny_tokenizer()
    model32 = tiny_model(len(tok), seed=2)
    shared = "Return the label of the correct answer for the question below . " * 2
    prompts = [shared + p for p in PROMPTS]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for model, invariant in ((model32, False), (tiny_model(len(tok), seed=2).to(torch.bfloat16), True)):
            be = HFBackend(model, tok, batch_tokens=400, batch_invariant=invariant, fixed_shapes=False)
            assert be.shared_prefix(be.encode_batch(prompts)) > 0  # the prefix-cache path runs
            be.score(prompts, [0, 1])
    assert "deprecated" not in capfd.readouterr().err
