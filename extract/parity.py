"""`walla check` (command line: extract/parity_cli.py): the same questions through each backend -> one parity
table + a JSON report.

    walla check --model smollm2-135m --dataset arc-challenge --data-file ARC-Challenge-Dev.jsonl --limit 50
    walla check ... --dtype bfloat16       # reduced precision: tolerances measured in the same run

Every backend scores the same rendered prompts (variant `none`) with the same option tokens. Rows
compare a run with the reference (hf, batched as walla extract batches):
Every row opens its backend through the one door (extract/door.py `open_for`); hf's own rows are hf backend
options, settled like any other (`max_batch_rows=1`, `batch_invariant=off`), never a loaded backend changed.
- `hf batch=1`: the same prompts one per forward pass. In reduced precision the hf backend is
  batch-invariant (extract/backends/hf/_packed.py), so this row must be bit-identical: any difference
  fails. In float32 (padded batches) it must agree to float32 rounding.
- reduced precision only, hf's own noise measured in this run (no verdict): `hf padded` (padded
  batches: the same weights and dtype, other kernel shapes) and `hf float32` (the same prompts in
  float32: the dtype's whole rounding error, since float32 rounds 2^16 times finer than bfloat16).
- `vllm`: other kernels everywhere. In float32 it must agree to fixed bounds (`TOLERANCES`, ~100x the
  measured float32 differences: max |Δlp| 5.6e-05). In reduced precision it must agree to within
  `NOISE_FACTOR` x the larger of hf's two noise rows, metric by metric: two correct bf16 computations
  of the same float32 model each sit within ~the dtype's rounding of it, so they differ by up to about
  twice that. Fixed bf16 constants would be a guess about rounding noise. The float32 bounds are the floor.
  (`hf padded` alone would be too tight: hf's variants share the bf16 NLL head, vLLM computes its own.)
Columns: renormalized option probabilities (softmax over each question's options, the features the
heads use): max and mean |Δp|; raw full-vocabulary option log-probs: max |Δlp|; argmax agreement over
the questions that are not near-ties; near-ties (the reference's top two options within `tie_gap` in
probability) and how many of them flipped, counted apart because rounding can flip them; hidden-state
cosine (min); |Δ prompt NLL| (max). Exit 1 when a judged row is outside its tolerance.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
from walla.extract.backends import Backend
from walla.extract.backends.hf import explain_dtype
from walla.extract.backends.registry import DEFAULT_BACKEND, backend_kind, backend_names
from walla.extract.config import ExtractConfig
from walla.extract.datasets import default_template, load_dataset_table
from walla.extract.door import open_for, target_for
from walla.extract.prompts import build_prompts, get_template
from walla.extract.run import _lookup, dataset_request
from walla.extract.scoring import resolve_option_token_ids
from walla.manifests.catalog import load_datasets
from walla.manifests.validate import field_names

# float32: fixed bounds, ~100x the measured float32 differences (vllm vs hf max |Δlp| 5.6e-05, hf batch=1 vs
# hf 3.1e-05 and max |Δp| 3.2e-06; SmolLM2-135M, ARC dev, CPU). They catch real bugs: a wrong hidden state,
# a missing soft-cap or an off-by-one NLL moves the NLL by > 0.1 and the cosine far below 0.99.
TOLERANCES = {
    "float32": {
        "p_max": 1e-3,
        "p_mean": 1e-4,
        "lp_max": 5e-3,
        "argmax": 0.98,
        "cos_min": 0.9999,
        "nll_max": 5e-3,
    },
}
ORDER = ("p_max", "p_mean", "lp_max", "argmax", "cos_min", "nll_max")
HIGHER_IS_BETTER = ("argmax", "cos_min")
NOISE_FACTOR = 2.0  # reduced precision: vllm may differ from hf by this many times hf's own noise
NOISE_ROWS = ("hf padded", "hf float32")  # hf against itself in reduced precision (module docstring)
TIE_GAP = 0.05  # near-tie: the reference's top two renormalized option probabilities differ by less
FIELDS = ("raw_logprobs", "hidden", "prompt_nll", "n_tokens")


def _option_probs(raw: np.ndarray) -> np.ndarray:
    """Softmax over one question's options (the renormalized option distribution): [K] -> [K]."""
    x = raw.astype(np.float64)
    e = np.exp(x - x.max())
    return e / e.sum()


