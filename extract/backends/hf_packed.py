"""Batch-invariant forward for the hf backend: prompts packed into one token stream, attention per prompt.

Why: in reduced precision a padded batch changes a prompt's numbers. Measured on SmolLM2-135M in bf16 on the
2-core CPU (ARC dev): a prompt scored alone vs in a padded batch differs by up to 0.6 nats on an option
log-prob. Padding changes the attention kernel's key length (its blocking, so its rounding) and the rows of
the LM head's GEMM. Here nothing a prompt computes depends on its batch mates:

- no padding: the batch is ONE sequence [1, T] of the prompts' tokens back to back, position ids restarting
  at 0 for each prompt (RoPE is per position);
- attention runs per prompt (`segment_attention`, registered with transformers' AttentionInterface and
  switched on only inside `packed_decoder`): each prompt's q/k/v slice goes through the model's own attention
  function (SDPA or eager) with exactly the shapes it has alone;
- norms, RoPE, activations and residuals are per token;
- the LM head (option log-probs, prompt NLL) runs per prompt, on that prompt's rows only;
- the decoder's linear layers are ONE GEMM over the T packed tokens. Whether a GEMM row is the same number
  whatever the other rows are is a property of the kernel, not of the math. On the development CPU
  (AVX512-bf16, torch 2.13, oneDNN) bf16 GEMMs gave bit-identical rows for every M >= 2 tried (2..39 and
  block boundaries up to 2048, the model's shapes), while an M = 1 GEMM (a GEMV) reduces in another order
  for K = 1536; MKL's fp32 GEMMs differ between M = 1, 2-3 and >= 7, and GPU libraries pick split-K by M.
  So `linear_rows_invariant` checks it on the model's own linear layers before packing is trusted; where
  it fails, each prompt runs alone (invariant by construction, slower). A stream of 1 token gets a pad
  token so no decoder GEMM is ever a GEMV.

The result of a prompt is then the same bits in any batch mix, as if it ran alone (tests: the tiny model and
SmolLM2, two different mixes, bit for bit). The shared-prefix KV cache is not used: its length depends on
which prompts share a call.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

SEGMENTS_IMPL = "walla_segments"  # the attention implementation name registered below
# rows of the GEMM row-invariance check: every M below 18, and each side of the usual block boundaries
PROBE_ROWS = (*range(2, 18), 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257, 511, 512, 513)

# (prompt lengths of the packed stream, the model's own attention function) while a packed forward runs
_SEGMENTS: contextvars.ContextVar[tuple[tuple[int, ...], Callable] | None] = contextvars.ContextVar(
    "walla_segments", default=None
)


def segment_mask(n: int, window: int | None, device) -> torch.Tensor:
    """Causal (and sliding-window) mask of one prompt alone: [1, 1, n, n] bool, True where a query may attend."""
    q = torch.arange(n, device=device)[:, None]
    k = torch.arange(n, device=device)[None, :]
    allowed = k <= q
    if window:
        allowed &= k > q - window  # transformers' sliding_window_overlay
    return allowed[None, None]


@torch.compiler.disable  # a python loop over prompts: compiled layers break the graph here (no recompiles)
def segment_attention(module, query, key, value, attention_mask, **kwargs):
    """Attention of each packed prompt on its own: [1, H, T, D] q/k/v -> ([1, T, H, D], None)."""
    state = _SEGMENTS.get()
    if state is None:
        raise RuntimeError(f"{SEGMENTS_IMPL} attention called outside a packed forward")
    lengths, inner = state
    if not getattr(module, "is_causal", True):
        raise ValueError(f"{type(module).__name__} is not causal attention; packed scoring needs causal")
    window = kwargs.get("sliding_window")
    outs, start = [], 0
    for n in lengths:
        sl = slice(start, start + n)
        mask = None  # SDPA's causal path, exactly as the prompt alone
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
def packed_decoder(decoder, lengths: Sequence[int], inner: Callable) -> Iterator[None]:
    """Within: `decoder` runs `segment_attention` over the prompts of `lengths` (then its config is restored)."""
    config = decoder.config
    before = config._attn_implementation
    token = _SEGMENTS.set((tuple(int(n) for n in lengths), inner))
    config._attn_implementation = SEGMENTS_IMPL
    try:
        yield
    finally:
        config._attn_implementation = before
        _SEGMENTS.reset(token)


def pack_inputs(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """(input ids [1, T], position ids [1, T], segment lengths) of prompts packed back to back.

    A stream of one token gets a second (pad) segment: the decoder's GEMMs then never have M = 1.
    """
    lengths = [len(s) for s in seqs]
    if min(lengths) < 1:
        raise ValueError("a prompt encoded to zero tokens")
    flat = [t for s in seqs for t in s]
    if len(flat) == 1:
        flat, lengths = flat + [pad_id], lengths + [1]
    pos = torch.cat([torch.arange(n) for n in lengths])
    return torch.tensor([flat]), pos[None], lengths


def plan_packs(lengths: Sequence[int], batch_tokens: int, max_rows: int | None = None) -> list[np.ndarray]:
    """Index packs, longest prompts first, each holding at most `batch_tokens` tokens (a longer prompt alone)
    and at most `max_rows` prompts. Together they cover every row exactly once."""
    if batch_tokens < 1:
        raise ValueError(f"batch_tokens must be >= 1, got {batch_tokens}")
    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.argsort(-lengths, kind="stable")
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


@torch.inference_mode()
def linear_rows_invariant(model, max_rows: int, rows: Sequence[int] = PROBE_ROWS) -> tuple[bool, str]:
    """Does each of the decoder's linear layers give a row the same bits whatever the other rows are?

    Per distinct (in, out) shape, with that layer's weights: random rows X [max_rows, in]; every window of M
    rows (M in `rows`, at the start and at the end of X) must equal the same rows of the full GEMM, bit for
    bit. A sample of M, not a proof for every M: it covers small M, where kernels switch strategies.
    Returns (all equal, one line saying what was checked or where it failed).
    """
    layers: dict[tuple[int, int], torch.nn.Linear] = {}
    for m in model.get_decoder().modules():
        if isinstance(m, torch.nn.Linear):
            layers.setdefault((m.in_features, m.out_features), m)
    gen = torch.Generator().manual_seed(0)
    sizes = [m for m in rows if m < max_rows]
    for (k, n), layer in layers.items():
        w = layer.weight
        x = torch.randn(max_rows, k, generator=gen).to(device=w.device, dtype=w.dtype)
        full = layer(x)
        for m in sizes:
            for start in (0, max_rows - m):
                if not torch.equal(layer(x[start : start + m]), full[start : start + m]):
                    return False, (
                        f"the {k}x{n} linear layer's rows differ between a {m}-row and a {max_rows}-row GEMM "
                        f"({w.dtype}, {w.device}): each prompt runs alone"
                    )
    shapes = ", ".join(f"{k}x{n}" for k, n in layers)
    return (
        True,
        f"linear layers {shapes}: rows bit-identical for M in 2..{max(sizes, default=2)} and {max_rows}",
    )
