"""One prompt variant through a loaded backend: render and tokenize its prompts once, then score row ranges.

The single process (extract/run.py) and every Ray actor (extract/distributed.py) compute rows with
these functions, so a feature set's bytes do not depend on how many workers filled it: a range is scored
in calls cut at multiples of the shard rows, so the same prompts share a call (and, where scoring is not
batch-invariant, a forward pass) however the rows were handed out or resumed.

`score_and_write` keeps a GPU busy between calls: with `overlap`, ONE background thread tokenizes the next
piece and writes the previous one to the store while the device runs the current one. Writes stay in
order and each is one durable shard (store/features/_writer.py), so a crash loses at most the pieces not yet
written and never stores a row twice.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np
import polars as pl
from walla.extract.backends import Backend, Progress, ScoreResult
from walla.extract.prompts import PromptTemplate, RenderedPrompt, build_prompts
from walla.extract.scoring import renormalize, resolve_option_token_ids


@dataclass(frozen=True)
class PreparedVariant:
    """A variant's prompts as this backend sees them, and the option tokens every row is scored on."""

    prompts: list[RenderedPrompt]  # formatted by the backend (chat template or raw text), table order
    token_ids: list[int]  # [U] token id of each option string of the variant (their union)
    token_col: dict[str, int]  # option string -> its column in token_ids


def prepare_variant(
    backend: Backend,
    table: pl.DataFrame,
    template: PromptTemplate,
    variant: str,
    option_tokens: list[str] | None,
    seed: int,
) -> PreparedVariant:
    """Render the prompts of one variant and resolve its option tokens with the backend's tokenizer."""
    prompts = build_prompts(table, template, variant, option_tokens=option_tokens, seed=seed)
    prompts = [replace(p, text=backend.format_prompt(p.text)) for p in prompts]
    union = list(dict.fromkeys(s for p in prompts for s in p.options))
    tok_of = resolve_option_token_ids(backend.encode, backend.encode_bare, prompts[0].text, union)
    return PreparedVariant(prompts, [tok_of[s] for s in union], {s: i for i, s in enumerate(union)})


def call_ranges(a: int, b: int, call_rows: int | None) -> list[tuple[int, int]]:
    """[a, b) cut at multiples of `call_rows` (one score() call each); the whole range when None."""
    if not call_rows:
        return [(a, b)]
    cuts = [a, *range((a // call_rows + 1) * call_rows, b, call_rows), b]
    return list(zip(cuts[:-1], cuts[1:], strict=True))


def encode_range(backend: Backend, prepared: PreparedVariant, a: int, b: int) -> list[list[int]]:
    """Token ids of rows a..b-1, computed ahead of `score` (every backend takes them: `encode_batch`)."""
    return backend.encode_batch([p.text for p in prepared.prompts[a:b]])


def score_range(
    backend: Backend,
    prepared: PreparedVariant,
    a: int,
    b: int,
    advance: Progress | None = None,
    call_rows: int | None = None,
    enc: list[list[int]] | None = None,
) -> tuple[pl.DataFrame, np.ndarray]:
    """Rows a..b-1 of a prepared variant: (store rows, hidden [b - a, H]), scored in `call_ranges`.

    `enc`: the rows' token ids from `encode_range`, computed ahead.
    """
    results = []
    for s, e in call_ranges(a, b, call_rows):
        texts = [p.text for p in prepared.prompts[s:e]]
        ahead = None if enc is None else enc[s - a : e - a]
        results.append(backend.score(texts, prepared.token_ids, advance, enc=ahead))
    res = results[0] if len(results) == 1 else _concat(results)
    return feature_rows(prepared.prompts[a:b], res, prepared.token_col), res.hidden


def _concat(results: list[ScoreResult]) -> ScoreResult:
    return ScoreResult(
        *(
            np.concatenate([getattr(r, f) for r in results])
            for f in ("raw_logprobs", "hidden", "prompt_nll", "n_tokens")
        )
    )


Write = Callable[[int, pl.DataFrame, np.ndarray], None]  # (first row, store rows, hidden): one durable shard


def score_and_write(
    backend: Backend,
    prepared: PreparedVariant,
    pieces: list[tuple[int, int]],
    write: Write,
    advance: Progress | None = None,
    call_rows: int | None = None,
    overlap: bool = False,
) -> None:
    """Score each piece [a, b) and `write` it, in order; with `overlap` (a GPU: the host is otherwise idle
    while it computes) tokenizing the next piece and writing the previous one run in one background thread.

    On any exception the thread finishes what it started (a write in flight becomes durable) before the
    exception propagates; a failed write is raised at the next piece at the latest.
    """
    if not overlap:
        for a, b in pieces:
            write(a, *score_range(backend, prepared, a, b, advance, call_rows))
        return
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="walla-extract-io") as io:
        written: Future | None = None
        encoded = io.submit(encode_range, backend, prepared, *pieces[0]) if pieces else None
        for i, (a, b) in enumerate(pieces):
            enc = encoded.result()
            if i + 1 < len(pieces):  # queued behind the previous write: both overlap this piece's scoring
                encoded = io.submit(encode_range, backend, prepared, *pieces[i + 1])
            rows, hidden = score_range(backend, prepared, a, b, advance, call_rows, enc)
            if written is not None:
                written.result()  # the previous write's error, if any, before the next is queued
            written = io.submit(write, a, rows, hidden)
        if written is not None:
            written.result()


def feature_rows(
    prompts: list[RenderedPrompt], result: ScoreResult, token_col: dict[str, int]
) -> pl.DataFrame:
    """One shard of rows (schema.ROW_COLUMNS + prompt) from a backend result."""
    raw_rows, opt_rows = [], []
    for i, p in enumerate(prompts):
        raw = result.raw_logprobs[i, [token_col[s] for s in p.options]]  # [K_q]
        raw_rows.append(raw.astype(np.float32).tolist())
        opt_rows.append(renormalize(raw).tolist())
    return pl.DataFrame(
        {
            "question_id": [p.question_id for p in prompts],
            "n_options": pl.Series([len(p.options) for p in prompts], dtype=pl.Int32),
            "option_logprobs": pl.Series(opt_rows, dtype=pl.List(pl.Float32)),
            "raw_option_logprobs": pl.Series(raw_rows, dtype=pl.List(pl.Float32)),
            "prompt_nll": pl.Series(result.prompt_nll, dtype=pl.Float32),
            "n_prompt_tokens": pl.Series(result.n_tokens, dtype=pl.Int32),
            "context_source_id": pl.Series([p.context_source_id for p in prompts], dtype=pl.String),
            "prompt": [p.text for p in prompts],
        }
    )
