"""Batch-invariant scoring by fixed shapes: every kernel sees the same shapes whatever the batch mix.

Why: hf/packed.py's packed stream is batch-invariant only where the GEMMs give a row the same bits for any
row count (true for oneDNN bf16 on the CPU). cuBLAS picks its kernel (tiles, split-K) by M, so on CUDA that
probe fails and every prompt runs alone (11.3x the padded run on an H200, issue 31). Here the shapes never
change, so no library can pick another kernel ("batch invariance at the cost of padded batches"):

- every forward is ONE stream of exactly `pack_tokens` (P) tokens, [1, P] (a prompt longer than P runs alone
  in a stream of its length rounded up to a multiple of P): the decoder's GEMMs, norms, RoPE, activations
  all see one shape, so a row's bits depend on that row only;
- each prompt starts at a multiple of QUANTUM (Q) tokens in the stream (pad tokens fill the gaps and the
  tail); the stream is cut into P/Q query blocks, and `fixed_attention` lets every query block attend to the
  KEY_BLOCKS key blocks before it (relative to itself, so the same blocks of its own prompt in any mix), in
  steps of one batched matmul of fixed shape [Hkv*P/Q, G*Q, D] x [Hkv*P/Q, D, KEY_BLOCKS*Q] (the keys a
  strided view, no copy) with float32 scores (`attention_matmul`: reduced-precision inputs with exact
  products where the device has the mixed-dtype kernel, CUDA; float32 elsewhere), with an online softmax in
  the fixed order nearest keys first. Keys outside the prompt are masked (-inf, so
  exact zeros), and a step whose keys are all masked multiplies by exp(0) = 1 and adds zeros: a prompt's rows
  are the same bits whichever prompts share the stream and however many steps the longest of them needs;
- the LM head runs on OPTION_ROWS rows per call (the prompts' last rows, zero-padded) and the prompt NLL on
  NLL_ROWS rows per chunk (the last chunk zero-padded); a prompt's NLL is the correctly rounded sum
  (math.fsum) of its token NLLs.

That the kernels give the same bits this way is checked at load on the model itself (hf/fixed_probe.py);
where they do not, each prompt runs alone in its own stream of P tokens (still the same bits as alone, slow).
The constants are recorded in the fingerprint (`fixed_identity`): they decide the bits.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from walla.extract.backends import ScoreResult
from walla.extract.backends.hf import _lm_head as lm_head
from walla.extract.backends.hf import _packed as hf_packed
from walla.extract.scoring import run_groups

FIXED_IMPL = "walla_fixed"  # the attention implementation name registered below
FIXED_SCORING = (
    "fixed-v3"  # version of these numerics (the fingerprint's invariant_scoring): bump on any change
)
PACK_TOKENS = 8192  # P: tokens of every forward (not sized from free memory: the fingerprint records it)
QUANTUM = 16  # Q: prompts start at multiples of Q tokens; attention runs in blocks of Q queries and Q keys
KEY_BLOCKS = 8  # key blocks of Q keys per attention step (one matmul of KEY_BLOCKS * Q keys)
OPTION_ROWS = 256  # rows of every option LM-head call
NLL_ROWS = 1024  # rows of every prompt-NLL LM-head chunk


def fixed_identity(device_type: str, dtype: torch.dtype, pack_tokens: int = PACK_TOKENS) -> dict:
    """What decides the bits of fixed-shape scoring besides the model and dtype (in the fingerprint)."""
    return {
        "pack_tokens": int(pack_tokens),
        "attention_matmul": str(attention_matmul(device_type, dtype)).removeprefix("torch."),
        "quantum": QUANTUM,
        "key_blocks": KEY_BLOCKS,
        "option_rows": OPTION_ROWS,
        "nll_rows": NLL_ROWS,
    }


def check_pack_tokens(pack_tokens: int) -> int:
    if pack_tokens < QUANTUM or pack_tokens % QUANTUM:
        raise ValueError(f"pack_tokens must be a positive multiple of {QUANTUM}, got {pack_tokens}")
    return int(pack_tokens)


def aligned(n: int) -> int:
    """Tokens a prompt of n tokens takes in the stream: n rounded up to a multiple of QUANTUM."""
    return -(-n // QUANTUM) * QUANTUM


@dataclass(frozen=True)
class Layout:
    """Where each prompt of one fixed-shape forward sits in its stream."""

    ids: (
        torch.Tensor
    )  # [1, L] token ids, pads between prompts and at the tail; L = P, or k * P for one long prompt
    pos: torch.Tensor  # [1, L] position ids: 0.. within each prompt, 0 at pads
    starts: list[int]  # stream index of each prompt's first token (multiples of QUANTUM)
    lengths: list[int]  # tokens of each prompt
    block_start: (
        torch.Tensor
    )  # [L / Q] first block of the prompt each block belongs to (a tail pad block: itself)
    span: int  # blocks of the longest prompt (how far back any query block attends)


def layout(seqs: Sequence[Sequence[int]], pad_id: int, pack_tokens: int) -> Layout:
    """The stream of one fixed-shape forward: prompts at multiples of QUANTUM, padded to `pack_tokens`.

    Raises:
        ValueError: an empty prompt, or several prompts that do not fit in `pack_tokens`.
    """
    lengths = [len(s) for s in seqs]
    if not lengths or min(lengths) < 1:
        raise ValueError("a prompt encoded to zero tokens")
    used = sum(aligned(n) for n in lengths)
    if used > pack_tokens and len(seqs) > 1:
        raise ValueError(f"{len(seqs)} prompts take {used} tokens, more than a pack of {pack_tokens}")
    total = -(-used // pack_tokens) * pack_tokens
    ids = torch.full((total,), pad_id, dtype=torch.long)
    pos = torch.zeros(total, dtype=torch.long)
    block_start = torch.arange(total // QUANTUM)
    starts, cursor = [], 0
    for s in seqs:
        n = len(s)
        ids[cursor : cursor + n] = torch.tensor(list(s), dtype=torch.long)
        pos[cursor : cursor + n] = torch.arange(n)
        b0 = cursor // QUANTUM
        block_start[b0 : b0 + aligned(n) // QUANTUM] = b0
        starts.append(cursor)
        cursor += aligned(n)
    span = max(aligned(n) for n in lengths) // QUANTUM
    return Layout(ids[None], pos[None], starts, lengths, block_start, span)


def plan(lengths: Sequence[int], pack_tokens: int, max_rows: int | None = None) -> list[np.ndarray]:
    """Index packs, longest prompts first, whose aligned lengths fit in `pack_tokens` (a longer prompt alone),
    at most `max_rows` prompts each; together they cover every row once."""
    return hf_packed.plan_packs([aligned(int(n)) for n in lengths], pack_tokens, max_rows)


@dataclass
class _Stream:
    """What fixed_attention needs of the running forward; masks are built once per window and reused by every
    layer."""

    block_start: torch.Tensor  # [nb] on the model's device
    span: int
    masks: dict = field(
        default_factory=dict
    )  # window -> per step: [nb, Q, KEY_BLOCKS * Q] bool, True = masked
    compiled: bool = False  # the decoder layers are compiled: so are the attention steps (compiled_steps)


_STREAM: contextvars.ContextVar[_Stream | None] = contextvars.ContextVar("walla_fixed", default=None)


def steps(span: int, window: int | None) -> int:
    """Attention steps (of KEY_BLOCKS key blocks) that can hold an allowed key: the prompt's span, and no
    further back than the sliding window reaches (a query at offset i of its block and a key d blocks back
    are at least d*Q - (Q-1) apart)."""
    n = -(-span // KEY_BLOCKS)
    if window:
        n = min(n, ((window + QUANTUM - 2) // QUANTUM) // KEY_BLOCKS + 1)
    return max(n, 1)


def step_masks(block_start: torch.Tensor, n_steps: int, window: int | None) -> list[torch.Tensor]:
    """For each step c: [nb, Q, KEY_BLOCKS*Q] bool, True where query i of block qb may attend key slot s (key
    block qb - c*KEY_BLOCKS - (KEY_BLOCKS-1) + s // Q, key s % Q): same prompt, causal, inside the window."""
    nb, q, w = block_start.shape[0], QUANTUM, KEY_BLOCKS
    dev = block_start.device
    qb = torch.arange(nb, device=dev)[:, None, None]  # [nb, 1, 1]
    i = torch.arange(q, device=dev)[None, :, None]  # [1, Q, 1]
    s = torch.arange(w * q, device=dev)[None, None, :]  # [1, 1, WQ]
    out = []
    for c in range(n_steps):
        back = c * w + (w - 1) - s // q  # [1, 1, WQ] blocks between the query block and the key block
        gap = back * q + i - s % q  # [1, Q, WQ] query position - key position
        ok = (qb - back >= block_start[:, None, None]) & (gap >= 0)
        if window:
            ok &= gap < window
        out.append(ok)
    return out


def attention_matmul(device_type: str, dtype: torch.dtype) -> torch.dtype:
    """Input dtype of fixed_attention's two matmuls: the model's reduced dtype where the device has torch's
    mixed-dtype batched matmul (`bmm(..., out_dtype=float32)`: exact products, float32 sums and scores, as
    flash attention computes them; CUDA), else float32. Decided from the build, never by running a kernel,
    so the fingerprint can record it before the model loads."""
    if dtype in (torch.bfloat16, torch.float16) and torch._C._dispatch_has_kernel_for_dispatch_key(
        "aten::bmm.dtype", device_type.upper()
    ):
        return dtype
    return torch.float32


def _bmm32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b (batched) with float32 results: float32 inputs as they are, reduced ones by out_dtype."""
    if a.dtype == torch.float32:
        return torch.bmm(a, b)
    return torch.bmm(a, b, out_dtype=torch.float32)


def _windows(x: torch.Tensor, pad: int, mm: torch.dtype) -> torch.Tensor:
    """[1, Hkv, L, D] keys or values -> one flat [pad + Hkv*L, D] buffer of dtype `mm`, `pad` zero rows first.

    Step c's keys of query block b (head-major, b = h * L/Q + qb) are then the W*Q rows from row
    b*Q + (n_steps - 1 - c)*W*Q of this buffer: a strided view (`as_strided`) with no copy, where a gather
    wrote W copies of every key. Rows before a head's own (the zero pad, or the previous head's last keys)
    are masked, so they add exact zeros."""
    _, hkv, length, d = x.shape
    buf = x.new_zeros(pad + hkv * length, d, dtype=mm)
    buf[pad:].view(hkv, length, d).copy_(x[0])
    return buf


def fixed_attention_core(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    stream: _Stream,
    scaling: float | None = None,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Causal attention of a fixed-shape stream: q [1, Hq, L, D], k/v [1, Hkv, L, D] -> [1, L, Hq, D].

    The step masks are built once per forward and window (every layer reuses them); `attend` does the rest,
    its steps compiled where the stream's forward is (`_Stream.compiled`: the decoder layers are compiled).
    """
    length = query.shape[2]
    if key.shape[2] != length or length % QUANTUM:
        raise ValueError(f"fixed attention: {key.shape[2]} keys for {length} queries (blocks of {QUANTUM})")
    masks = stream.masks.get(window)
    if masks is None:  # once per forward and window, for every layer
        n_steps = steps(stream.span, window)
        masks = stream.masks[window] = [~x for x in step_masks(stream.block_start, n_steps, window)]
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    mm = attention_matmul(query.device.type, query.dtype)
    return attend(query, key, value, masks, scale, softcap, mm, compiled=stream.compiled)


