"""Backend-independent pieces of extraction: option-token resolution (SPEC §1.5), renormalization
over a question's options, length-bucketed batching that restores input order, and `score_prompts`, the
features of a batch of prompts exactly as the store and walla-train see them (walla serve's batcher and Ray
workers score with it).

    feats = score_prompts(backend, [(prompt, ["A", "B"]), ...])   # [(probs float32 [K], hidden float16 [H])]

The scoring path is extraction's: option tokens resolved by `resolve_option_token_ids`
(per prompt, as the market's LLMFeatures does), ONE `backend.score` call for the whole batch over the union of
the option tokens (as extract/variant.py scores a shard), each prompt's raw log-probs of its own options
renormalized as extract/variant.py `feature_rows` stores them (float32), turned into a distribution as
store/scenario/_assemble.py assembles it (softmax in float64, stored float32), hidden states rounded to the store's
float16. So a served question's features equal the stored ones wherever the backend's numbers are
batch-invariant (tier `bitwise`), and the heads and pool see what they were trained on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from walla.extract.backends import Backend


def resolve_option_token_ids(
    encode: Callable[[str], list[int]],
    encode_bare: Callable[[str], list[int]],
    first_prompt: str,
    option_strings: Sequence[str],
) -> dict[str, int]:
    """The token scored for each option string, resolved once per model and dataset view (SPEC §1.5).

    encode(first_prompt + option) must extend encode(first_prompt): the FIRST new token is the
    option's token (so "Answer:" + "A" scores the no-space "A" the model would actually emit; a
    multi-token option is scored by its first sub-token). Otherwise the option encoded alone
    (no special tokens) must be a single token.

    Raises:
        ValueError: naming the option when neither rule gives a token, or when two options map to
            the same token (their probabilities could not be told apart).
    """
    base = encode(first_prompt)
    out: dict[str, int] = {}
    for opt in dict.fromkeys(option_strings):
        ext = encode(first_prompt + opt)
        if len(ext) > len(base) and ext[: len(base)] == base:
            out[opt] = int(ext[len(base)])
            continue
        bare = encode_bare(opt)
        if len(bare) != 1:
            raise ValueError(
                f"option {opt!r}: appending it to the prompt does not add a token after the prompt's tokens, and "
                f"encoded alone it is {len(bare)} tokens {bare}, not 1; choose option_tokens that are single tokens"
            )
        out[opt] = int(bare[0])
    inverse: dict[int, str] = {}
    for opt, tid in out.items():
        if tid in inverse:
            raise ValueError(
                f"options {inverse[tid]!r} and {opt!r} map to the same token id {tid}; "
                "choose distinct option_tokens"
            )
        inverse[tid] = opt
    return out


def renormalize(raw_logprobs: np.ndarray) -> np.ndarray:
    """log-softmax over the options of one question: [K] -> [K] with logsumexp == 0."""
    x = np.asarray(raw_logprobs, dtype=np.float64)
    m = x.max()
    return (x - m - np.log(np.exp(x - m).sum())).astype(np.float32)


def longest_first(lengths: Sequence[int], batch_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """(lengths as int64 [N], row order by DESCENDING length [N], stable): the order every batching plan
    walks, so out-of-memory shows at once (lm-eval Collator). Raises ValueError when batch_tokens < 1."""
    if batch_tokens < 1:
        raise ValueError(f"batch_tokens must be >= 1, got {batch_tokens}")
    lengths = np.asarray(lengths, dtype=np.int64)
    return lengths, np.argsort(-lengths, kind="stable")


def plan_batches(lengths: Sequence[int], batch_tokens: int, max_rows: int | None = None) -> list[np.ndarray]:
    """Index batches sorted by DESCENDING length (longest_first) whose padded size rows * max_len stays
    within `batch_tokens` (a single longer prompt gets its own batch).

    Returns a list of index arrays that together cover every row exactly once.
    """
    lengths, order = longest_first(lengths, batch_tokens)
    batches: list[np.ndarray] = []
    start = 0
    while start < len(order):
        longest = int(lengths[order[start]])
        n = max(1, batch_tokens // max(longest, 1))
        if max_rows:
            n = min(n, max_rows)
        batches.append(order[start : start + n])
        start += n
    return batches


def restore_order(batches: Sequence[np.ndarray], results: Sequence[np.ndarray], n: int) -> np.ndarray:
    """Scatter per-batch result rows back to input order, checking that every row came back once."""
    first = np.asarray(results[0])
    out = np.empty((n, *first.shape[1:]), dtype=first.dtype)
    filled = np.zeros(n, dtype=bool)
    for idx, res in zip(batches, results, strict=True):
        if filled[idx].any():
            raise AssertionError("a row was returned twice by the batching")
        out[idx] = res
        filled[idx] = True
    if not filled.all():
        raise AssertionError(f"{int((~filled).sum())} row(s) lost by the batching")
    return out


def run_groups(
    groups: Sequence[np.ndarray],
    run: Callable[[np.ndarray], tuple[np.ndarray, ...]],
    lengths: np.ndarray,
    progress: Callable[[int, int], None] | None = None,
) -> list[np.ndarray]:
    """Each field of `run(idx)` over groups of row indices (batches or packs), put back in input order (checked:
    every row once); `progress(rows, tokens)` after each group (`lengths`: each row's tokens)."""
    parts = []
    for idx in groups:
        parts.append(run(idx))
        if progress is not None:
            progress(len(idx), int(lengths[idx].sum()))
    return [restore_order(groups, [x[k] for x in parts], len(lengths)) for k in range(len(parts[0]))]


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
    # the store's distribution of renormalized log-probs; imported here: the store's door brings zarr and
    # polars (~0.4 s), which the backends that import this module for its batching helpers do not need
    from walla.store.scenario import softmax_rows

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
