"""transformers backend (CPU or GPU; safetensors or GGUF): one forward pass per prompt batch.

Per prompt it returns the full-vocabulary log-probs of the option tokens at the LAST prompt
position, the last-layer hidden state there (after the final norm: = hidden_states[-1]), and the
mean next-token NLL over the prompt's real tokens (PackLLM). It never builds a [batch, seq, vocab]
logits tensor: the decoder (`model.get_decoder()`) gives final hidden states [B, L, d]; the LM head
is applied to the last position only ([B, V]) and, for the NLL, to the real positions in
(token x vocabulary) chunks with a running logsumexp. Unlike the reference (SPEC §10.15), pad
positions are never scored, so the NLL does not depend on batch composition.

Batches are length-bucketed under a token budget (`batch_tokens` = rows x padded length), longest
first, and returned in input order. Right padding without an attention mask is the default: with
causal attention a real token never sees the pads after it, so every row equals its unpadded run
and SDPA keeps its fast causal path. Left padding (mask + position ids from the mask) is available
for comparison and tested to give the same hidden states.

`compiled=True` runs each decoder layer through torch.compile (extract/backends/hf/_compile.py): inductor
fuses the elementwise work around the GEMMs (RMSNorm casts, RoPE, SiLU x up, residuals), which in eager
mode costs more than the GEMMs themselves for a small model on a CPU; one compiled graph serves all layers.

Batch composition (`--backend-arg batch_invariant=auto|on|off`, hf_modes.explain_batch_invariant): on a CPU,
reduced precision (bfloat16, float16) is scored batch-invariantly: prompts are packed without padding, one attention call per
layer runs every prompt of a pack in key blocks aligned to its own position 0, a prefix every prompt of a call
shares is run once and cached, and the LM head runs once over the pack (extract/backends/hf/_packed.py), so a
prompt's option log-probs, hidden state and NLL are the same bits in any batch mix and whatever prefix was
cached (padded bf16 batches moved an option log-prob by up to 0.6 nats); the fingerprint records
`batch_invariant: true`. What this rests on is probed at the first packed score() (`settle_invariance`,
cached per machine in hf_checks): where the whole-pack attention fails the probe, attention runs prompt by
prompt without a prefix cache; where the GEMMs are not row-invariant, each prompt runs alone (both still
invariant, slower). On a CUDA device cuBLAS picks its kernels by row count, so that probe fails there (each
prompt ran alone: 11.3x the padded run on an H200); `on` runs the fixed-shape packs of
extract/backends/hf/_fixed.py instead (every kernel sees one shape whatever the mix; `batch_invariant=fixed`
forces them on any device; 0.98x the padded run's extraction on an H100 at the 8B shape, so
hf_modes.CUDA_INVARIANT_BY_DEFAULT is on and `auto` runs them on CUDA too). `off` (and float32's default) runs
padded batches, whose outputs depend on
which prompts share a pass, so the fingerprint records what fixes that (`batching`: batch tokens, shard
rows, the order rule). float32 keeps the padded batches and the prefix
cache without either key: there batch composition moves results by ~1e-5 (float32 GEMM rounding), far below
anything a feature is used for; `--backend-arg batch_invariant=on` runs the same probed path in float32 (GEMMs get at
least the row count from which the probe found rows identical).

Around this module: hf/modes.py settles the dtype, the batch-invariant path and the fingerprint before any
weights load; hf/load.py loads a model and builds the backend with its checks; the class's own methods run the
padded and packed forward passes (`padded`, `packed`) and their shared-prefix caches (`run_prefix`,
`run_prefix_packed`): the state they read is the backend's, so they are its methods, in this one file.
"""

from __future__ import annotations

import copy
import inspect
import logging
import math
from dataclasses import dataclass

import numpy as np
import torch
from walla.extract.backends import Progress, ScoreResult
from walla.extract.backends.hf import _fixed as hf_fixed
from walla.extract.backends.hf import _fixed_probe as hf_fixed_probe
from walla.extract.backends.hf import _lm_head as lm_head
from walla.extract.backends.hf import _packed as hf_packed
from walla.extract.backends.hf import _probes as hf_checks
from walla.extract.backends.hf._compile import compile_layers
from walla.extract.backends.hf._modes import invariant_by_default, invariant_path
from walla.extract.prompts import bind_tokenizer
from walla.extract.scoring import plan_batches, run_groups