def attend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    masks: list[torch.Tensor],
    scale: float,
    softcap: float | None,
    mm: torch.dtype,
    compiled: bool = False,
) -> torch.Tensor:
    """fixed_attention_core's arithmetic over len(masks) key steps (`masks[c]`: [nb, Q, W*Q], True = masked).

    Fixed shapes whatever the prompts: every step is one batched matmul over all Hkv * L/Q query blocks (the
    G query heads of a kv head and Q positions as G*Q rows) against W*Q keys; a prompt's scores and sums do
    not depend on the other blocks (module docstring). Step 0 starts the online softmax (sums of exp(score -
    max)); a later step rescales by exp(old max - new max), which is exactly 1 and adds exact zeros for a row
    whose keys in that step are all masked, so a prompt's bits do not depend on how many steps its pack needs.
    `compiled`: each step through one compiled graph (compiled_steps), so any step count runs the same graphs.
    """
    _, hq, length, d = query.shape
    hkv = key.shape[1]
    g, q, w = hq // hkv, QUANTUM, KEY_BLOCKS
    nb, n_steps = length // q, len(masks)
    b, pad = hkv * nb, (n_steps * w - 1) * q
    qf = query[0].reshape(hkv, g, nb, q, d).transpose(1, 2).reshape(b, g * q, d).to(mm)  # [B, G*Q, D]
    kf, vf = _windows(key, pad, mm), _windows(value, pad, mm)
    factor = 1.0 if softcap else scale  # applied to (score - max): one pass fewer than scaling the scores
    first, later, finish = compiled_steps() if compiled else (first_step, later_step, finish_steps)
    state = ()
    try:
        for c in range(n_steps):  # nearest keys first, a fixed order
            offset = (n_steps - 1 - c) * w * q * d
            kc = kf.as_strided((b, w * q, d), (q * d, d, 1), offset)  # [B, W*Q, D], a view
            vc = vf.as_strided((b, w * q, d), (q * d, d, 1), offset)
            step = later if c else first
            state = step(qf, kc, vc, masks[c], *state, scale=scale, factor=factor, softcap=softcap)
        return finish(state[2], state[1], hkv, query.dtype)
    except torch._dynamo.exc.FailOnRecompileLimitHit as e:  # compiled_steps' fullgraph: never eager instead
        raise RuntimeError(
            f"fixed-shape attention: a stream of {length:,} tokens is one shape more than torch.compile's "
            f"recompile limit ({torch._dynamo.config.recompile_limit}) allows, and running it eager would give "
            "other bits; rerun with --backend-arg compile=off (eager attention, the same bits for every shape)"
        ) from e


