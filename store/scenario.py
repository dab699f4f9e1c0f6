"""Scenario assembly: a scenario manifest + the store -> the arrays every method consumes.

The ScenarioData fields below are the contract between the store and stages 2-3.

    scenario = read_scenario("demo-hetero-facts")           # walla.manifests.scenario
    data = assemble_scenario(scenario, Path("walla-store"))  # ScenarioData, N questions x M agents

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
from typing import TYPE_CHECKING

import numpy as np
import polars as pl
from walla.store import routing
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

if TYPE_CHECKING:  # types only: the store reads no manifest (walla.manifests reads them for it)
    from walla.manifests.catalog import DatasetEntry, ModelEntry
    from walla.manifests.scenario import Scenario, ScenarioSpec

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
        flops = 2.0 * params[a] * tpq if params.get(a) else None
        out.append({"model": a, "tokens_per_question": tpq, "flops_per_question": flops})
    return {"agents": out, "source": "feature sets' n_prompt_tokens and meta.json compute"}


def _check_datasets(spec: ScenarioSpec, datasets: dict[str, DatasetEntry]) -> None:
    for key in ("dataset", "eval_dataset"):
        name = getattr(spec, key)
        if name is not None and name not in datasets:
            raise KeyError(
                f"scenario {spec.name!r}: {key} {name!r} is not in datasets.yaml ({', '.join(datasets)})"
            )


def _open_parts(
    spec: ScenarioSpec,
    store: Path,
    datasets: dict[str, DatasetEntry],
    models: list[str],
    variants: tuple[str, ...],
) -> tuple[list[_Part], list[str]]:
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


def _hidden_sizes(
    parts: list[_Part], models: list[str], variant: str, table: dict[str, ModelEntry]
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


@dataclass
class _Questions:
    """The question axis of a scenario: every part's rows, in scenario order."""

    table: pl.DataFrame  # the rows used (question table columns)
    split: np.ndarray  # [N] str
    n_options: np.ndarray  # [N] int64
    option_mask: np.ndarray  # [N, K] bool
    label: np.ndarray  # [N] int64
    target: np.ndarray  # [N, K] float32: gold_dist (soft targets) or one-hot label
    soft_target: bool

    @property
    def n(self) -> int:
        return len(self.split)

    @property
    def k(self) -> int:
        return self.option_mask.shape[1]


def _questions(spec: ScenarioSpec, parts: list[_Part]) -> _Questions:
    soft = {p.entry.soft_target for p in parts}
    if len(soft) > 1:
        raise ValueError(
            f"scenario {spec.name!r}: {spec.dataset} and {spec.eval_dataset} disagree on soft_target"
        )
    soft_target = soft.pop()
    q = pl.concat([p.questions for p in parts], how="vertical")
    n = q.height
    split = q["split"].to_numpy().astype(str)  # [N]
    n_options = q["options"].list.len().to_numpy().astype(np.int64)  # [N]
    k = int(n_options.max())
    option_mask = np.arange(k)[None, :] < n_options[:, None]  # [N, K]
    label = q["label"].to_numpy().astype(np.int64)  # [N]
    if soft_target:
        if q["gold_dist"].null_count():
            bad = q.filter(pl.col("gold_dist").is_null())["question_id"][0]
            raise StoreError(f"dataset {spec.dataset!r} is soft_target but question {bad!r} has no gold_dist")
        target = _dense(q["gold_dist"], n_options, k, 0.0).astype(np.float32)  # [N, K]
    else:
        target = np.zeros((n, k), np.float32)
        target[np.arange(n), label] = 1.0
    return _Questions(q, split, n_options, option_mask, label, target, soft_target)


@dataclass
class _AgentArrays:
    """What each agent slot saw of each question, routed by the context rule."""

    probs: np.ndarray  # [N, M, K] float32 option distributions
    prompt_nll: np.ndarray  # [N, M] float32
    prompts: list[np.ndarray] | None  # [M] x [N] prompt text (None: a feature set without prompts)
    tokens: np.ndarray  # [N, M] prompt tokens each agent processed (compute accounting)
    params: dict[str, float | None]  # model -> non-embedding parameters (None: not recorded)


def _agent_arrays(parts: list[_Part], agents: tuple[str, ...], variant: np.ndarray, k: int) -> _AgentArrays:
    """Per slot, the option distribution, prompt NLL, prompt and token count of its routed variant."""
    n, m = variant.shape
    probs = np.zeros((n, m, k), np.float32)  # [N, M, K]
    prompt_nll = np.zeros((n, m), np.float32)  # [N, M]
    with_prompts = all("prompt" in f.rows.columns for p in parts for f in p.fs.values())
    prompts = [np.empty(n, dtype=object) for _ in range(m)] if with_prompts else None
    tokens = np.zeros((n, m))  # [N, M]
    params: dict[str, float | None] = {}
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
            for s, a in enumerate(agents):
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
    return _AgentArrays(probs, prompt_nll, prompts, tokens, params)


