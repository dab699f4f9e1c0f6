"""Synthetic question tables and feature sets for the store tests (no LLM: seeded numbers).

Hidden rows are tagged so tests can see where assembly took them from:
    hidden[:, 0] = variant code, hidden[:, 1] = question index % 2048, hidden[:, 2] = question index // 2048,
    hidden[:, 3] = model tag; the rest is seeded noise. (float16 holds integers <= 2048 exactly.)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
from walla.store.features import FeatureSetSpec, open_writer
from walla.store.questions import write_question_table
from walla.store.schema import SPLITS, VARIANT_CODE


def make_questions(
    n: int,
    *,
    seed: int = 0,
    k_min: int = 2,
    k_max: int = 2,
    soft: bool = False,
    context: bool = True,
    prefix: str = "q",
) -> pl.DataFrame:
    """A valid canonical question table with n rows, option counts in [k_min, k_max], splits ~8:1:1."""
    rng = np.random.default_rng(seed)
    k = rng.integers(k_min, k_max + 1, size=n)
    split = np.array(SPLITS)[rng.choice(3, size=n, p=[0.8, 0.1, 0.1])]
    label = np.array([rng.integers(0, kk) for kk in k])
    gold = None
    if soft:
        gold = []
        for kk, lab in zip(k, label, strict=True):
            g = rng.dirichlet(np.ones(kk))
            g = np.sort(g)[::-1][np.argsort(np.argsort(-np.eye(kk)[lab]))]  # put the max on the label
            gold.append((g / g.sum()).tolist())
    return pl.DataFrame(
        {
            "question_id": [f"{prefix}{i:05d}" for i in range(n)],
            "split": split.tolist(),
            "question": [f"question {i}?" for i in range(n)],
            "options": [[f"opt{j}" for j in range(kk)] for kk in k],
            "option_labels": [[chr(65 + j) for j in range(kk)] for kk in k],
            "label": label.tolist(),
            "gold_dist": gold if soft else [None] * n,
            "context": [f"context {i}" if context else None for i in range(n)],
            "subject": [None] * n,
        },
        schema_overrides={"gold_dist": pl.List(pl.Float64)},
    )


def irrelevant_sources(q: pl.DataFrame, seed: int = 0) -> list[str]:
    """For each question, another question of the same split (a seeded rotation within each split)."""
    rng = np.random.default_rng(seed)
    ids = np.array(q["question_id"].to_list(), dtype=object)
    src = ids.copy()
    split = np.array(q["split"].to_list())
    for s in SPLITS:
        idx = np.flatnonzero(split == s)
        if idx.size >= 2:
            perm = rng.permutation(idx)
            src[perm] = ids[np.roll(perm, 1)]
    return src.tolist()


def make_rows(
    q: pl.DataFrame,
    variant: str,
    *,
    model_tag: int = 0,
    hidden_size: int = 8,
    seed: int = 0,
    prompt: bool = False,
) -> tuple[pl.DataFrame, np.ndarray]:
    """Rows (schema.ROW_COLUMNS) and tagged hidden states [n, H] for one feature set."""
    n = q.height
    rng = np.random.default_rng([seed, model_tag, VARIANT_CODE[variant]])
    k = q["options"].list.len().to_numpy()
    logits = [rng.standard_normal(kk) for kk in k]
    lp = [(x - np.log(np.exp(x).sum())).astype(np.float32).tolist() for x in logits]
    raw = [[v - 2.0 for v in row] for row in lp]
    src = irrelevant_sources(q, seed) if variant == "irrelevant" else [None] * n
    cols = {
        "question_id": q["question_id"],
        "n_options": k.astype(np.int32),
        "option_logprobs": lp,
        "raw_option_logprobs": raw,
        "prompt_nll": rng.uniform(0.5, 3.0, n).astype(np.float32),
        "n_prompt_tokens": rng.integers(5, 50, n).astype(np.int32),
        "context_source_id": pl.Series(src, dtype=pl.String),
    }
    if prompt:
        cols["prompt"] = [f"[{variant}] question {i}?" for i in range(n)]
    rows = pl.DataFrame(cols)
    hidden = rng.standard_normal((n, hidden_size)).astype(np.float16)  # [n, H]
    idx = np.arange(n)
    hidden[:, 0] = VARIANT_CODE[variant]
    hidden[:, 1] = idx % 2048
    hidden[:, 2] = idx // 2048
    hidden[:, 3] = model_tag
    return rows, hidden


def write_feature_set(
    store: Path,
    model: str,
    dataset: str,
    variant: str,
    q: pl.DataFrame,
    qfp: str,
    *,
    model_tag: int = 0,
    hidden_size: int = 8,
    shard: int = 32,
    chunk_rows: int | None = None,
    extra_inputs: dict | None = None,
    prompt: bool = False,
) -> Path:
    rows, hidden = make_rows(q, variant, model_tag=model_tag, hidden_size=hidden_size, prompt=prompt)
    spec = FeatureSetSpec(
        model, dataset, variant, {"questions_fp": qfp, "model_tag": model_tag, **(extra_inputs or {})}
    )
    with open_writer(
        store, spec, hidden_size=hidden_size, total_rows=rows.height, chunk_rows=chunk_rows
    ) as w:
        for s in range(w.done_rows, rows.height, shard):
            w.write_shard(rows[s : s + shard], hidden[s : s + shard])
        return w.commit()


def build_store(
    store: Path, dataset: str, q: pl.DataFrame, models: dict[str, int], variants: list[str], **kw
) -> str:
    """Write the question table and one feature set per (model, variant); return the question-table fp."""
    qfp = write_question_table(store, dataset, q, {"synthetic": True})
    for model, tag in models.items():
        for v in variants:
            write_feature_set(store, model, dataset, v, q, qfp, model_tag=tag, **kw)
    return qfp
