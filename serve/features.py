"""A batch of prompts of one model -> each prompt's features, exactly as the store and walla-train see them.

    feats = score_prompts(backend, [(prompt, ["A", "B"]), ...])   # [(probs float32 [K], hidden float16 [H])]

The scoring path is extraction's: option tokens resolved by extract/scoring.py `resolve_option_token_ids`
(per prompt, as the market's LLMFeatures does), ONE `backend.score` call for the whole batch over the union of
the option tokens (as extract/variant.py scores a shard), each prompt's raw log-probs of its own options
renormalized as extract/variant.py `feature_rows` stores them (float32), turned into a distribution as
store/scenario/_assemble.py assembles it (softmax in float64, stored float32), hidden states rounded to the store's
float16. So a served question's features equal the stored ones wherever the backend's numbers are
batch-invariant (tier `bitwise`), and the heads and pool see what they were trained on.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from walla.extract.backends import Backend
from walla.extract.scoring import renormalize, resolve_option_token_ids
from walla.store.scenario import softmax_rows  # the store's distribution of renormalized log-probs

Item = tuple[str, Sequence[str]]  # (the formatted prompt, its scored option strings)


def option_token_ids(backend: Backend, prompt: str, strings: Sequence[str]) -> dict[str, int]:
    return resolve_option_token_ids(backend.encode, backend.encode_bare, prompt, list(strings))


def score_prompts(backend: Backend, items: Sequence[Item]) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """[(probs [K] float32, hidden [H] float16, prompt tokens)] of each item, in order, from one score call.

    Raises:
        ValueError: an option string with no single token for this model (names it).
    """
    steps = score_steps(backend, items, None)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def score_steps(backend: Backend, items: Sequence[Item], chunk_tokens: int | None):
    """score_prompts as a generator of passes: with `chunk_tokens`, a backend that scores long prompts in
    pieces (hf `score_steps`: the same bits) yields None after each, so the batcher can run other requests'
    passes between them; returns score_prompts' list."""
    tok = [option_token_ids(backend, p, s) for p, s in items]
    union = list(dict.fromkeys(t for d in tok for t in d.values()))  # the token ids scored in this pass
    col = {t: j for j, t in enumerate(union)}
    prompts = [p for p, _ in items]
    stepped = getattr(backend, "score_steps", None) if chunk_tokens else None
    if stepped is not None:
        res = yield from stepped(prompts, union, chunk_tokens)
    else:
        res = backend.score(prompts, union)
    out = []
    for i, (_, strings) in enumerate(items):
        raw = res.raw_logprobs[i, [col[tok[i][s]] for s in strings]]  # [K]
        lp = renormalize(raw).astype(np.float64)[None, :]  # [1, K], as stored (float32) then read
        probs = softmax_rows(lp)[0].astype(np.float32)  # [K]
        out.append((probs, np.asarray(res.hidden[i]).astype(np.float16), int(res.n_tokens[i])))
    return out
