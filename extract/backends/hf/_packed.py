"""Batch-invariant forward for the hf backend: prompts packed into one token stream, one attention call.

Why: in reduced precision a padded batch changes a prompt's numbers. Measured on SmolLM2-135M in bf16 on the
2-core CPU (ARC dev): a prompt scored alone vs in a padded batch differs by up to 0.6 nats on an option
log-prob. Padding changes the attention kernel's key length (its blocking, so its rounding: SDPA's CPU flash
kernel picks its splits and packing from the batch's shapes) and the rows of the LM head's GEMM. Here nothing
a prompt computes depends on its batch mates:

- no padding: the batch is ONE sequence [1, T] of the prompts' tokens back to back, position ids restarting
  at 0 (or at the length of a cached shared prefix) for each prompt (RoPE is per position);
- attention (`segment_attention`, registered with transformers' AttentionInterface and switched on only
  inside `packed_decoder`) runs every prompt in one `blocked_attention` call: each prompt's keys (a cached
  prefix, then its own tokens) are reduced in fixed blocks of KEY_BLOCK keys from position 0, in position
  order, so masked keys add exact zeros and a prompt's rows are the same bits in a pack of any width, alone,
  or after a cached prefix of any length; the blocks wholly inside the prefix run once for every query row of
  the pack, the rest per prompt, prompts grouped by length. Where that fails the probe, the fallback runs each
  prompt's q/k/v slice through the model's own attention function (SDPA or eager) with exactly its shapes
  alone, and no prefix is cached;
- norms, RoPE, activations and residuals are per token;
- the LM head runs over the pack's last rows (option log-probs) and, chunked, over all its positions (prompt
  NLL), in calls of at most `lm_head.chunk_rows` rows (the probe's range) and never fewer than `min_rows`;
  a prompt's NLL is the correctly rounded sum of its token NLLs (math.fsum), so it does not depend on where
  its positions fell;
- the decoder's linear layers are ONE GEMM over the T packed tokens. Whether a GEMM row is the same number
  whatever the other rows are is a property of the kernel, not of the math: on the development CPU
  (AVX512-bf16, torch 2.13, oneDNN) bf16 GEMMs gave bit-identical rows for every M tried; MKL's fp32 GEMMs
  differ between M = 1, 2-3 and >= 7, and GPU libraries pick split-K by M. So `linear_rows_invariant` finds,
  on the model's own linear layers and LM head, the row count from which rows agree (`min_rows`, streams
  shorter than that get a pad segment; never fewer than 2); where no small count does, each prompt runs
  alone (invariant by construction, slower).

The result of a prompt is then the same bits in any batch mix (tests: the tiny model and SmolLM2, two
different mixes and alone, bit for bit; hf_checks.probe_packed checks it at load on the model itself).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from walla.extract.backends.hf import _lm_head as lm_head
from walla.extract.scoring import longest_first

SEGMENTS_IMPL = "walla_segments"  # the attention implementation name registered below
# rows of the GEMM row-invariance check: every M below 18 (1 too: a GEMV), and each side of the usual block boundaries
PROBE_ROWS = (*range(1, 18), 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257, 511, 512, 513)

KEY_BLOCK = 64  # keys per block of `blocked_attention`: sums run per block, blocks start at position 0
ATTENTION_VERSION = 3  # of blocked_attention's numerics: in the packed probe's cache key (bump on any change)
SCORE_ELEMS = 1 << 24  # float32 attention scores per group of prompts in blocked_attention (64 MiB)
MIN_GEMM_ROWS = 8  # fewest rows of blocked_attention's float32 GEMMs (MKL's rows differed at M <= 3)
GROUP_SHORTEST = 0.75  # a group of prompts holds none shorter than this share of its longest (padding)


@dataclass(frozen=True)
class Segments:
    """What a packed forward's attention needs to know: the prompts' lengths in the stream, the length of a
    shared prefix in the KV cache before them, the model's own attention function, and whether to run all
    prompts in one `blocked_attention` call (else one `inner` call per prompt)."""

    lengths: tuple[int, ...]
    inner: Callable
    prefix: int = 0
    batched: bool = False


# the Segments of the packed forward that is running, if one is
_SEGMENTS: contextvars.ContextVar[Segments | None] = contextvars.ContextVar("walla_segments", default=None)


def segment_mask(n: int, window: int | None, device) -> torch.Tensor:
    """Causal (and sliding-window) mask of one prompt alone: [1, 1, n, n] bool, True where a query may attend."""
    q = torch.arange(n, device=device)[:, None]
    k = torch.arange(n, device=device)[None, :]
    allowed = k <= q
    if window:
        allowed &= k > q - window  # transformers' sliding_window_overlay
    return allowed[None, None]


def blocked_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    lengths: Sequence[int],
    prefix: int = 0,
    scaling: float | None = None,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Causal attention of every packed prompt in one pass, each prompt's numbers independent of the others.

    query [1, Hq, T, D] holds the prompts' tokens back to back (`lengths`, summing to T); key/value
    [1, Hkv, prefix + T, D] hold `prefix` shared cached positions, then the same stream. Returns [1, T, Hq, D].

    Keys are reduced in blocks of KEY_BLOCK from position 0 (the prefix, then the prompt's own tokens), in
    float32: per query row, scores q.k (K = head size), masked keys -inf (exp gives exact zeros), the row
    maximum (exact in any order), then the softmax sum and the value product of each block (a 64-key sum and a
    GEMM with K = 64), added block after block in position order. Blocks wholly inside the cached prefix are
    the same keys for every prompt: their scores and value products run once for all query rows (one GEMM per
    kv head); the rest (the block the prefix ends in, then the prompt's own tokens) runs per prompt, prompts
    grouped by length so little of that GEMM is padding. A block past a prompt's end adds exact zeros.

    Why a prompt's rows are the same bits in any pack, alone, or after a cached prefix of any length: every
    number of a row comes from the same operations on the same operands in the same order; only the GEMMs'
    row counts (M) and the other rows differ, and float32 batched GEMMs of M >= MIN_GEMM_ROWS rows gave each
    row the same bits on the development CPU (K = 64 and head size; M <= 3 did not). That the kernels behave
    this way on the machine at hand is checked at load (hf_checks.packed_invariant).
    """
    _, hq, t, d = query.shape
    hkv = key.shape[1]
    if key.shape[2] != prefix + t:  # e.g. a sliding-window layer's cache kept only its window of the prefix
        raise ValueError(f"blocked attention: {key.shape[2]} keys for a {prefix}-token prefix and {t} tokens")
    g, dev, blk = hq // hkv, query.device, KEY_BLOCK
    scale = scaling if scaling is not None else d**-0.5
    lens = [int(x) for x in lengths]
    # shared blocks: whole blocks of the prefix (none where a sliding window would mask some for some queries)
    p0 = prefix // blk * blk if not (window and prefix + max(lens) > window) else 0
    qf = torch.empty(hkv, t, g, d, dtype=torch.float32, device=dev)  # [Hkv, T, G, D] rows (token, group)
    qf.copy_(query[0].view(hkv, g, t, d).transpose(1, 2))
    kf, vf = key[0].float(), value[0].float()  # [Hkv, P+T, D]
    k_pre, v_pre = kf[:, :p0].transpose(1, 2), vf[:, :p0]  # [Hkv, D, p0], [Hkv, p0, D]
    out = torch.empty(t, hkv, g, d, dtype=query.dtype, device=dev)  # [T, Hkv, G, D]
    for idx, lq, _lt, q_idx, k_idx, real, out_rows, blocks in _attention_plan(
        tuple(lens), prefix, p0, hq, g, window, str(dev)
    ):
        s = len(idx)
        q = qf[:, q_idx]  # [Hkv, s, Lq, G, D]
        rows = s * lq * g
        kt, vt = kf[:, k_idx], vf[:, k_idx]  # [Hkv, s, Lt, D]
        q4 = q.view(hkv, s, lq * g, d)
        # per-prompt key blocks from p0: (first query row that sees any of its keys, its scores); rows before
        # that one would only add exact zeros (all masked), so they are left out of its GEMMs
        own, top = [], None
        for b0, j0, masked in blocks:
            sc = torch.matmul(
                q4[:, :, j0 * g :], kt[:, :, b0 : b0 + blk].transpose(-1, -2)
            )  # [Hkv, s, r, blk]
            sc.mul_(scale)
            if softcap:
                sc = torch.tanh(sc / softcap) * softcap
            sc.view(hkv, s, lq - j0, g, blk).masked_fill_(masked, -torch.inf)
            m = sc.amax(-1)  # [Hkv, s, r]
            if top is None:  # j0 = 0 in the first block
                top = m
            else:
                torch.maximum(top[:, :, j0 * g :], m, out=top[:, :, j0 * g :])
            own.append((j0, sc))
        if p0:
            shared = torch.matmul(q.view(hkv, rows, d), k_pre)  # [Hkv, R, p0]
            shared.mul_(scale)
            if softcap:
                shared = torch.tanh(shared / softcap) * softcap
            top = torch.maximum(top, shared.amax(-1).view(hkv, s, lq * g))
            e_pre = shared.sub_(top.view(hkv, rows, 1)).exp_()  # [Hkv, R, p0]
        total = torch.empty(hkv, s, lq * g, 1, device=dev)  # softmax denominators
        acc = torch.empty(hkv, s, lq * g, d, device=dev)  # sums of e * v
        for b0 in range(0, p0, blk):  # position order, fixed block shapes
            e = e_pre[..., b0 : b0 + blk]  # [Hkv, R, blk]
            part = torch.matmul(e, v_pre[:, b0 : b0 + blk]).view(acc.shape)  # [Hkv, s, Lq*G, D]
            if b0 == 0:
                total.copy_(e.sum(-1, keepdim=True).view(total.shape))
                acc.copy_(part)
            else:
                total += e.sum(-1, keepdim=True).view(total.shape)
                acc += part
        for i, (j0, sc) in enumerate(own):
            e = sc.sub_(top[:, :, j0 * g :, None]).exp_()  # [Hkv, s, r, blk] 0 where masked
            part = torch.matmul(e, vt[:, :, i * blk : (i + 1) * blk])  # [Hkv, s, r, D]
            if i == 0 and not p0:
                total.copy_(e.sum(-1, keepdim=True))
                acc.copy_(part)
            else:
                total[:, :, j0 * g :] += e.sum(-1, keepdim=True)
                acc[:, :, j0 * g :] += part
        o = (acc / total).view(hkv, s, lq, g, d).to(query.dtype)  # [Hkv, s, Lq, G, D]
        out[out_rows] = o.permute(1, 2, 0, 3, 4)[real]  # [real rows, Hkv, G, D] back to their stream index
    return out.view(1, t, hq, d)  # [1, T, Hq, D]


