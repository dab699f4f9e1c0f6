"""The forward passes of the hf backend: token ids in, (option log-probs, hidden state, NLL, token count) out.

`padded`: one padded batch (right padding without a mask by default, or left padding with mask and positions),
its outputs depending on which prompts share the pass in reduced precision. `packed`: prompts packed into one
stream (hf/packed.py), each prompt's bits independent of the others. Each path can start from a shared prefix
run once (`run_prefix`, `run_prefix_packed`) whose KV cache every batch reuses: the same outputs, without
recomputing the prefix for every prompt. The LM head is the backend's (`HFBackend.logits`, `token_nll`,
`option_logprobs`), the passes `ForwardPasses`' methods, which HFBackend (hf/_backend.py) inherits.
"""

from __future__ import annotations

import copy
import inspect
import math
from dataclasses import dataclass

import numpy as np
import torch
from walla.extract.backends.hf import _lm_head as lm_head
from walla.extract.backends.hf import _packed as hf_packed


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


class ForwardPasses:
    """The forward passes as methods of the backend (HFBackend inherits them): each reads the backend's model,
    decoder, device, padding, LM head and invariance settings, so it is the backend's behaviour, kept in a
    module of its own beside the class that holds the state."""

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