log = logging.getLogger(__name__)

MIN_PREFIX = 16  # shared leading tokens worth running once and caching


# self-check: how far our forward's last hidden state may be from the model's own, relative to its largest value,
# in reduced precision. Rounding alone measured (bf16, the float32-summed invariant attention vs the model's SDPA):
# SmolLM2-135M 3.0% (CPU), random Llama-3.2-1B shape 2.6% and Llama-3.1-8B shape 5.4% (H100; 0.05 failed it).
# A forward that is wrong rather than rounded (a mask, a position, a layer, the wrong row) is off by O(1).
HIDDEN_TOL_REDUCED = 0.15


@dataclass
class Prefix:
    """The shared leading tokens of a score() call, run once."""

    length: int  # P tokens
    cache: object  # transformers Cache of the prefix, batch 1
    h_last: torch.Tensor  # [d] final hidden state of the last prefix token (predicts each first suffix token)
    nll_sum: float  # sum of the prefix's own next-token NLLs (positions 1..P-1)


@dataclass
class PackedPrefix:
    """The shared leading tokens of a batch-invariant score() call, run once (run_prefix_packed)."""

    length: int  # P tokens
    cache: object  # transformers Cache of the prefix, batch 1
    h_last: torch.Tensor  # [d] final hidden state of the last prefix token (predicts each first suffix token)
    token_nll: list[float]  # the prefix's own next-token NLLs (positions 1..P-1), summed per prompt with fsum


def cache_keyword(decoder) -> str:
    """The decoder's name for a KV cache argument: `cache` where the installed transformers has it (5.2x renamed
    `past_key_values`, which then warns on every call with a site-packages path), else `past_key_values`."""
    return "cache" if "cache" in inspect.signature(decoder.forward).parameters else "past_key_values"


