"""The LM head applied where it is needed, never as a [batch, seq, vocab] tensor: prompt NLL over
(token x vocabulary) chunks, and soft-capping (used by the hf backend)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

# logits per NLL chunk: 64 MiB in bf16, ~680 tokens of a 49k vocabulary (on the 2-core CPU the head GEMM +
# cross-entropy of 170-token chunks ran at ~0.8x the speed of 512-token ones; 2^23 was the old value)
CHUNK_ELEMS = 1 << 25
# on CUDA: 4x larger chunks (256 MiB of bf16 logits): the head GEMM gets >= 1,000 rows even for a 128k
# vocabulary, and the chunk loop runs fewer, larger kernels
CHUNK_ELEMS_CUDA = 1 << 27
# prompts whose last-position logits ([rows, V] float32) are computed at once on padded batches: bounds that
# buffer when a batch holds many short prompts (extract/sizing.py counts it as a fixed cost); batch-invariant
# scoring runs its option rows `chunk_rows` at a time instead, the row counts its NLL chunks have
HEAD_ROWS = 1024
# vocabulary rows per NLL chunk: the whole vocabulary of today's models, so each token chunk is ONE logsumexp
# pass (measured 2x faster on CPU than 4096-row slices with a running logaddexp, which stays for smaller values)
VOCAB_CHUNK = 1 << 18


def chunk_rows(n_vocab: int, chunk_elems: int = CHUNK_ELEMS, vocab_chunk: int = VOCAB_CHUNK) -> int:
    """Rows of each LM-head call of batch-invariant scoring (an NLL chunk of `token_nll`, the option rows of
    a pack): a [rows, vocabulary slice] chunk holds about `chunk_elems` logits (Gemma-3's 262k vocabulary:
    128 rows on a CPU, SmolLM2's 49k: 682). hf_packed.linear_rows_invariant probes the head up to these rows."""
    return max(1, chunk_elems // min(n_vocab, vocab_chunk))


def cap(z: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """Gemma-style final-logit soft-capping (none when `softcap` is falsy)."""
    return z if not softcap else torch.tanh(z / softcap) * softcap


def logits(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """Uncapped logits in the model's dtype, as every scoring path computes them: [n, d] -> [n, V]."""
    return h @ w.T if b is None else h @ w.T + b


def _slice_logits(h: torch.Tensor, w: torch.Tensor, b, v0: int, vc: int, softcap) -> torch.Tensor:
    """Capped float32 logits of vocabulary rows v0..v0+vc: [t, d] -> [t, vc]."""
    z = h @ w[v0 : v0 + vc].T
    return cap((z if b is None else z + b[v0 : v0 + vc]).float(), softcap)


def token_nll(
    h: torch.Tensor,
    targets: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None,
    softcap: float | None,
    chunk_elems: int = CHUNK_ELEMS,
    vocab_chunk: int = VOCAB_CHUNK,
    min_rows: int = 1,
) -> torch.Tensor:
    """-log p(target | position) for T positions without materializing [T, V]: [T, d], [T] -> [T].

    w [V, d] and b [V] | None are the LM head's; (token x vocabulary) chunks of `chunk_elems` logits. A chunk
    of fewer than `min_rows` rows is padded with copies of its first row (batch-invariant scoring: GEMMs of
    fewer rows round differently, see hf_packed.linear_rows_invariant).
    """
    n_vocab = w.shape[0]
    vc = min(n_vocab, vocab_chunk)
    tc = max(min_rows, chunk_rows(n_vocab, chunk_elems, vocab_chunk))
    out = torch.empty(h.shape[0], dtype=torch.float32, device=h.device)
    for t0 in range(0, h.shape[0], tc):
        hc, tg = h[t0 : t0 + tc], targets[t0 : t0 + tc]  # [tc, d], [tc]
        if hc.shape[0] < min_rows:
            real, fill = hc.shape[0], min_rows - hc.shape[0]
            hc, tg = torch.cat([hc, hc[:1].expand(fill, -1)]), torch.cat([tg, tg[:1].expand(fill)])
            out[t0 : t0 + real] = token_nll(hc, tg, w, b, softcap, chunk_elems, vocab_chunk, min_rows)[:real]
            continue
        if vc == n_vocab:  # one slice: the fused log-softmax of cross_entropy, one pass over [tc, V]
            z = logits(hc, w, b)  # [tc, V] in the model's dtype
            z = cap(z.float(), softcap) if softcap else z
            # bf16 logits stay bf16 (the kernel accumulates in fp32): 1.8x faster than an fp32 copy +
            # logsumexp, mean prompt NLL within 1e-3 of that (bf16 itself is ~1e-2 from fp32)
            out[t0 : t0 + tc] = F.cross_entropy(z, tg, reduction="none").float()
            continue
        lse = torch.full((hc.shape[0],), -torch.inf, device=h.device)
        tgt_logit = torch.zeros(hc.shape[0], device=h.device)
        for v0 in range(0, n_vocab, vc):
            z = _slice_logits(hc, w, b, v0, vc, softcap)  # [tc, vc]
            lse = torch.logaddexp(lse, torch.logsumexp(z, dim=-1))
            hit = (tg >= v0) & (tg < v0 + vc)  # targets whose logit lives in this vocabulary slice
            if hit.any():
                rows = hit.nonzero().squeeze(1)
                tgt_logit[rows] = z[rows, tg[rows] - v0]
        out[t0 : t0 + tc] = lse - tgt_logit
    return out