def _step_scores(qf, kc, mask, scale: float, softcap: float | None) -> torch.Tensor:
    """One step's float32 scores [B, G*Q, W*Q], -inf where `mask` ([nb, Q, W*Q]) is True."""
    b, gq, _ = qf.shape
    nb, q, wq = mask.shape
    s = _bmm32(qf, kc.transpose(1, 2))
    if softcap:
        s = torch.tanh(s * (scale / softcap)) * softcap
    return s.view(b // nb, nb, gq // q, q, wq).masked_fill(mask[None, :, None], -torch.inf).view(b, gq, wq)


def first_step(qf, kc, vc, mask, *, scale: float, factor: float, softcap: float | None):
    """Step 0 of the online softmax: (max, sum of exp, exp-weighted values); every row sees its own key here."""
    s = _step_scores(qf, kc, mask, scale, softcap)
    m = s.amax(-1, keepdim=True)
    e = ((s - m) * factor).exp()  # exact zeros where masked
    return m, e.sum(-1, keepdim=True), _bmm32(e.to(kc.dtype), vc)  # acc: [B, G*Q, D]


def later_step(qf, kc, vc, mask, m, total, acc, *, scale: float, factor: float, softcap: float | None):
    """A later step: rescale what came before by exp(old max - new max) (exactly 1 where this step's keys are
    all masked: then it adds exact zeros) and add this step's keys."""
    s = _step_scores(qf, kc, mask, scale, softcap)
    m_new = torch.maximum(m, s.amax(-1, keepdim=True))  # a step with no allowed key: m_new = m
    alpha = ((m - m_new) * factor).exp()  # 1 exactly where nothing changed
    e = ((s - m_new) * factor).exp()
    return m_new, total * alpha + e.sum(-1, keepdim=True), acc * alpha + _bmm32(e.to(kc.dtype), vc)


def finish_steps(acc: torch.Tensor, total: torch.Tensor, hkv: int, dtype: torch.dtype) -> torch.Tensor:
    """[Hkv*nb, G*Q, D] sums -> attention output [1, L, Hq, D] in the model's dtype."""
    b, gq, d = acc.shape
    nb, q = b // hkv, QUANTUM
    out = (acc / total).view(hkv, nb, gq // q, q, d).permute(1, 3, 0, 2, 4)  # [nb, Q, Hkv, G, D]
    return out.reshape(1, nb * q, hkv * gq // q, d).to(dtype)


@functools.cache  # made at the first compiled forward, then reused
def compiled_steps():
    """(first_step, later_step, finish_steps) through torch.compile with static shapes: one graph each per stream
    shape, softcap and dtype, whatever the step count (a loop compiled whole would unroll into one graph per
    count: a 9,000-token prompt has 71 steps, and past dynamo's recompile limit a count would silently run
    eager, with other bits). Inductor fuses each step's mask, max, exp and sum into a few kernels where eager
    torch runs ~8 passes over the float32 scores. Their numbers are those of the compiled forward the
    fingerprint's `compile` records. `fullgraph`: a shape past dynamo's recompile limit (streams of 9
    lengths: prompts longer than a pack) raises instead of running eager with other bits (see attend)."""
    return tuple(
        torch.compile(f, dynamic=False, fullgraph=True) for f in (first_step, later_step, finish_steps)
    )


# compiled layers break the graph here: this reads the stream (a context variable, its mask cache) outside any
# graph; its steps are compiled on their own where the layers are (compiled_steps)
@torch.compiler.disable
def fixed_attention(module, query, key, value, attention_mask, **kwargs):
    """transformers attention function of the fixed-shape stream: [1, H, L, D] q/k/v -> ([1, L, H, D], None)."""
    stream = hf_packed.forward_state(_STREAM, module, FIXED_IMPL, "fixed-shape")
    out = fixed_attention_core(
        query, key, value, stream, kwargs.get("scaling"), kwargs.get("sliding_window"), kwargs.get("softcap")
    )
    return out, None


AttentionInterface.register(FIXED_IMPL, fixed_attention)


@contextlib.contextmanager
def fixed_decoder(decoder, lay: Layout, device, compiled: bool = False) -> Iterator[None]:
    """Within: `decoder` runs `fixed_attention` over the stream `lay` (then its config is restored)."""
    config = decoder.config
    before = config._attn_implementation
    token = _STREAM.set(_Stream(lay.block_start.to(device), lay.span, compiled=compiled))
    config._attn_implementation = FIXED_IMPL
    try:
        yield
    finally:
        config._attn_implementation = before
        _STREAM.reset(token)


def option_rows(h_last: torch.Tensor, cand: torch.Tensor, w, b, softcap) -> torch.Tensor:
    """Option log-probs [n, d] -> [n, U]: the LM head on exactly OPTION_ROWS rows per call (zero rows pad)."""
    parts = []
    for hc in h_last.split(OPTION_ROWS):
        real = hc.shape[0]
        hc = torch.cat([hc, hc.new_zeros(OPTION_ROWS - real, hc.shape[1])])  # [OPTION_ROWS, d]
        z = lm_head.cap(lm_head.logits(hc, w, b).float(), softcap)  # [OPTION_ROWS, V]
        parts.append(torch.log_softmax(z, dim=-1)[:real, cand])
    return torch.cat(parts)


def token_nll(h: torch.Tensor, targets: torch.Tensor, w, b, softcap) -> torch.Tensor:
    """-log p(target) [R, d], [R] -> [R] float32: the LM head on exactly NLL_ROWS rows per chunk (zero rows pad)."""
    out = torch.empty(h.shape[0], dtype=torch.float32, device=h.device)
    for t0 in range(0, h.shape[0], NLL_ROWS):
        hc, tg = h[t0 : t0 + NLL_ROWS], targets[t0 : t0 + NLL_ROWS]
        real = hc.shape[0]
        hc = torch.cat([hc, hc.new_zeros(NLL_ROWS - real, hc.shape[1])])  # [NLL_ROWS, d]
        tg = torch.cat([tg, tg.new_zeros(NLL_ROWS - real)])  # [NLL_ROWS]
        z = lm_head.logits(hc, w, b)  # [NLL_ROWS, V] in the model's dtype (as lm_head.token_nll)
        z = lm_head.cap(z.float(), softcap) if softcap else z
        out[t0 : t0 + real] = F.cross_entropy(z, tg, reduction="none").float()[:real]
    return out


@torch.inference_mode()
def forward(backend, seqs: list[list[int]], cand: torch.Tensor) -> tuple[np.ndarray, ...]:
    """One fixed-shape stream -> (raw option log-probs [n, U], hidden [n, d], nll [n], n_tokens [n]).

    `backend` is an HFBackend (its decoder, LM head, pad id, device and `pack_tokens`)."""
    lay = layout(seqs, backend.pad_id, backend.pack_tokens)
    dev = backend.device
    with fixed_decoder(backend.decoder, lay, dev, backend.compiled):
        out = backend.decoder(input_ids=lay.ids.to(dev), position_ids=lay.pos.to(dev), use_cache=False)
    h = out.last_hidden_state[0]  # [L, d]
    w, b = backend.head.weight, getattr(backend.head, "bias", None)
    starts = torch.tensor(lay.starts, device=dev)
    n = torch.tensor(lay.lengths, device=dev)
    h_last = h[starts + n - 1]  # [n, d]
    opt = option_rows(h_last, cand.to(dev), w, b, backend.softcap)  # [n, U]
    # position t of a prompt predicts its token t+1
    src = [s + j for s, k in zip(lay.starts, lay.lengths, strict=True) for j in range(k - 1)]
    nll_sums = []
    if src:
        src_t = torch.tensor(src, device=dev)
        tok = token_nll(h[src_t], lay.ids[0].to(dev)[src_t + 1], w, b, backend.softcap)
        tok_np = tok.double().cpu().numpy()
    else:
        tok_np = np.zeros(0)
    parts = np.split(tok_np, np.cumsum([k - 1 for k in lay.lengths])[:-1])
    for part, k in zip(parts, lay.lengths, strict=True):
        nll_sums.append(math.fsum(part.tolist()) / max(k - 1, 1))  # a 1-token prompt has NLL 0
    return (
        opt.float().cpu().numpy(),
        h_last.float().cpu().numpy(),
        np.array(nll_sums, dtype=np.float32),
        np.array(lay.lengths, dtype=np.int32),
    )


def score(backend, enc: list[list[int]], token_ids: list[int], progress=None, max_rows=None) -> ScoreResult:
    """Prompts in fixed-shape packs (longest first), results in input order. `max_rows`: prompts per pack at
    most (1: each alone, the probe's fallback)."""
    lengths = np.array([len(e) for e in enc])
    packs = plan(lengths, backend.pack_tokens, max_rows)
    cand = torch.tensor(token_ids, dtype=torch.long)

    def run(idx: np.ndarray) -> tuple[np.ndarray, ...]:
        return forward(backend, [enc[i] for i in idx], cand)

    return ScoreResult(*run_groups(packs, run, lengths, progress))