def output_cache(out):
    """The KV cache of a decoder output, by its name in the installed transformers (see cache_keyword)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


class HFBackend:
    """See the module docstring. Core classes take flat arguments (STYLE item 3)."""

    name = "hf"

    def __init__(
        self,
        model,
        tokenizer,
        *,
        batch_tokens: int = 4096,
        chat_template: bool = False,
        padding_side: str = "right",
        identity: dict | None = None,
        max_batch_rows: int | None = None,
        chunk_elems: int = lm_head.CHUNK_ELEMS,
        vocab_chunk: int = lm_head.VOCAB_CHUNK,
        prefix_cache: bool = True,
        compiled: bool = False,
        batch_invariant: bool | None = None,
        shard_rows: int | None = None,
        fixed_shapes: bool | None = None,
        pack_tokens: int = hf_fixed.PACK_TOKENS,
    ):
        if padding_side not in ("left", "right"):
            raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
        self.model = model.eval()
        self.decoder = model.get_decoder()
        self.head = model.get_output_embeddings()
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.softcap = getattr(cfg, "final_logit_softcapping", None)
        self.hidden_size = int(cfg.hidden_size)
        self.tok = tokenizer
        self.pad_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
        )
        self.batch_tokens = int(batch_tokens)
        self.max_batch_rows = max_batch_rows
        self.chat_template = chat_template
        # text -> ids (the Backend methods), as the vllm backend has them
        self.format_prompt, self.encode, self.encode_bare, self.encode_batch = bind_tokenizer(
            tokenizer, chat_template
        )
        self.padding_side = padding_side
        self.chunk_elems, self.vocab_chunk = chunk_elems, vocab_chunk
        self.prefix_cache = prefix_cache and padding_side == "right"
        self.sliding_window = getattr(cfg, "sliding_window", None)
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self._identity = identity or {}
        # None: `batch_invariant=auto` for this dtype and device (module docstring)
        self.batch_invariant = (
            invariant_by_default(self.dtype, self.device.type) if batch_invariant is None else batch_invariant
        )
        self.shard_rows = shard_rows  # rows per score() call of the run: part of `batching` in identity()
        # the invariant path: fixed shapes (hf/fixed.py) or a packed stream (hf/packed.py); None: by device
        self.fixed_shapes = (
            invariant_path("auto", self.device.type) == "fixed"
            if fixed_shapes is None
            else bool(fixed_shapes)
        )
        self.pack_tokens = hf_fixed.check_pack_tokens(pack_tokens)  # tokens of every fixed-shape forward
        self.attention = None  # the model's own attention function, found at the first packed forward
        # measured at the first packed score() (settle_invariance): GEMM rows invariant from `min_rows` rows on,
        # attention over all prompts of a pack in one call
        self.rows_invariant: bool | None = None
        self.min_rows, self.attention_batched, self.invariance_why = 2, False, ""
        self.compiled = False
        self.cache_kw = cache_keyword(self.decoder)
        if compiled:
            self.compile()

    # -- the LM head, where the passes need it ----------------------------------------------------------

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """LM head on selected positions only: [n, d] -> [n, V] float32."""
        return lm_head.cap(self.head(h).float(), self.softcap)

    def option_logprobs(self, h_last: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary log-probs of the candidate tokens: [n, d] -> [n, U]. Rows go through the head
        `lm_head.HEAD_ROWS` at a time, so a batch of many short prompts never holds more [rows, V] floats."""
        if h_last.shape[0] <= lm_head.HEAD_ROWS:
            return torch.log_softmax(self.logits(h_last), dim=-1)[:, cand]
        parts = [torch.log_softmax(self.logits(h), dim=-1)[:, cand] for h in h_last.split(lm_head.HEAD_ROWS)]
        return torch.cat(parts)

    def token_nll(self, h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """-log p(target | position) for T positions without materializing [T, V]: [T, d], [T] -> [T]."""
        w, b = self.head.weight, getattr(self.head, "bias", None)
        rows = self.min_rows if self.batch_invariant else 1
        return lm_head.token_nll(h, targets, w, b, self.softcap, self.chunk_elems, self.vocab_chunk, rows)

    def forward_packed(
        self, seqs: list[list[int]], cand: torch.Tensor, prefix: PackedPrefix | None = None
    ) -> tuple[np.ndarray, ...]:
        """A batch-invariant forward: the fixed-shape path (hf/fixed.py: CUDA) or a packed stream
        (`packed`, optionally after a shared prefix); each prompt's bits do not depend on the others."""
        if self.fixed_shapes and prefix is None:  # the fixed-shape path (CUDA): its own stream and attention
            return hf_fixed.forward(self, seqs, cand)
        return self.packed(seqs, cand, prefix)

    def head_rows(self) -> int:
        """Rows of each LM-head call of batch-invariant scoring (NLL chunks and option rows alike): the head's
        row-invariance probe runs up to this many (hf_checks.rows_invariant)."""
        return lm_head.chunk_rows(int(self.head.weight.shape[0]), self.chunk_elems, self.vocab_chunk)

    # -- the forward passes: padded, packed, and their shared-prefix caches ------------------------------

    @torch.inference_mode()
    def run_prefix(self, ids: list[int]) -> Prefix:
        """Run the tokens every prompt of a call starts with once; their KV cache is reused by each batch."""
        x = torch.tensor([ids], device=self.device)  # [1, P]
        out = self.decoder(input_ids=x, use_cache=True)
        h = out.last_hidden_state[0]  # [P, d]
        nll_sum = float(self.token_nll(h[:-1], x[0, 1:]).sum()) if len(ids) > 1 else 0.0
        return Prefix(len(ids), output_cache(out), h[-1], nll_sum)

    @torch.inference_mode()
    def padded(
        self, seqs: list[list[int]], cand: torch.Tensor, prefix: Prefix | None = None
    ) -> tuple[np.ndarray, ...]:
        """One padded batch -> (raw option log-probs [n, U], hidden [n, d], nll [n], n_tokens [n]).

        With `prefix`, `seqs` are the prompts' tokens AFTER the shared prefix (right padding only).
        """
        n = len(seqs)
        lens = torch.tensor([len(s) for s in seqs])  # [n]
        if int(lens.min()) < 1:
            raise ValueError("a prompt encoded to zero tokens")
        width = int(lens.max())
        ids = torch.full((n, width), self.pad_id, dtype=torch.long)  # [n, L]
        real = torch.zeros((n, width), dtype=torch.bool)  # [n, L] True at real tokens
        for i, s in enumerate(seqs):
            if self.padding_side == "right" or prefix is not None:
                ids[i, : len(s)] = torch.tensor(s)
                real[i, : len(s)] = True
            else:
                ids[i, width - len(s) :] = torch.tensor(s)
                real[i, width - len(s) :] = True
        ids, real = ids.to(self.device), real.to(self.device)
        if prefix is not None:
            cache = copy.deepcopy(prefix.cache)
            cache.batch_repeat_interleave(n)  # [1, ...] -> [n, ...]; positions continue after the prefix
            out = self.decoder(input_ids=ids, **{self.cache_kw: cache}, use_cache=True)
            last = (lens - 1).to(self.device)  # [n]
        elif self.padding_side == "right" or bool(real.all()):
            # causal attention: no real token attends to the pads after it -> no mask needed (SDPA is_causal path)
            out = self.decoder(input_ids=ids, use_cache=False)
            last = (lens - 1).to(self.device)  # [n]
        else:
            pos = (real.long().cumsum(-1) - 1).clamp(min=0)  # [n, L] positions count real tokens only
            out = self.decoder(input_ids=ids, attention_mask=real.long(), position_ids=pos, use_cache=False)
            last = torch.full((n,), width - 1, device=self.device)
        h = out.last_hidden_state  # [n, L, d], after the final norm
        h_last = h[torch.arange(n, device=self.device), last]  # [n, d]
        opt = self.option_logprobs(h_last, cand.to(self.device))  # [n, U] last position only
        # prompt NLL: position t predicts token t+1; both must be real tokens
        pred = real[:, :-1] & real[:, 1:]  # [n, L-1]
        row_of = torch.arange(n, device=self.device).unsqueeze(1).expand(n, width - 1)[pred]  # [T]
        tok_nll = self.token_nll(h[:, :-1][pred], ids[:, 1:][pred])  # [T]
        sums = torch.zeros(n, device=self.device).index_add_(0, row_of, tok_nll)  # [n]
        total = lens.clone()
        if prefix is not None:  # + the prefix's own NLL + each first suffix token predicted from the prefix
            first = torch.log_softmax(self.logits(prefix.h_last[None]), dim=-1)[0, ids[:, 0]]  # [n]
            sums = sums + prefix.nll_sum - first
            total = total + prefix.length
        counts = (total - 1).clamp(min=1).to(self.device)  # a 1-token prompt has NLL 0 (reference clamps too)
        return (
            opt.float().cpu().numpy(),
            h_last.float().cpu().numpy(),
            (sums / counts).cpu().numpy(),
            total.numpy().astype(np.int32),
        )

    @torch.inference_mode()
    def run_prefix_packed(self, ids: list[int], before: PackedPrefix | None = None) -> PackedPrefix:
        """The shared prefix of a batch-invariant score() call, run once as a packed prompt of its own; with
        `before`, the prefix `before` then `ids` (chunked prefill: `before`'s cache is extended in place, so it is
        the caller's alone). Either way the same bits as the whole prefix run at once (blocked attention reduces
        keys in blocks from position 0, the GEMMs' rows are row-invariant: hf/packed.py)."""
        p = before.length if before is not None else 0
        x, pos, lengths = hf_packed.pack_inputs([ids], self.pad_id, self.min_rows, offset=p)
        x, pos = x.to(self.device), pos.to(self.device)
        self.attention = self.attention or hf_packed.own_attention(self.model)
        past = {self.cache_kw: before.cache} if before is not None else {}
        with hf_packed.packed_decoder(self.decoder, lengths, self.attention, p, self.attention_batched):
            out = self.decoder(input_ids=x, position_ids=pos, **past, use_cache=True)
        cache = output_cache(out)
        if x.shape[1] > len(ids):  # a pad segment of a short stream: drop it from the cache
            cache.crop(p + len(ids))
        h = out.last_hidden_state[0, : len(ids)]  # [n, d]
        rows, targets = h[:-1], x[0, 1 : len(ids)]  # position t predicts t + 1
        if before is not None:  # and the last position before predicts this piece's first token
            rows, targets = torch.cat([before.h_last[None], rows]), x[0, : len(ids)]
        tok = self.token_nll(rows, targets) if len(targets) else h.new_zeros(0)
        earlier = before.token_nll if before is not None else []
        return PackedPrefix(p + len(ids), cache, h[-1], earlier + tok.double().cpu().tolist())

    @torch.inference_mode()
    def packed(
        self, seqs: list[list[int]], cand: torch.Tensor, prefix: PackedPrefix | None = None
    ) -> tuple[np.ndarray, ...]:
        """Prompts packed into one stream (hf/packed.py): same outputs as `padded`, but each prompt's bits
        do not depend on the others. With `prefix`, `seqs` are the prompts' tokens after a shared prefix whose
        KV cache, hidden states and token NLLs were computed once (run_prefix_packed): the same bits as without.

        One attention call per layer over all prompts (`blocked_attention`) where the probe verified it, else one
        per prompt; the LM head runs over the prompts' last rows, and a chunked pass over all their positions for
        the NLL, at most `head_rows()` and never fewer than `min_rows` rows a call; a prompt's NLL is the correctly
        rounded sum of its token NLLs (math.fsum: the same number whichever positions the prefix held).
        """
        p = prefix.length if prefix is not None else 0
        ids, pos, lengths = hf_packed.pack_inputs(seqs, self.pad_id, self.min_rows, offset=p)
        ids, pos = ids.to(self.device), pos.to(self.device)  # [1, T]
        self.attention = self.attention or hf_packed.own_attention(self.model)
        cache = copy.deepcopy(prefix.cache) if prefix is not None else None
        with hf_packed.packed_decoder(self.decoder, lengths, self.attention, p, self.attention_batched):
            out = self.decoder(
                input_ids=ids, position_ids=pos, **{self.cache_kw: cache}, use_cache=cache is not None
            )
        h = out.last_hidden_state[0]  # [T, d]
        n = torch.tensor([len(x) for x in seqs], device=self.device)  # [n]
        starts = torch.cumsum(n, 0) - n  # [n]
        opt = self.option_rows(h[starts + n - 1], cand.to(self.device))  # [n, U]
        # token NLLs: stream position t predicts t+1 within a prompt; with a prefix, its last position
        # predicts each prompt's first token
        inner = torch.ones(h.shape[0], dtype=torch.bool, device=self.device)
        inner[starts + n - 1] = False  # a prompt's last position predicts nothing here
        inner[int(n.sum()) :] = False  # pad rows of a short stream
        rows, targets = h[:-1][inner[:-1]], ids[0, 1:][inner[:-1]]  # [R, d], [R]
        if prefix is not None:
            rows = torch.cat([prefix.h_last[None].expand(len(seqs), -1), rows])
            targets = torch.cat([ids[0, starts], targets])
        tok = self.token_nll(rows, targets).double().cpu().numpy()  # [R]
        first = tok[: len(seqs)].tolist() if prefix is not None else [None] * len(seqs)
        own = np.split(
            tok[len(seqs) if prefix is not None else 0 :], np.cumsum([len(x) - 1 for x in seqs])[:-1]
        )
        nlls = []
        for s_own, s_first, seq in zip(own, first, seqs, strict=True):
            terms = [*s_own.tolist(), *(prefix.token_nll + [s_first] if prefix is not None else [])]
            nlls.append(math.fsum(terms) / max(p + len(seq) - 1, 1))  # a 1-token prompt has NLL 0
        return (
            opt.float().cpu().numpy(),
            h[starts + n - 1].float().cpu().numpy(),
            np.array(nlls, dtype=np.float32),
            np.array([p + len(x) for x in seqs], dtype=np.int32),
        )

    def option_rows(self, h_last: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
        """Option log-probs of batch-invariant scoring: [n, d] -> [n, U]; the head GEMM as the probe ran it,
        on at least `min_rows` rows and at most `head_rows()` per call (as many as an NLL chunk: the probe then
        covers every row count the head runs with)."""
        w, b = self.head.weight, getattr(self.head, "bias", None)
        parts = []
        for hc in h_last.split(self.head_rows()):
            real = hc.shape[0]
            if real < self.min_rows:
                hc = torch.cat([hc, hc[:1].expand(self.min_rows - real, -1)])
            z = lm_head.cap(lm_head.logits(hc, w, b).float(), self.softcap)
            parts.append(torch.log_softmax(z, dim=-1)[:real, cand])
        return torch.cat(parts)

    def shared_prefix(self, enc: list[list[int]]) -> int:
        """Length of the token prefix every prompt shares (0 when too short to be worth caching)."""
        if not self.prefix_cache or len(enc) < 2:
            return 0
        shortest = min(len(e) for e in enc)
        first = enc[0]
        p = 0
        while p < shortest - 1 and all(e[p] == first[p] for e in enc):  # keep >= 1 own token per prompt
            p += 1
        if p < MIN_PREFIX or (self.sliding_window and max(len(e) for e in enc) > self.sliding_window):
            return 0
        return p

    def score(
        self,
        prompts: list[str],
        token_ids: list[int],
        progress: Progress | None = None,
        enc: list[list[int]] | None = None,
    ) -> ScoreResult:
        """Score prompts (already formatted) in length buckets; results in input order.

        `enc`: the prompts' ids from `encode_batch`, when the caller tokenized them ahead (in a thread).
        A token prefix shared by all prompts (e.g. few-shot examples, an instruction) is run once and
        its KV cache reused: the same outputs, without recomputing the prefix for every prompt.
        """
        enc = self.encode_batch(prompts) if enc is None else enc
        lengths = np.array([len(e) for e in enc])
        if self.batch_invariant and self.fixed_shapes:
            self.settle_invariance()  # the probe: several prompts per pack, or each alone
            return hf_fixed.score(
                self, enc, token_ids, progress, self.max_batch_rows if self.rows_invariant else 1
            )
        if self.batch_invariant:
            return self._score_packed(enc, lengths, token_ids, progress)
        p = self.shared_prefix(enc)
        prefix = self.run_prefix(enc[0][:p]) if p else None
        batches = plan_batches(lengths, self.batch_tokens, self.max_batch_rows)  # the cache counts as tokens
        cand = torch.tensor(token_ids, dtype=torch.long)

        def run(idx: np.ndarray) -> tuple[np.ndarray, ...]:
            return self.padded([enc[i][p:] for i in idx], cand, prefix)

        return ScoreResult(*run_groups(batches, run, lengths, progress))

    def _score_packed(self, enc, lengths: np.ndarray, token_ids: list[int], progress) -> ScoreResult:
        """score() when batch-invariant: packs of prompts, one attention call per layer over a pack, a shared
        prefix run once (where the probe verified the batched attention; else one attention call per prompt and
        no prefix cache; one prompt per pack where the GEMMs are not row-invariant). All give the same bits."""
        self.settle_invariance()
        p = self.shared_prefix(enc) if self.attention_batched else 0
        prefix = self.run_prefix_packed(enc[0][:p]) if p else None
        rows = self.max_batch_rows if self.rows_invariant else 1
        packs = hf_packed.plan_packs(lengths - p, self.batch_tokens, rows)
        cand = torch.tensor(token_ids, dtype=torch.long)

        def run(idx: np.ndarray) -> tuple[np.ndarray, ...]:
            return self.forward_packed([enc[i][p:] for i in idx], cand, prefix)

        return ScoreResult(*run_groups(packs, run, lengths, progress))

    def chunks_exact(self, n_tokens: int) -> bool:
        """Whether a prompt of `n_tokens` scored in pieces after its own growing prefix (`score_steps`) gives
        score()'s bits: the packed path with the probe's batched attention and a prefix cache, no fixed shapes
        (their own stream), and no sliding window shorter than the prompt (its layers keep only the window)."""
        self.settle_invariance()
        return bool(
            self.batch_invariant
            and not self.fixed_shapes
            and self.prefix_cache
            and self.attention_batched
            and not (self.sliding_window and n_tokens > self.sliding_window)
        )

    def score_steps(self, prompts: list[str], token_ids: list[int], chunk_tokens: int):
        """score() in passes of at most about `chunk_tokens` tokens (chunked prefill), a generator: it yields
        None after each piece, so a server can run other passes between them (serve/batcher.py), and returns
        the ScoreResult. Each prompt's pieces run as a growing prefix of its own (`run_prefix_packed`),
        the last piece as a packed prompt after it: score()'s bits where `chunks_exact` holds; elsewhere, one
        step that is score() itself."""
        enc = self.encode_batch(prompts)
        if max(len(e) for e in enc) <= chunk_tokens or not all(self.chunks_exact(len(e)) for e in enc):
            return self.score(prompts, token_ids, enc=enc)
        cand = torch.tensor(token_ids, dtype=torch.long)
        rows = []
        for i, e in enumerate(enc):
            prefix, at = None, 0
            while len(e) - at > chunk_tokens:  # the last piece keeps >= 1 token of its own
                if i or at:
                    yield None  # between two pieces: each step of the generator runs one
                prefix = self.run_prefix_packed(e[at : at + chunk_tokens], prefix)
                at += chunk_tokens
            if i or at:
                yield None
            rows.append(self.forward_packed([e[at:]], cand, prefix))
        return ScoreResult(*(np.concatenate(col) for col in zip(*rows, strict=True)))

    def settle_invariance(self) -> str:
        """Run (or read from the cache) the probes batch-invariant scoring rests on, once; returns why.

        GEMM rows (hf_checks.rows_invariant): from how many rows each linear layer and the LM head give a row
        the same bits (`min_rows`); where no small count does, each prompt runs alone. Then the whole packed
        forward (hf_checks.packed_invariant): random prompts scored alone, in two mixes and after a cached
        prefix must give the same bits with one attention call per layer (`attention_batched`); where they do
        not, attention runs prompt by prompt, as before, and no prefix is cached.
        """
        if self.rows_invariant is not None:
            return self.invariance_why
        if self.fixed_shapes:  # rows_invariant: several prompts share a fixed-shape pack
            self.rows_invariant, self.invariance_why = hf_fixed_probe.fixed_invariant(self)
            log.info("batch-invariant scoring: %s", self.invariance_why)
            return self.invariance_why
        self.rows_invariant, min_rows, why = hf_checks.rows_invariant(
            self.model, max(self.batch_tokens, 2), head_rows=self.head_rows(), vocab_chunk=self.vocab_chunk
        )
        # never fewer than 2: a 1-token stream changed a prompt's bits on the development CPU (bf16, SmolLM2)
        # although the linear probe passed at M = 1; the packed probe below checks the result either way
        self.min_rows = max(2, min_rows)
        why = f"{why} (GEMMs get at least {self.min_rows} rows)" if self.rows_invariant else why
        if not self.rows_invariant:
            self.min_rows, self.attention_batched = 2, False
            self.invariance_why = why
        else:
            self.attention_batched, why_att = hf_checks.packed_invariant(self)
            self.invariance_why = f"{why}; {why_att}"
        log.info("batch-invariant scoring: %s", self.invariance_why)
        return self.invariance_why

    @torch.inference_mode()
    def self_check(self, text: str = "The capital of France is Paris. The capital of Italy is") -> float:
        """Compare our scoring with the model's own forward on one prompt, in two parts.

        - The head (what this check is for: architectures whose logits need more than `lm_head(norm(h))` +
          soft-capping): our head applied to the model's OWN decoder output must give the model's log-probs
          (candidate tokens and the prompt NLL). Same input, so only the rounding of the logits themselves
          can differ: in reduced precision up to a unit roundoff of the largest logit per side.
        - The forward: our last hidden state vs the model's, relative to its largest value (the attention of
          batch-invariant scoring sums in float32 where the model's SDPA runs in the model's dtype: in bf16 the
          two differ by ~3% of max |h| on SmolLM2-135M and a Llama-3.2-1B shape, 5.4% on a random Llama-3.1-8B
          shape on an H100 (HIDDEN_TOL_REDUCED), and the model's bf16 logits of tokens far down the
          distribution then differ by tenths of a nat, as both sides round).

        Returns the head's max abs log-prob difference; raises RuntimeError when either part is too large.
        """
        ids = self.encode(text)
        x = torch.tensor([ids], device=self.device)
        # the decoder's output as the model's own forward computes it (= hidden_states[-1]), caught by a hook
        # removed at once: output_hidden_states' capture hooks would stay on every layer and break a compiled
        # layer's graph, and a second decoder forward would cost one more pass at load
        seen: list = []
        hook = self.decoder.register_forward_hook(lambda _m, _a, out: seen.append(_last_hidden(out)))
        try:
            full = self.model(input_ids=x, use_cache=False)
        finally:
            hook.remove()
        z = full.logits[0].float()  # [L, V] (one short prompt)
        ref_lp = torch.log_softmax(z, dim=-1)
        cand = torch.arange(min(64, ref_lp.shape[-1]))
        h_model = seen[0][0]  # [L, d] the model's own decoder output, in its dtype
        opt_head = self.option_logprobs(h_model[-1:], cand.to(self.device))[0].float().cpu().numpy()
        nll_head = self.token_nll(h_model[:-1], x[0, 1:]).float().mean().item()
        ref_nll = -ref_lp[:-1].gather(1, x[0, 1:, None]).mean().item()
        err = max(float(np.abs(opt_head - ref_lp[-1, cand].cpu().numpy()).max()), abs(nll_head - ref_nll))
        unit = 0.0 if self.dtype == torch.float32 else torch.finfo(self.dtype).eps / 2  # unit roundoff
        head_tol = 1e-3 + 4 * unit * float(z.abs().max())  # both sides round each logit (log-softmax: x2)
        if self.batch_invariant and not self.fixed_shapes:
            # check the path scoring takes (one attention call per layer or per prompt); one prompt of the fixed
            # path needs no probe, and a compiled one is probed after compiling (probe_after_compile): settled
            # here, it was probed eager and cached under the eager key, so every later run probed again
            self.settle_invariance()
        forward = self.forward_packed if self.batch_invariant else self.padded
        _opt, hid, _nll, _ = forward([ids], cand)
        ref_h = h_model[-1].float().cpu().numpy()
        herr = float(np.abs(hid[0] - ref_h).max() / (np.abs(ref_h).max() + 1e-6))
        tol = 1e-3 if self.dtype == torch.float32 else HIDDEN_TOL_REDUCED
        failed = []
        if err > head_tol:
            failed.append(
                f"our LM head on the model's own hidden states gives log-probs/NLL {err:.2e} from "
                f"model(...).logits (tolerance {head_tol:.2e})"
            )
        if herr > tol:
            failed.append(
                f"our forward's last hidden state is {herr:.2e} of its largest value from the model's "
                f"(tolerance {tol})"
            )
        if failed:
            raise RuntimeError(
                f"self-check failed: {'; '.join(failed)}; this architecture computes its logits or hidden "
                "states in a way the hf backend does not reproduce"
            )
        return err

    def compile(self) -> None:
        """Compile the decoder layers and trace them once on a 2-row batch of the scoring path, so the first
        real batches reuse that graph (sizes 1 and 2+ compile separately: torch specializes size 1)."""
        # the packed path (CPU) is probed eager, before the layers compile: one verdict and one cache entry,
        # whether the self-check ran it first or was cached (its probe's many shapes would each recompile); the
        # fixed-shape path is probed after, on the compiled forward that will run (one stream shape: the same
        # graphs for every prompt), see probe_after_compile
        if self.batch_invariant and not self.probe_after_compile(True):
            self.settle_invariance()
        compile_layers(self.model)
        # no shared-prefix KV cache when compiled: a layer reads its own cache slot, so dynamo would recompile
        # the layer graph for every layer index (and fall back to eager past its recompile limit)
        self.compiled, self.prefix_cache = True, False
        ids = self.encode("The capital of France is Paris. The capital of Italy is Rome.")
        if self.batch_invariant and self.fixed_shapes:  # one key step and more: every attention graph now
            step = hf_fixed.KEY_BLOCKS * hf_fixed.QUANTUM
            ids = (ids * step)[: step + 1]
        forward = self.forward_packed if self.batch_invariant else self.padded
        forward([ids, ids[: max(2, len(ids) // 2)]], torch.tensor([0]))

    def probe_after_compile(self, compiled: bool) -> bool:
        """Whether the invariance probe runs on the compiled forward (fixed shapes, compiled) rather than eager
        before compiling (the packed path): the fixed path's compiled attention has other bits than its eager
        one, so a probe of the eager forward would not vouch for what runs."""
        return compiled and self.batch_invariant and self.fixed_shapes

    def close(self) -> None:
        self.model = self.decoder = self.head = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _last_hidden(out) -> torch.Tensor:
    """The decoder's final hidden states from its output (a ModelOutput, or a tuple when return_dict is off)."""
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
