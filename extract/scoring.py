"""Backend-independent pieces of extraction: option-token resolution (SPEC §1.5), renormalization
over a question's options, and length-bucketed batching that restores input order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


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
