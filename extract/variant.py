"""One prompt variant through a loaded backend: render and tokenize its prompts once, then score row ranges.

The single process (extract/run.py) and every Ray actor (extract/distributed.py) compute rows with
these two functions, so a feature set's bytes do not depend on how many workers filled it.
"""

from __future__ import annotations

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


def score_range(
    backend: Backend, prepared: PreparedVariant, a: int, b: int, advance: Progress | None = None
) -> tuple[pl.DataFrame, np.ndarray]:
    """Rows a..b-1 of a prepared variant: (store rows, hidden [b - a, H])."""
    chunk = prepared.prompts[a:b]
    res = backend.score([p.text for p in chunk], prepared.token_ids, advance)
    return feature_rows(chunk, res, prepared.token_col), res.hidden


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
