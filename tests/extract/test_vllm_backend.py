"""Pure parts of the vLLM backend, with fake vLLM output objects (vLLM itself needs a GPU)."""

from __future__ import annotations

from types import SimpleNamespace as NS

import numpy as np
import pytest
import torch
from walla.extract.backends import vllm as vb


def fake_generate_output(prompt_ids, logp_rows, next_logp):
    """A RequestOutput-like object: prompt_logprobs[t] = {token: Logprob} (None at t=0), 1 generated token."""
    plp = [None] + [{tid: NS(logprob=lp, rank=1)} for tid, lp in zip(prompt_ids[1:], logp_rows, strict=True)]
    gen = NS(token_ids=[7], logprobs=[{7: NS(logprob=next_logp, rank=1)}])
    return NS(prompt_token_ids=list(prompt_ids), prompt_logprobs=plp, outputs=[gen])


def test_requests_and_generate_parsing():
    ids = [[1, 5, 9], [1, 4]]
    assert vb.build_requests(ids) == [{"prompt_token_ids": [1, 5, 9]}, {"prompt_token_ids": [1, 4]}]
    out = fake_generate_output([1, 5, 9], [-2.0, -4.0], -0.25)
    nll, n, top1 = vb.parse_generate_output(out, [1, 5, 9])
    assert nll == pytest.approx(3.0) and n == 3 and top1 == -0.25
    one = fake_generate_output([1], [], -1.0)
    assert vb.parse_generate_output(one, [1])[:2] == (0.0, 1)
    bad = fake_generate_output([1, 5, 9], [-2.0, -4.0], -0.25)
    bad.prompt_logprobs = bad.prompt_logprobs[:2]
    with pytest.raises(RuntimeError, match="2 prompt log-probs for 3 prompt tokens"):
        vb.parse_generate_output(bad, [1, 5, 9])


def test_order_check():
    outs = [NS(prompt_token_ids=[1, 2]), NS(prompt_token_ids=[1, 3])]
    vb.check_order(outs, [[1, 2], [1, 3]], "generate")
    with pytest.raises(RuntimeError, match="out of order"):
        vb.check_order(outs[::-1], [[1, 2], [1, 3]], "generate")
    with pytest.raises(RuntimeError, match="1 outputs for 2 prompts"):
        vb.check_order(outs[:1], [[1, 2], [1, 3]], "pooling")


def test_pooling_parsing_both_output_kinds():
    emb = NS(outputs=NS(embedding=[0.5, -1.0]))
    pool = NS(outputs=NS(data=torch.tensor([0.5, -1.0], dtype=torch.bfloat16)))
    np.testing.assert_array_equal(vb.parse_pooling_output(emb), [0.5, -1.0])
    np.testing.assert_array_equal(vb.parse_pooling_output(pool), [0.5, -1.0])


def test_option_logprobs_from_hidden_match_full_softmax():
    torch.manual_seed(0)
    h, w = torch.randn(3, 8), torch.randn(50, 8)
    raw, top1 = vb.option_logprobs_from_hidden(h, w, [4, 9, 11], softcap=5.0)
    z = torch.tanh((h @ w.T) / 5.0) * 5.0
    want = torch.log_softmax(z, -1)
    np.testing.assert_allclose(raw, want[:, [4, 9, 11]].numpy(), atol=1e-6)
    np.testing.assert_allclose(top1, want.max(-1).values.numpy(), atol=1e-6)
    vb.check_top1(top1, top1 + 1e-3)
    with pytest.raises(RuntimeError, match="consistency check failed on 1 prompt"):
        vb.check_top1(top1, top1 + np.array([0.0, 0.5, 0.0]))


def test_lm_head_name_and_identity():
    assert (
        vb.lm_head_tensor_name(
            {"tie_word_embeddings": False}, {"lm_head.weight": "a", "model.embed_tokens.weight": "b"}
        )
        == "lm_head.weight"
    )
    assert (
        vb.lm_head_tensor_name(
            {"tie_word_embeddings": True}, {"lm_head.weight": "a", "model.embed_tokens.weight": "b"}
        )
        == "model.embed_tokens.weight"
    )
    with pytest.raises(RuntimeError, match="cannot find the LM head"):
        vb.lm_head_tensor_name({}, {"x": "a"})
    ident = vb.vllm_identity("bfloat16", False)
    assert ident["backend"] == "vllm" and ident["dtype"] == "bfloat16"


def test_not_usable_here_is_a_clear_error():
    ok, why = vb.vllm_usable()
    if ok:
        pytest.skip("vLLM and a GPU are present")
    from walla.extract.models import ResolvedModel

    with pytest.raises(RuntimeError, match="--backend vllm cannot run here"):
        vb.load_vllm_backend(ResolvedModel("m", "org/m", None, "main", {}))
