"""Row contract of a feature set's rows.parquet: dtypes of schema.ROW_COLUMNS and the per-shard checks
the writer runs before anything reaches disk (one error naming the question and column).
"""

from __future__ import annotations

import numpy as np
import polars as pl
from walla.store.schema import OPTIONAL_ROW_COLUMNS, ROW_COLUMNS

LOGSUMEXP_TOL = 1e-3  # option_logprobs must be renormalized over the options

ROW_DTYPES: dict[str, pl.DataType] = {
    "question_id": pl.String(),
    "n_options": pl.Int32(),
    "option_logprobs": pl.List(pl.Float32()),
    "raw_option_logprobs": pl.List(pl.Float32()),
    "prompt_nll": pl.Float32(),
    "n_prompt_tokens": pl.Int32(),
    "context_source_id": pl.String(),
    "prompt": pl.String(),  # optional
}
assert list(ROW_DTYPES) == [*ROW_COLUMNS, *OPTIONAL_ROW_COLUMNS]


def validate_rows(rows: pl.DataFrame, variant: str, where: str = "rows") -> pl.DataFrame:
    """Check one shard of rows against schema.ROW_COLUMNS (+ optional columns); return it cast.

    Raises:
        ValueError: naming the first offending question and column.
    """
    cols = list(rows.columns)
    base = list(ROW_COLUMNS)
    if cols[: len(base)] != base or any(c not in OPTIONAL_ROW_COLUMNS for c in cols[len(base) :]):
        raise ValueError(
            f"{where}: columns {cols}; expected {base} in this order, optionally followed by {list(OPTIONAL_ROW_COLUMNS)}"
        )
    if rows.height == 0:
        raise ValueError(f"{where}: empty shard")
    try:
        rows = rows.select([pl.col(c).cast(ROW_DTYPES[c], strict=True) for c in cols])
    except Exception as e:  # polars raises several exception types for bad casts
        raise ValueError(
            f"{where}: a column has the wrong type ({e.__class__.__name__}: {str(e).splitlines()[0]})"
        ) from e

    def fail(mask: pl.Series | np.ndarray, what: str) -> None:
        idx = np.flatnonzero(np.asarray(mask))
        if idx.size:
            raise ValueError(f"{where}: question {rows['question_id'][int(idx[0])]!r}: {what}")

    for c in cols:
        if c != "context_source_id" and rows[c].null_count():
            fail(rows[c].is_null().to_numpy(), f"{c} is null")
    if rows["question_id"].n_unique() != rows.height:
        fail(rows["question_id"].is_duplicated().to_numpy(), "question_id appears twice in the shard")
    k = rows["n_options"].to_numpy()
    fail(k < 2, "n_options must be >= 2")
    for c in ("option_logprobs", "raw_option_logprobs"):
        fail(rows[c].list.len().to_numpy() != k, f"{c} has a length different from n_options")
    lp = rows["option_logprobs"].explode().to_numpy().astype(np.float64)
    fail_idx = np.repeat(np.arange(rows.height), k)
    if not np.isfinite(lp).all():
        fail(np.isin(np.arange(rows.height), fail_idx[~np.isfinite(lp)]), "option_logprobs has NaN/inf")
    lse = np.full(rows.height, -np.inf)
    np.logaddexp.at(lse, fail_idx, lp)
    fail(
        np.abs(lse) > LOGSUMEXP_TOL, "option_logprobs are not renormalized over the options (logsumexp != 0)"
    )
    raw = rows["raw_option_logprobs"].explode().to_numpy()
    if np.isnan(raw).any():
        fail(np.isin(np.arange(rows.height), fail_idx[np.isnan(raw)]), "raw_option_logprobs has NaN")
    nll = rows["prompt_nll"].to_numpy()
    fail(~np.isfinite(nll) | (nll < 0), "prompt_nll must be finite and >= 0")
    fail(rows["n_prompt_tokens"].to_numpy() < 1, "n_prompt_tokens must be >= 1")
    src = rows["context_source_id"]
    if variant == "irrelevant":
        fail(src.is_null().to_numpy(), "irrelevant variant rows must record context_source_id")
        fail(
            (src == rows["question_id"]).to_numpy(),
            "context_source_id is the question itself (not irrelevant)",
        )
    elif variant == "none":
        fail(
            src.is_not_null().to_numpy(),
            "the none variant shows no context, so context_source_id must be null",
        )
    else:
        fail(
            (src.is_not_null() & (src != rows["question_id"])).to_numpy(),
            "the relevant variant shows the question's own context; context_source_id must be null or itself",
        )
    return rows