def compare(ref, other, option_cols: list[list[int]], tie_gap: float = TIE_GAP) -> dict:
    """Parity metrics of two ScoreResults over the same prompts; option_cols[i] = the columns of row i's options."""
    d_lp, d_p, agree, tie = [], [], [], []
    for i, c in enumerate(option_cols):
        a, b = ref.raw_logprobs[i, c], other.raw_logprobs[i, c]
        pa, pb = _option_probs(a), _option_probs(b)
        d_lp.append(np.abs(a.astype(np.float64) - b))
        d_p.append(np.abs(pa - pb))
        agree.append(int(np.argmax(pa)) == int(np.argmax(pb)))
        top = np.sort(pa)[::-1]
        tie.append(len(top) > 1 and top[0] - top[1] < tie_gap)
    agree, tie = np.array(agree), np.array(tie)
    d_lp, d_p = np.concatenate(d_lp), np.concatenate(d_p)
    a, b = ref.hidden.astype(np.float64), other.hidden.astype(np.float64)
    cos = (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-30)
    d_nll = np.abs(ref.prompt_nll.astype(np.float64) - other.prompt_nll)
    return {
        "p_max": float(d_p.max()),
        "p_mean": float(d_p.mean()),
        "lp_max": float(d_lp.max()),
        "lp_mean": float(d_lp.mean()),
        "argmax": float(agree[~tie].mean()) if (~tie).any() else 1.0,
        "ties": int(tie.sum()),
        "tie_flips": int((~agree[tie]).sum()),
        "cos_min": float(cos.min()),
        "cos_mean": float(cos.mean()),
        "nll_max": float(d_nll.max()),
        "nll_mean": float(d_nll.mean()),
        "same_tokens": bool(np.array_equal(ref.n_tokens, other.n_tokens)),
        "identical": all(np.array_equal(getattr(ref, f), getattr(other, f)) for f in FIELDS),
    }


def violations(metrics: dict, tol: dict) -> list[str]:
    """One entry per metric outside its tolerance (and for a tokenization mismatch)."""
    bad = []
    for key in ORDER:
        v, t = metrics[key], tol[key]
        worse = v < t if key in HIGHER_IS_BETTER else v > t
        if worse or not np.isfinite(v):
            bad.append(f"{key} {v:.3g} (tolerance {t:.3g})")
    if not metrics["same_tokens"]:
        bad.append("prompt token counts differ (different tokenization)")
    return bad


def worst(rows: list[dict]) -> dict:
    """Metric by metric, the largest difference among `rows` (the lowest argmax agreement and cosine)."""
    pick = {key: min if key in HIGHER_IS_BETTER else max for key in ORDER}
    return {key: pick[key](r[key] for r in rows) for key in ORDER}


def noise_tolerances(noise: dict, floor: dict, factor: float = NOISE_FACTOR) -> dict:
    """Tolerances `factor` x a measured noise row (differences scaled; argmax and cosine by their gap to 1),
    never tighter than `floor`."""
    tol = {}
    for key in ORDER:
        if key in HIGHER_IS_BETTER:
            tol[key] = min(1.0 - factor * (1.0 - noise[key]), floor[key])
        else:
            tol[key] = max(factor * noise[key], floor[key])
    return tol


def judge(name: str, metrics: dict, tol: dict | None, exact: bool) -> list[str]:
    """Violations of one row: bit-identity for an exact row, the tolerances otherwise, none without them."""
    if exact:
        return (
            [] if metrics["identical"] else [f"{name} is not bit-identical to hf (batch-invariant backend)"]
        )
    return violations(metrics, tol) if tol is not None else []


