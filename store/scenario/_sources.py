"""The feature sets a scenario reads, opened and checked: one Part per dataset (two for OOD scenarios).

    check_datasets(spec, datasets)                                      # the spec's datasets are catalogued
    parts, notes = open_parts(spec, store, datasets, models, variants)  # every missing set named at once
    sizes = hidden_sizes(parts, models, variants[0], model_table)       # per model, checked against models.yaml

A Part knows which rows of which feature sets each of its questions comes from (`src`); building the
arrays from them is store/scenario/_assemble.py. Every inconsistency between feature sets and the question table
(other questions, other option counts, an irrelevant context from the wrong question) is refused here,
with the command that fixes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import polars as pl
from walla.store.features import FeatureSet, StoreError, extract_command, read_feature_set
from walla.store.questions import read_question_table
from walla.store.scenario._select import raise_missing, select_feature_sets
from walla.store.schema import SPLITS

if TYPE_CHECKING:  # types only: the store reads no manifest (walla.manifests reads them for it)
    from walla.manifests.catalog import DatasetEntry, ModelEntry
    from walla.manifests.scenario import ScenarioSpec


@dataclass
class Part:
    """One dataset's rows of the scenario (two parts for OOD scenarios: train/val of `dataset`, then test)."""

    dataset: str
    entry: DatasetEntry
    questions: pl.DataFrame  # rows used, scenario order; `split` already forced to test for OOD eval rows
    source_split: np.ndarray  # [n] the question table's own split (irrelevant-context check)
    questions_fp: str
    offset: int  # first scenario row of this part
    fs: dict[tuple[str, str], FeatureSet]  # (model, variant) -> feature set
    src: dict[tuple[str, str], np.ndarray]  # (model, variant) -> [n] row of each question in that feature set

    @property
    def n(self) -> int:
        return self.questions.height


def _load_part(
    store: Path,
    dataset: str,
    dentry: DatasetEntry,
    chosen: dict,
    keep: tuple[str, ...],
    force_test: bool,
    offset: int,
) -> Part:
    fs = {key: read_feature_set(path) for key, path in chosen.items()}
    qfps = {f.meta["questions_fp"] for f in fs.values()}
    assert len(qfps) == 1, qfps  # select_feature_sets picks one question table
    qfp = qfps.pop()
    q, _ = read_question_table(store, dataset, qfp)
    first_key = next(iter(fs))
    ids = fs[first_key].rows["question_id"]
    for f in fs.values():
        other = f.rows["question_id"]
        if other.len() != ids.len() or not other.sort().equals(ids.sort()):
            raise StoreError(
                f"feature sets {fs[first_key].path} and {f.path} cover different questions "
                f"({ids.len()} vs {other.len()} rows); re-extract both with the same row selection (e.g. --limit)"
            )
    unknown = ids.filter(~ids.is_in(q["question_id"].implode()))
    if unknown.len():
        raise StoreError(
            f"feature set {fs[first_key].path} has question {unknown[0]!r} that is not in question table {qfp}"
        )
    used = q.filter(pl.col("question_id").is_in(ids.implode()) & pl.col("split").is_in(list(keep)))
    if used.height == 0:
        raise StoreError(
            f"dataset {dataset!r} has no rows in splits {keep} in the feature sets of this scenario"
        )
    source_split = used["split"].to_numpy().astype(str)
    if force_test:
        used = used.with_columns(split=pl.lit("test"))
    k_q = used["options"].list.len().to_numpy()
    src = {}
    for key, f in fs.items():
        pos = pl.DataFrame(
            {"question_id": f.rows["question_id"], "_src": np.arange(f.rows.height, dtype=np.int64)}
        )
        s = (
            used.select("question_id")
            .join(pos, on="question_id", how="left", maintain_order="left")["_src"]
            .to_numpy()
        )
        k_f = f.rows["n_options"].to_numpy()[s]
        if not np.array_equal(k_f, k_q):
            i = int(np.flatnonzero(k_f != k_q)[0])
            raise StoreError(
                f"feature set {f.path}: question {used['question_id'][i]!r} has {k_f[i]} options, the question "
                f"table {qfp} says {k_q[i]}; re-extract it"
            )
        if key[1] == "irrelevant":
            _check_irrelevant(f, s, used["question_id"], source_split, q)
        src[key] = s
    return Part(dataset, dentry, used, source_split, qfp, offset, fs, src)


def _check_irrelevant(
    f: FeatureSet, src: np.ndarray, qids: pl.Series, split: np.ndarray, q: pl.DataFrame
) -> None:
    """Every irrelevant context must come from a different question of the same split (SPEC §3.3)."""
    shown = pl.DataFrame(
        {"question_id": qids, "split": split, "source": f.rows["context_source_id"].gather(src)}
    )
    table = q.select(pl.col("question_id").alias("source"), pl.col("split").alias("source_split"))
    j = shown.join(table, on="source", how="left", maintain_order="left")
    bad = j.filter(
        pl.col("source").is_null()
        | (pl.col("source") == pl.col("question_id"))
        | pl.col("source_split").is_null()
        | (pl.col("source_split") != pl.col("split"))
    )
    if bad.height:
        r = bad.row(0, named=True)
        raise StoreError(
            f"irrelevant feature set {f.path}: question {r['question_id']!r} ({r['split']}) was shown the context of "
            f"{r['source']!r} ({r['source_split']}); it must come from another question of the same split. "
            f"Re-extract: `{extract_command(f.meta['model'], f.meta['dataset'], 'irrelevant')}`"
        )


def check_datasets(spec: ScenarioSpec, datasets: dict[str, DatasetEntry]) -> None:
    for key in ("dataset", "eval_dataset"):
        name = getattr(spec, key)
        if name is not None and name not in datasets:
            raise KeyError(
                f"scenario {spec.name!r}: {key} {name!r} is not in datasets.yaml ({', '.join(datasets)})"
            )


def open_parts(
    spec: ScenarioSpec,
    store: Path,
    datasets: dict[str, DatasetEntry],
    models: list[str],
    variants: tuple[str, ...],
) -> tuple[list[Part], list[str]]:
    """(the scenario's parts, notes on the feature sets chosen): one part, or two for OOD scenarios.

    Every missing feature set is reported at once, with the `walla extract ...` commands that create them.
    """
    wanted = [(spec.dataset, SPLITS if spec.eval_dataset is None else ("train", "val"), False)]
    if spec.eval_dataset is not None:
        wanted.append((spec.eval_dataset, SPLITS, True))
    missing: list = []
    notes: list[str] = []
    chosen = [select_feature_sets(store, d, models, variants, missing, notes) for d, _, _ in wanted]
    if missing:
        raise_missing(spec, store, missing)
    parts, offset = [], 0
    for (d, keep, force_test), ch in zip(wanted, chosen, strict=True):
        parts.append(_load_part(store, d, datasets[d], ch, keep, force_test, offset))
        offset += parts[-1].n
    return parts, notes


def hidden_sizes(
    parts: list[Part], models: list[str], variant: str, table: dict[str, ModelEntry]
) -> dict[str, int]:
    """Hidden size per model, checked across its feature sets and against models.yaml."""
    hidden_size = {model: parts[0].fs[(model, variant)].hidden_size for model in models}
    for p in parts:
        for (model, _), f in p.fs.items():
            want = table[model].hidden_size if model in table else hidden_size[model]
            if f.hidden_size != want:
                raise StoreError(
                    f"feature set {f.path} has hidden size {f.hidden_size}, expected {want} for model {model!r} "
                    "(models.yaml / its other feature sets); was it extracted from another model?"
                )
    return hidden_size
