"""Scenario assembly: a scenario manifest + the store -> the arrays every method consumes.

The ScenarioData fields below are the contract between the store and stages 2-3.

    scenario = read_scenario("demo-hetero-facts")           # walla.manifests.scenario
    data = assemble_scenario(scenario, Path("walla-store"))  # ScenarioData, N questions x M agents

Assembly reads only the feature sets the scenario uses -- per (model, dataset, variant) one, so M
copies of one model read the same two (none + relevant), opened and checked by store/scenario/_sources.py --
and routes, per question and slot, the variant chosen by the context rule (store/scenario/_routing.py). Hidden
states are copied once, straight from the chunk files into the preallocated [N, H] output of each slot
(store/features/_hidden_io.py).
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
from walla.store.features import StoreError
from walla.store.location import as_location
from walla.store.scenario import _routing as routing
from walla.store.scenario._data import ScenarioData
from walla.store.scenario._hidden_fill import fill_hidden
from walla.store.scenario._sources import Part, check_datasets, hidden_sizes, open_parts
from walla.store.schema import VARIANT_CODE

if TYPE_CHECKING:  # types only: the store reads no manifest (walla.manifests reads them for it)
    from walla.manifests.scenario import Scenario, ScenarioSpec

# ---------------------------------------------------------------------------------------------------------
# assembly

COPY_THREADS = 4  # threads copying blocks into the slots' outputs (capped by CPU count and M)


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


def softmax_rows(lp: np.ndarray) -> np.ndarray:
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


def _questions(spec: ScenarioSpec, parts: list[Part]) -> _Questions:
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


def _agent_arrays(parts: list[Part], agents: tuple[str, ...], variant: np.ndarray, k: int) -> _AgentArrays:
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
            dist = softmax_rows(_dense(f.rows["option_logprobs"], k_f, k, -np.inf))[s_idx]  # [n_p, K]
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
    parts: list[Part],
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


def _feature_set_records(parts: list[Part]) -> tuple[dict[str, str], dict[str, dict]]:
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
    check_datasets(spec, scenario.datasets)
    models = list(dict.fromkeys(spec.agents))  # model names, slot order
    variants = routing.variants_needed(spec.context_rule, spec.n_agents)
    parts, notes = open_parts(spec, store, scenario.datasets, models, variants)
    hidden_size = hidden_sizes(parts, models, variants[0], scenario.models)
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