def format_table(rows: list[dict]) -> str:
    head = (
        f"{'comparison':<18} {'n':>4} {'max|Δp|':>8} {'mean|Δp|':>8} {'max|Δlp|':>8} {'argmax':>6} "
        f"{'ties(flip)':>10} {'cos min':>9} {'max|ΔNLL|':>9}  verdict"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        m = r["metrics"]
        verdict = r.get("verdict") or ("ok" if not r["violations"] else "FAIL: " + "; ".join(r["violations"]))
        ties = f"{m['ties']}({m['tie_flips']})"
        lines.append(
            f"{r['name']:<18} {r['n']:>4} {m['p_max']:>8.2e} {m['p_mean']:>8.2e} {m['lp_max']:>8.2e} "
            f"{m['argmax']:>6.3f} {ties:>10} {m['cos_min']:>9.6f} {m['nll_max']:>9.2e}  {verdict}"
        )
    return "\n".join(lines)


def render_prompts(cfg: ExtractConfig) -> list:
    """The rendered prompts of variant `none`, as walla extract has them."""
    d_entry = _lookup(load_datasets(), cfg.dataset, "dataset")
    template = get_template(default_template(d_entry.loader, d_entry.prompt))
    table, _ = load_dataset_table(dataset_request(d_entry, cfg))
    return build_prompts(table, template, "none", option_tokens=d_entry.option_tokens, seed=cfg.context_seed)


def _timed_score(backend, texts: list[str], token_ids: list[int]) -> tuple:
    t0 = time.perf_counter()
    res = backend.score(texts, token_ids)
    return res, round(time.perf_counter() - t0, 2)


def load_backend(cfg: ExtractConfig) -> Backend:
    """One row's backend through the one door (extract/door.py `open_for`), as walla extract opens it: the
    row's mode is a settled backend option (a function of its own: tests put a fake in its place)."""
    return open_for(cfg)[1]


def args_for(name: str, args: dict) -> dict:
    """The --backend-arg keys that backend `name`'s Options declare (one list may serve several backends)."""
    keys = set(field_names(backend_kind(name).Options))
    return {k: v for k, v in args.items() if k in keys}


# the hf rows beside the reference, each an hf backend option settled like any other (extract/backends/hf/_kind.py
# HFOptions): the same prompts one per forward pass, and, where hf is batch-invariant, padded batches
BATCH_ONE = ("hf batch=1", {"max_batch_rows": 1})
PADDED = ("hf padded", {"batch_invariant": "off"})


def row_config(cfg: ExtractConfig, kind: str, dtype: str, device: str, extra: dict) -> ExtractConfig:
    """The config one row opens: the check's, with that backend, dtype, device and its own options."""
    args = {**args_for(kind, cfg.backend_args), **extra}
    return replace(cfg, backend=kind, dtype=dtype, device=device, backend_args=args)


def score_all(cfg: ExtractConfig, backends: list[str], prompts, dtype: str, device: str):
    """Every row's ScoreResult on the prompts: (results by row name, option columns, timings, hf mode).

    hf mode: {"batch_invariant": packed scoring on, "packs": several prompts per pack, or one each where
    the GEMMs are not row-invariant (extract/backends/hf/_packed.py)}."""
    results, token_sets, timings = {}, {}, {}
    mode = {"batch_invariant": False, "packs": None}
    runs = [("hf", "hf", dtype, {}), (BATCH_ONE[0], "hf", dtype, BATCH_ONE[1])]
    runs += [("hf float32", "hf", "float32", {})] if dtype != "float32" else []
    runs += [(b, b, dtype, {}) for b in backends if b != "hf"]
    i = 0
    while i < len(runs):
        name, kind, run_dtype, extra = runs[i]
        i += 1
        t0 = time.perf_counter()
        backend = load_backend(row_config(cfg, kind, run_dtype, device, extra))
        load_s = round(time.perf_counter() - t0, 2)
        try:
            texts = [backend.format_prompt(p.text) for p in prompts]
            union = list(dict.fromkeys(s for p in prompts for s in p.options))
            tok_of = resolve_option_token_ids(backend.encode, backend.encode_bare, texts[0], union)
            token_sets[name] = [tok_of[s] for s in union]
            if token_sets[name] != token_sets["hf"]:
                raise ValueError(f"backend {name} resolves the option tokens differently from hf")
            results[name], score_s = _timed_score(backend, texts, token_sets[name])
            timings[name] = {"load_s": load_s, "score_s": score_s}
            if name == "hf" and backend.batch_invariant:  # padded batches: one of the run's noise rows
                mode["batch_invariant"] = True
                mode["packs"] = "several prompts each" if backend.rows_invariant else "one prompt each"
                runs.insert(2, (PADDED[0], "hf", dtype, PADDED[1]))
        finally:
            backend.close()
    col = {s: i for i, s in enumerate(union)}
    return results, [[col[s] for s in p.options] for p in prompts], timings, mode


def run_check(cfg: ExtractConfig, backends: list[str], out=print, tie_gap: float = TIE_GAP) -> dict:
    """Score the questions with each backend (+ hf at batch 1, + hf's noise rows) and compare with hf batched."""
    target_for(
        replace(cfg, backend=DEFAULT_BACKEND), pin=False
    )  # an unknown model or device: before the data
    prompts = render_prompts(cfg)
    out(f"{len(prompts)} questions of {cfg.dataset}, model {cfg.model}")
    device = cfg.device or "cpu"
    dtype, why = explain_dtype(cfg.dtype or "float32", device)  # one concrete dtype for all backends
    out(f"dtype {why}")
    results, option_cols, timings, mode = score_all(cfg, backends, prompts, dtype, device)
    metrics = {
        name: compare(results["hf"], res, option_cols, tie_gap)
        for name, res in results.items()
        if name != "hf"
    }
    floor = TOLERANCES["float32"]
    noise = [metrics[n] for n in NOISE_ROWS if n in metrics]
    tol = noise_tolerances(worst(noise), floor) if noise else floor
    rows = []
    for name, m in metrics.items():
        exact = name == "hf batch=1" and mode["batch_invariant"]
        row_tol = None if name in NOISE_ROWS else (floor if name == "hf batch=1" else tol)
        row = {"name": f"{name} vs hf", "n": len(prompts), "metrics": m, "tolerances": row_tol}
        row["violations"] = judge(name, m, row_tol, exact)
        if exact:
            row["verdict"] = "bit-identical" if not row["violations"] else "FAIL: not bit-identical"
        elif row_tol is None:
            row["verdict"] = "noise (no verdict)"
        rows.append(row)
    return {
        "model": cfg.model,
        "dataset": cfg.dataset,
        "n_questions": len(prompts),
        "dtype": dtype,
        "batch_invariant": mode["batch_invariant"],
        "hf_packs": mode["packs"],
        "tie_gap": tie_gap,
        "noise_factor": NOISE_FACTOR if noise else None,
        "tolerances": tol,
        "timings": timings,
        "rows": rows,
        "passed": all(not r["violations"] for r in rows),
    }


def usable_backends() -> list[str]:
    """The reference, then every other registered backend that can run here."""
    others = [b for b in backend_names() if b != DEFAULT_BACKEND and backend_kind(b).usable()[0]]
    return [DEFAULT_BACKEND, *others]