@functools.lru_cache(maxsize=8)
def _attention_plan(
    lens: tuple[int, ...], prefix: int, p0: int, hq: int, g: int, window: int | None, dev: str
):
    """blocked_attention's index work for one pack, which every layer of a forward repeats (computed once per
    layer kind: the cache holds a full-attention and a sliding-window plan). Per length group: (prompts, query
    rows Lq, keys Lt from p0, query stream index [s, Lq], key index [s, Lt], real query rows [s, Lq], their
    stream indices, and per key block from p0 (b0, first query row that sees it, masked [Lq - j0, 1, blk]))."""
    blk = KEY_BLOCK
    starts = np.cumsum([0, *lens[:-1]])
    plan = []
    for idx, lq in _length_groups(lens, hq * (prefix - p0 + blk) + hq * p0):
        lq = max(lq, -(-MIN_GEMM_ROWS // g))  # per-prompt GEMMs of at least MIN_GEMM_ROWS rows
        lt = -(-(prefix - p0 + lq) // blk) * blk  # per-prompt keys from p0: a whole number of blocks
        n = torch.tensor([lens[i] for i in idx], device=dev)[:, None]  # [s, 1]
        st = torch.tensor(starts[idx], device=dev)[:, None]  # [s, 1]
        j = torch.arange(lq, device=dev)[None]  # [1, Lq]
        real = j < n  # [s, Lq]
        q_idx = torch.where(real, st + j, 0)  # [s, Lq] stream index of each query row (pad rows: any)
        c = torch.arange(lt, device=dev)[None]  # [1, Lt]
        k_idx = torch.where(p0 + c < prefix, p0 + c, prefix + st + (p0 + c - prefix))  # [s, Lt]
        k_idx = torch.where(p0 + c < prefix + n, k_idx, 0)  # past a prompt's end: any key (masked)
        pos_q = (prefix + j[0])[:, None]  # [Lq, 1] absolute position of each query row
        blocks = []
        for b0 in range(0, lt, blk):
            j0 = min(max(0, p0 + b0 - prefix), lq - -(-MIN_GEMM_ROWS // g))
            key_pos = p0 + b0 + torch.arange(blk, device=dev)[None]  # [1, blk]
            allowed = key_pos <= pos_q[j0:]  # [Lq - j0, blk]
            if window:
                allowed &= key_pos > pos_q[j0:] - window
            blocks.append((b0, j0, ~allowed[:, None]))
        plan.append((idx, lq, lt, q_idx, k_idx, real, q_idx[real], tuple(blocks)))
    return tuple(plan)


def _length_groups(lengths: Sequence[int], elems_per_row: int) -> Iterator[tuple[np.ndarray, int]]:
    """(prompt indices, longest length) of groups of prompts of similar length, longest first: a group's query
    rows are padded to its longest, so a group stops before a prompt shorter than GROUP_SHORTEST of it (or at
    SCORE_ELEMS float32 scores). Grouping changes only GEMM row counts, never a prompt's numbers."""
    lens = np.asarray(lengths)
    order = np.argsort(-lens, kind="stable")
    start = 0
    while start < len(order):
        lq = int(lens[order[start]])
        end = start + 1
        cap = max(1, SCORE_ELEMS // max(1, lq * elems_per_row))
        while end < len(order) and end - start < cap and lens[order[end]] >= GROUP_SHORTEST * lq:
            end += 1
        yield order[start:end], lq
        start = end


def forward_state(var: contextvars.ContextVar, module, impl: str, what: str):
    """What a walla attention function `impl` reads from `var` for `module`, set by the `what` forward
    around it (packed, fixed-shape); one line naming the misuse when there is none or `module` is not
    causal attention."""
    state = var.get()
    if state is None:
        raise RuntimeError(f"{impl} attention called outside a {what} forward")
    if not getattr(module, "is_causal", True):
        raise ValueError(f"{type(module).__name__} is not causal attention; {what} scoring needs causal")
    return state


@torch.compiler.disable  # a python loop over prompts: compiled layers break the graph here (no recompiles)
def segment_attention(module, query, key, value, attention_mask, **kwargs):
    """Attention of each packed prompt on its own: [1, H, T, D] q/k/v -> ([1, T, H, D], None)."""
    state = forward_state(_SEGMENTS, module, SEGMENTS_IMPL, "packed")
    window = kwargs.get("sliding_window")
    if state.batched:
        scaling, softcap = kwargs.get("scaling"), kwargs.get("softcap")
        return blocked_attention(
            query, key, value, state.lengths, state.prefix, scaling, window, softcap
        ), None
    if state.prefix:
        raise ValueError("per-prompt packed attention does not read a cached prefix")
    outs, start = [], 0
    for n in state.lengths:
        sl = slice(start, start + n)
        mask = None  # SDPA's causal path, exactly as the prompt alone
        inner = state.inner
        if inner is not sdpa_attention_forward or (window and n > window):
            mask = segment_mask(n, window, query.device)
            if inner is not sdpa_attention_forward:  # eager attention adds a float mask
                mask = torch.zeros(mask.shape, dtype=query.dtype, device=query.device).masked_fill(
                    ~mask, torch.finfo(query.dtype).min
                )
        out, _ = inner(module, query[:, :, sl], key[:, :, sl], value[:, :, sl], mask, **kwargs)
        outs.append(out)  # [1, n, H, D]
        start += n
    return torch.cat(outs, dim=1), None


AttentionInterface.register(SEGMENTS_IMPL, segment_attention)


def own_attention(model) -> Callable:
    """The attention function the model runs with its configured implementation (sdpa, or its file's eager)."""
    decoder = model.get_decoder()
    impl = decoder.config._attn_implementation  # the config packed_decoder switches
    if impl == "sdpa":
        return sdpa_attention_forward
    if impl in (None, "eager"):
        eager = getattr(inspect.getmodule(type(decoder)), "eager_attention_forward", None)
        if eager is None:
            raise ValueError(f"{type(model).__name__}: no eager_attention_forward found for packed scoring")
        return eager
    raise ValueError(f"packed scoring supports sdpa or eager attention, not {impl!r}")


@contextlib.contextmanager
def packed_decoder(
    decoder, lengths: Sequence[int], inner: Callable, prefix: int = 0, batched: bool = False
) -> Iterator[None]:
    """Within: `decoder` runs `segment_attention` over the prompts of `lengths` (then its config is restored)."""
    config = decoder.config
    before = config._attn_implementation
    token = _SEGMENTS.set(Segments(tuple(int(n) for n in lengths), inner, int(prefix), batched))
    config._attn_implementation = SEGMENTS_IMPL
    try:
        yield
    finally:
        config._attn_implementation = before
        _SEGMENTS.reset(token)


def pack_inputs(
    seqs: Sequence[Sequence[int]], pad_id: int, min_rows: int = 2, offset: int = 0
) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """(input ids [1, T], position ids [1, T], segment lengths) of prompts packed back to back.

    A stream shorter than `min_rows` tokens gets one more (pad) segment up to that length: the decoder's GEMMs
    then never have fewer rows than the row-invariance probe verified (M = 1 is a GEMV, rounded otherwise).
    Positions start at `offset` in every prompt (the length of a cached shared prefix).
    """
    lengths = [len(s) for s in seqs]
    if min(lengths) < 1:
        raise ValueError("a prompt encoded to zero tokens")
    flat = [t for s in seqs for t in s]
    if len(flat) < min_rows:
        pad = min_rows - len(flat)
        flat, lengths = flat + [pad_id] * pad, lengths + [pad]
    pos = torch.cat([torch.arange(offset, offset + n) for n in lengths])
    return torch.tensor([flat]), pos[None], lengths


def plan_packs(lengths: Sequence[int], batch_tokens: int, max_rows: int | None = None) -> list[np.ndarray]:
    """Index packs, longest prompts first, each holding at most `batch_tokens` tokens (a longer prompt alone)
    and at most `max_rows` prompts. Together they cover every row exactly once."""
    lengths, order = longest_first(lengths, batch_tokens)
    packs: list[np.ndarray] = []
    start = 0
    while start < len(order):
        end, used = start, 0
        while end < len(order) and (end == start or used + lengths[order[end]] <= batch_tokens):
            if max_rows and end - start >= max_rows:
                break
            used += int(lengths[order[end]])
            end += 1
        packs.append(order[start:end])
        start = end
    return packs


MAX_MIN_ROWS = 16  # a GEMM whose rows agree only from more rows than this is treated as not row-invariant


def probed_linears(
    model, vocab_chunk: int = lm_head.VOCAB_CHUNK
) -> dict[tuple, tuple[Callable, torch.Tensor, bool]]:
    """(how the forward runs it, weight, is the LM head) of one decoder linear layer per distinct (in, out)
    shape, and of the LM head as the scoring paths apply it (lm_head.logits: `h @ w.T`; for a vocabulary
    larger than `vocab_chunk`, token_nll's slices of `vocab_chunk` rows too)."""
    layers: dict[tuple, tuple[Callable, torch.Tensor, bool]] = {}
    for m in model.get_decoder().modules():
        if isinstance(m, torch.nn.Linear):
            layers.setdefault((m.in_features, m.out_features), (m, m.weight, False))
    head = model.get_output_embeddings()
    if head is not None:
        w, b = head.weight, getattr(head, "bias", None)
        layers[(w.shape[1], w.shape[0], "head")] = (lambda x: lm_head.logits(x, w, b), w, True)
        if w.shape[0] > vocab_chunk:
            ws, bs = w[:vocab_chunk], None if b is None else b[:vocab_chunk]
            layers[(w.shape[1], vocab_chunk, "head slice")] = (lambda x: lm_head.logits(x, ws, bs), ws, True)
    return layers


def probe_windows(rows: Sequence[int], top: int) -> list[tuple[int, int]]:
    """(start, M) of the windows of a `top`-row probe GEMM that linear_rows_invariant compares, largest M first:
    every M of `rows` below `top` at the end of X (rows that sit at another offset of the full GEMM's blocking,
    unaligned for most M), and those below MAX_MIN_ROWS + 1 at the start too (at offset 0 of both GEMMs: where
    kernels switch strategies, GEMV and small-M paths, each M is cheap). One window per larger M halves the
    probe's cost (the LM head's rows dominate it: Gemma-3's 262k vocabulary) and still runs each M."""
    ms = sorted({r for r in rows if r < top}, reverse=True)
    return [(s, m) for m in ms for s in ((0, top - m) if m <= MAX_MIN_ROWS else (top - m,))]


@torch.inference_mode()
def linear_rows_invariant(
    model,
    max_rows: int,
    rows: Sequence[int] = PROBE_ROWS,
    head_rows: int | None = None,
    vocab_chunk: int = lm_head.VOCAB_CHUNK,
) -> tuple[bool, int, str]:
    """Does each of the model's linear layers (decoder and LM head) give a row the same bits whatever the other
    rows are, from some small row count on?

    Per distinct (in, out) shape, with that layer's weights, run as the forward runs it: random rows
    X [top, in], top = the most rows a call of it has: `max_rows` (a packed stream's tokens) for the decoder's,
    `head_rows` (default: lm_head.chunk_rows of the CPU constants) for the LM head, whose calls are that small
    (NLL chunks and option rows alike; at least MAX_MIN_ROWS + 1). Each window of M rows (probe_windows: M in
    `rows`) is compared with the same rows of the full GEMM, bit for bit. A sample of M, not a proof for every
    M: it covers small M, where kernels switch strategies (M = 1 is a GEMV; MKL's float32 kernels change again
    at a few rows), and each side of the usual block sizes. Returns (invariant, min_rows: the smallest M from
    which every tested M agrees, one line saying what was checked or where it failed).
    """
    gen = torch.Generator().manual_seed(0)
    min_rows, checked = 1, []
    for shape, (run, w, is_head) in probed_linears(model, vocab_chunk).items():
        k, n = shape[0], shape[1]
        head_top = head_rows if head_rows is not None else lm_head.chunk_rows(n, vocab_chunk=vocab_chunk)
        top = min(max_rows, max(head_top, MAX_MIN_ROWS + 1)) if is_head else max_rows
        x = torch.randn(top, k, generator=gen).to(device=w.device, dtype=w.dtype)
        full = run(x)
        failed = next(  # largest M first: the first failure is the largest M that fails
            (m for s, m in probe_windows(rows, top) if not torch.equal(run(x[s : s + m]), full[s : s + m])),
            None,
        )
        if failed is not None:
            min_rows = max(min_rows, failed + 1)
            if min_rows > MAX_MIN_ROWS:
                what = "LM head" if is_head else "linear layer"
                return (
                    False,
                    min_rows,
                    (
                        f"the {k}x{n} {what}'s rows differ between a {failed}-row and a {top}-row GEMM ({w.dtype}, "
                        f"{w.device}): each prompt runs alone"
                    ),
                )
        checked.append(f"{k}x{n}{f' ({shape[2]}, up to {top} rows)' if is_head else ''}")
    return (
        True,
        min_rows,
        (f"linear layers {', '.join(checked)}: rows bit-identical for every tested M from {min_rows} up"),
    )
