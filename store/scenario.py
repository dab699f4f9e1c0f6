"""Scenario assembly: a scenario manifest + the store -> the arrays every method consumes.

The ScenarioData fields below are the contract between the store and stages 2-3.

    entry = load_spec("demo-hetero-facts")           # store/spec.py
    data = assemble_scenario(entry, Path("walla-store"))    # ScenarioData, N questions x M agents

Assembly reads only the feature sets the scenario uses -- per (model, dataset, variant) one, so M
copies of one model read the same two (none + relevant) -- and routes, per question and slot, the
variant chosen by the context rule (store/routing.py). Hidden states are copied once, straight from
the chunk files into the preallocated [N, H] output of each slot (store/hidden_io.py).
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
from walla.store import routing
from walla.store.catalog import DatasetEntry, ModelEntry, load_datasets, load_models
from walla.store.featureset import (
    FeatureSet,
    StoreError,
    extract_command,
    read_feature_set,
)
from walla.store.hidden_fill import fill_hidden
from walla.store.location import as_location
from walla.store.questions import read_question_table
from walla.store.scenario_data import ScenarioData
from walla.store.schema import SPLITS, VARIANT_CODE
from walla.store.select import raise_missing, select_feature_sets
from walla.store.spec import ScenarioSpec
from walla.store.validate import to_dict

# ---------------------------------------------------------------------------------------------------------
# assembly

COPY_THREADS = 4  # threads copying blocks into the slots' outputs (capped by CPU count and M)


@dataclass
class _Part:
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
) -> _Part:
    fs = {key: read_feature_set(path) for key, path in chosen.items()}
    qfps = {f.meta["questions_fp"] for f in fs.values()}
    assert len(qfps) == 1, qfps  # _select guarantees it
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
    return _Part(dataset, dentry, used, source_split, qfp, offset, fs, src)


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


def _dense(col: pl.Series, k: np.ndarray, width: int, fill: float) -> np.ndarray:
    """A list column with row lengths k -> [n, width] float64, padded with `fill`."""
    flat = col.explode().to_numpy().astype(np.float64)
    n = len(k)
    assert flat.size == int(k.sum()), "list lengths differ from n_options"
    out = np.full((n, width), fill)
    rows = np.repeat(np.arange(n), k)
    cols = np.arange(flat.size) - np.repeat(np.cumsum(k) - k, k)
    out[rows, cols] = flat
    return out


def _softmax_rows(lp: np.ndarray) -> np.ndarray:
    """Option distribution from renormalized log-probs [n, K] (-inf on absent options)."""
    e = np.exp(lp - lp.max(axis=1, keepdims=True))  # [n, K]
    return e / e.sum(axis=1, keepdims=True)


def _compute(agents, tokens: np.ndarray, params: dict) -> dict | None:
    """Per agent slot: mean prompt tokens per test question and forward FLOPs (2 x params x tokens)."""
    if not tokens.size or not tokens.any():
        return None
    out = []
    for s, a in enumerate(agents):
        tpq = float(tokens[:, s].mean())
        out.append({"model": a, "tokens_per_question": tpq,
                    "flops_per_question": 2.0 * params[a] * tpq if params.get(a) else None})  # fmt: skip
    return {"agents": out, "source": "feature sets' n_prompt_tokens and meta.json compute"}


def assemble_scenario(
    entry: ScenarioSpec,
    store: Path,
    *,
    datasets: dict[str, DatasetEntry] | None = None,
    models: dict[str, ModelEntry] | None = None,
) -> ScenarioData:
    """Build the ScenarioData of a scenario from the feature sets in `store`.

    Args:
        entry: the scenario (load_scenario).
        store: store root.
        datasets: dataset table (default: the package's datasets.yaml).
        models: model table (default: the package's models.yaml); hidden sizes are checked against it.
    Returns:
        ScenarioData over every question of the used splits (OOD: train/val of `dataset`, then all rows of
        `eval_dataset` as test); `meta` records the manifest, the context seed and per-split assignment
        counts, and every feature set used.
    Raises:
        StoreError: missing feature sets (with the `make extract ...` commands that create them),
            incomplete/stale/inconsistent feature sets, or a bad irrelevant-context source.
    """
    t0 = time.perf_counter()
    store = as_location(store)  # a directory, or an fsspec URL (store/location.py)
    datasets = datasets if datasets is not None else load_datasets()
    for key in ("dataset", "eval_dataset"):
        name = getattr(entry, key)
        if name is not None and name not in datasets:
            raise KeyError(
                f"scenario {entry.name!r}: {key} {name!r} is not in datasets.yaml ({', '.join(datasets)})"
            )
    model_table = models if models is not None else load_models()
    m = entry.n_agents
    unique = list(dict.fromkeys(entry.agents))  # model names, slot order
    variants = routing.variants_needed(entry.context_rule, m)
    plan = [(entry.dataset, SPLITS if entry.eval_dataset is None else ("train", "val"), False)]
    if entry.eval_dataset is not None:
        plan.append((entry.eval_dataset, SPLITS, True))

    missing: list = []
    notes: list[str] = []
    chosen = [select_feature_sets(store, d, unique, variants, missing, notes) for d, _, _ in plan]
    if missing:
        raise_missing(entry, store, missing)
    parts, offset = [], 0
    for (d, keep, force_test), ch in zip(plan, chosen, strict=True):
        parts.append(_load_part(store, d, datasets[d], ch, keep, force_test, offset))
        offset += parts[-1].n
    hidden_size = {model: parts[0].fs[(model, variants[0])].hidden_size for model in unique}
    for p in parts:
        for (model, _), f in p.fs.items():
            want = model_table[model].hidden_size if model in model_table else hidden_size[model]
            if f.hidden_size != want:
                raise StoreError(
                    f"feature set {f.path} has hidden size {f.hidden_size}, expected {want} for model {model!r} "
                    "(models.yaml / its other feature sets); was it extracted from another model?"
                )
    t_load = time.perf_counter()
    soft = {p.entry.soft_target for p in parts}
    if len(soft) > 1:
        raise ValueError(
            f"scenario {entry.name!r}: {entry.dataset} and {entry.eval_dataset} disagree on soft_target"
        )
    soft_target = soft.pop()

    n = offset
    q = pl.concat([p.questions for p in parts], how="vertical")
    split = q["split"].to_numpy().astype(str)  # [N]
    n_options = q["options"].list.len().to_numpy().astype(np.int64)  # [N]
    k = int(n_options.max())
    option_mask = np.arange(k)[None, :] < n_options[:, None]  # [N, K]
    label = q["label"].to_numpy().astype(np.int64)  # [N]
    if soft_target:
        if q["gold_dist"].null_count():
            bad = q.filter(pl.col("gold_dist").is_null())["question_id"][0]
            raise StoreError(
                f"dataset {entry.dataset!r} is soft_target but question {bad!r} has no gold_dist"
            )
        target = _dense(q["gold_dist"], n_options, k, 0.0).astype(np.float32)  # [N, K]
    else:
        target = np.zeros((n, k), np.float32)
        target[np.arange(n), label] = 1.0
    variant = routing.assign(split, m, entry.context_rule, entry.context_seed)  # [N, M] int8

    # per-agent option distributions, prompt NLL, prompts
    probs = np.zeros((n, m, k), np.float32)  # [N, M, K]
    prompt_nll = np.zeros((n, m), np.float32)  # [N, M]
    with_prompts = all("prompt" in f.rows.columns for p in parts for f in p.fs.values())
    prompts = [np.empty(n, dtype=object) for _ in range(m)] if with_prompts else None
    tokens = np.zeros((n, m))  # [N, M] prompt tokens each agent processed (compute accounting)
    params: dict[str, float | None] = {}  # model -> non-embedding parameters (None: not recorded)
    for p in parts:
        rows = slice(p.offset, p.offset + p.n)
        for (model, v), f in p.fs.items():
            s_idx = p.src[(model, v)]
            k_f = f.rows["n_options"].to_numpy().astype(np.int64)
            dist = _softmax_rows(_dense(f.rows["option_logprobs"], k_f, k, -np.inf))[s_idx]  # [n_p, K]
            nll = f.rows["prompt_nll"].to_numpy()[s_idx]  # [n_p]
            text = np.array(f.rows["prompt"].to_list(), dtype=object)[s_idx] if with_prompts else None
            ntok = (
                f.rows["n_prompt_tokens"].to_numpy()[s_idx] if "n_prompt_tokens" in f.rows.columns else None
            )
            params.setdefault(model, (f.meta.get("compute") or {}).get("n_params_non_embedding"))
            for s, a in enumerate(entry.agents):
                if a != model:
                    continue
                sel = variant[rows, s] == VARIANT_CODE[v]  # [n_p]
                dst = np.flatnonzero(sel) + p.offset
                probs[dst, s] = dist[sel]
                prompt_nll[dst, s] = nll[sel]
                if ntok is not None:
                    tokens[dst, s] = ntok[sel]
                if prompts is not None:
                    prompts[s][dst] = text[sel]

    t_arrays = time.perf_counter()
    # hidden states: one [N, H] array per slot, filled block by block straight from the chunk files
    hidden = [np.empty((n, hidden_size[a]), np.float16) for a in entry.agents]  # [M] x [N, H_i]
    with ThreadPoolExecutor(max_workers=max(1, min(COPY_THREADS, os.cpu_count() or 1, m))) as pool:
        for p in parts:
            for model in unique:
                slots = [s for s, a in enumerate(entry.agents) if a == model]
                budget = sum(hidden[s].nbytes for s in slots) // 20  # buffers <= 5% of this model's output
                fill_hidden(hidden, slots, model, variant, p, budget, pool)

    t_hidden = time.perf_counter()
    fingerprints, used = {}, {}
    for i, p in enumerate(parts):
        for (model, v), f in p.fs.items():
            fingerprints[f"{model}/{v}" if i == 0 else f"{model}/{p.dataset}/{v}"] = f.fingerprint
            used[f"{model}/{p.dataset}/{v}"] = {
                "fingerprint": f.fingerprint,
                "path": str(f.path),
                "created_at": f.meta.get("created_at"),
                "n_rows": f.meta["n_rows"],
                "hidden_size": f.hidden_size,
                "questions_fp": f.meta["questions_fp"],
            }
    meta = {
        "scenario": to_dict(entry),
        "store": str(store),
        "context_rule": entry.context_rule,
        "context_seed": entry.context_seed,
        "assignment": routing.assignment_counts(split, variant),
        "feature_sets": used,
        "question_tables": {p.dataset: p.questions_fp for p in parts},
        "parts": [{"dataset": p.dataset, "offset": p.offset, "n": p.n} for p in parts],
        "notes": notes,
        "compute": _compute(entry.agents, tokens[split == "test"], params),
        "n_questions": n,
        "n_options_max": k,
        "timing_s": {  # where assembly spent its time
            "open": round(t_load - t0, 3),
            "probs": round(t_arrays - t_load, 3),
            "hidden": round(t_hidden - t_arrays, 3),
            "total": round(time.perf_counter() - t0, 3),
        },
    }
    return ScenarioData(
        name=entry.name,
        dataset=entry.dataset if entry.eval_dataset is None else f"{entry.dataset}+{entry.eval_dataset}",
        agents=list(entry.agents),
        question_id=q["question_id"].to_numpy().astype(str),
        split=split,
        question=q["question"].to_list(),
        prompts=[list(pr) for pr in prompts] if prompts is not None else None,
        n_options=n_options,
        option_mask=option_mask,
        probs=probs,
        label=label,
        target=target,
        soft_target=soft_target,
        prompt_nll=prompt_nll,
        variant=variant,
        hidden=hidden,
        fingerprints=fingerprints,
        meta=meta,
    )