def _hidden_arrays(
    parts: list[_Part],
    agents: tuple[str, ...],
    models: list[str],
    hidden_size: dict[str, int],
    variant: np.ndarray,
) -> list[np.ndarray]:
    """One [N, H] float16 array per slot, filled block by block straight from the chunk files."""
    n, m = variant.shape
    hidden = [np.empty((n, hidden_size[a]), np.float16) for a in agents]  # [M] x [N, H_i]
    with ThreadPoolExecutor(max_workers=max(1, min(COPY_THREADS, os.cpu_count() or 1, m))) as pool:
        for p in parts:
            for model in models:
                slots = [s for s, a in enumerate(agents) if a == model]
                budget = sum(hidden[s].nbytes for s in slots) // 20  # buffers <= 5% of this model's output
                fill_hidden(hidden, slots, model, variant, p, budget, pool)
    return hidden


def _feature_set_records(parts: list[_Part]) -> tuple[dict[str, str], dict[str, dict]]:
    """(fingerprint per feature set, as ScenarioData keys them; what meta records of each)."""
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
                "determinism": (f.meta.get("inputs") or {}).get("determinism"),  # tier (None: made before)
            }
    return fingerprints, used


def assemble_scenario(scenario: Scenario, store: Path) -> ScenarioData:
    """Build the ScenarioData of a scenario from the feature sets in `store`.

    Args:
        scenario: the scenario (walla.manifests.scenario.read_scenario, or a train plan's); its dataset
            table gives soft targets, its model table the hidden sizes every feature set is checked against.
        store: store root (a directory or an fsspec URL).
    Returns:
        ScenarioData over every question of the used splits (OOD: train/val of `dataset`, then all rows of
        `eval_dataset` as test); `meta` records the manifest, the context seed and per-split assignment
        counts, and every feature set used.
    Raises:
        StoreError: missing feature sets (with the `walla extract ...` commands that create them),
            incomplete/stale/inconsistent feature sets, or a bad irrelevant-context source.
    """
    t0 = time.perf_counter()
    spec = scenario.spec
    store = as_location(store)  # a directory, or an fsspec URL (store/location.py)
    _check_datasets(spec, scenario.datasets)
    models = list(dict.fromkeys(spec.agents))  # model names, slot order
    variants = routing.variants_needed(spec.context_rule, spec.n_agents)
    parts, notes = _open_parts(spec, store, scenario.datasets, models, variants)
    hidden_size = _hidden_sizes(parts, models, variants[0], scenario.models)
    t_load = time.perf_counter()
    qs = _questions(spec, parts)
    variant = routing.assign(qs.split, spec.n_agents, spec.context_rule, spec.context_seed)  # [N, M] int8
    agent = _agent_arrays(parts, spec.agents, variant, qs.k)
    t_arrays = time.perf_counter()
    hidden = _hidden_arrays(parts, spec.agents, models, hidden_size, variant)
    t_hidden = time.perf_counter()
    fingerprints, used = _feature_set_records(parts)
    meta = {
        "scenario": spec.as_dict(),
        "store": str(store),
        "context_rule": spec.context_rule,
        "context_seed": spec.context_seed,
        "assignment": routing.assignment_counts(qs.split, variant),
        "feature_sets": used,
        "question_tables": {p.dataset: p.questions_fp for p in parts},
        "parts": [{"dataset": p.dataset, "offset": p.offset, "n": p.n} for p in parts],
        "notes": notes,
        "compute": _compute(spec.agents, agent.tokens[qs.split == "test"], agent.params),
        "n_questions": qs.n,
        "n_options_max": qs.k,
        "timing_s": {  # where assembly spent its time
            "open": round(t_load - t0, 3),
            "probs": round(t_arrays - t_load, 3),
            "hidden": round(t_hidden - t_arrays, 3),
            "total": round(time.perf_counter() - t0, 3),
        },
    }
    return ScenarioData(
        name=spec.name,
        dataset=spec.dataset if spec.eval_dataset is None else f"{spec.dataset}+{spec.eval_dataset}",
        agents=list(spec.agents),
        question_id=qs.table["question_id"].to_numpy().astype(str),
        split=qs.split,
        question=qs.table["question"].to_list(),
        prompts=[list(pr) for pr in agent.prompts] if agent.prompts is not None else None,
        n_options=qs.n_options,
        option_mask=qs.option_mask,
        probs=agent.probs,
        label=qs.label,
        target=qs.target,
        soft_target=qs.soft_target,
        prompt_nll=agent.prompt_nll,
        variant=variant,
        hidden=hidden,
        fingerprints=fingerprints,
        meta=meta,
    )
