"""`walla check`: the same questions through each backend -> one parity table + a JSON report.

    walla check --model smollm2-135m --dataset arc-challenge --data-file ARC-Challenge-Dev.jsonl --limit 50

Every backend scores the same rendered prompts (variant `none`) with the same option tokens. Rows
of the table compare a backend run with the reference (hf, batched as walla-extract batches):
`hf batch=1` (one prompt per forward pass: padding/batch composition must not change anything)
and `vllm`. Columns: max and mean |Δ option log-prob| (full-vocabulary log-probs of the options
each question has), argmax agreement (same predicted option), hidden-state cosine (min / mean) and
|Δ prompt NLL| (max / mean). Exit 1 when a row is outside its tolerance (TOLERANCES).

Why these tolerances: both backends run the same weights in the same dtype, but with different
kernels (vLLM's paged attention and fused ops vs torch SDPA) and a different summation order, so
results agree to rounding error, not bit for bit. In float32 that is ~1e-5 relative per op, a few
1e-4 on a log-prob after ~30 layers. In bfloat16 (8 mantissa bits, ~4e-3 relative) the hf backend
does not even agree with itself across batch shapes: batch=1 vs batched differs by up to 0.6 nats
on an option log-prob (measured, see TOLERANCES), so the bf16 bounds are ~2x that measured noise
and the float32 bounds ~100x the measured float32 differences (max 5.6e-05): both catch real bugs (a wrong hidden state, a
missing soft-cap, an off-by-one NLL shifts NLL by >0.1 and cosine far below 0.99) without flaking.
Use --dtype float32 for the sharp comparison.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import typer

# per compute dtype: max |Δlp|, mean |Δlp|, min argmax agreement, min cosine, max |ΔNLL|
TOLERANCES = {
    "float32": {"lp_max": 5e-3, "lp_mean": 5e-4, "argmax": 0.98, "cos_min": 0.9999, "nll_max": 5e-3},
    # measured on SmolLM2-135M, ARC dev, 50 questions, CPU: hf batch=1 vs batched itself differs by
    # max 0.60 / mean 0.14 nats (cos min 0.9995, NLL 0.015); vllm vs hf by 0.76 / 0.18 (0.9993, 0.018)
    "bfloat16": {"lp_max": 1.5, "lp_mean": 0.4, "argmax": 0.9, "cos_min": 0.998, "nll_max": 0.05},
    "float16": {"lp_max": 0.5, "lp_mean": 0.1, "argmax": 0.9, "cos_min": 0.999, "nll_max": 0.02},
}
ORDER = ("lp_max", "lp_mean", "argmax", "cos_min", "nll_max")


def compare(ref, other, option_cols: list[list[int]]) -> dict:
    """Parity metrics of two ScoreResults over the same prompts; option_cols[i] = the columns of row i's options."""
    d_lp = np.concatenate(
        [np.abs(ref.raw_logprobs[i, c] - other.raw_logprobs[i, c]) for i, c in enumerate(option_cols)]
    )
    agree = [
        int(np.argmax(ref.raw_logprobs[i, c]) == np.argmax(other.raw_logprobs[i, c]))
        for i, c in enumerate(option_cols)
    ]
    a, b = ref.hidden.astype(np.float64), other.hidden.astype(np.float64)
    cos = (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-30)
    d_nll = np.abs(ref.prompt_nll.astype(np.float64) - other.prompt_nll)
    same_len = bool(np.array_equal(ref.n_tokens, other.n_tokens))
    return {
        "lp_max": float(d_lp.max()),
        "lp_mean": float(d_lp.mean()),
        "argmax": float(np.mean(agree)),
        "cos_min": float(cos.min()),
        "cos_mean": float(cos.mean()),
        "nll_max": float(d_nll.max()),
        "nll_mean": float(d_nll.mean()),
        "same_tokens": same_len,
    }


def violations(metrics: dict, tol: dict) -> list[str]:
    bad = []
    for key in ORDER:
        v, t = metrics[key], tol[key]
        worse = v < t if key in ("argmax", "cos_min") else v > t
        if worse or not np.isfinite(v):
            bad.append(f"{key} {v:.3g} (tolerance {t:g})")
    if not metrics["same_tokens"]:
        bad.append("prompt token counts differ (different tokenization)")
    return bad


def format_table(rows: list[dict]) -> str:
    head = (
        f"{'comparison':<22} {'n':>4} {'max|Δlp|':>9} {'mean|Δlp|':>9} {'argmax':>7} "
        f"{'cos min':>9} {'cos mean':>9} {'max|ΔNLL|':>9} {'mean|ΔNLL|':>10}  verdict"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        m = r["metrics"]
        lines.append(
            f"{r['name']:<22} {r['n']:>4} {m['lp_max']:>9.2e} {m['lp_mean']:>9.2e} {m['argmax']:>7.3f} "
            f"{m['cos_min']:>9.6f} {m['cos_mean']:>9.6f} {m['nll_max']:>9.2e} {m['nll_mean']:>10.2e}  "
            + ("ok" if not r["violations"] else "FAIL: " + "; ".join(r["violations"]))
        )
    return "\n".join(lines)


def _prompts(cfg, out):
    """(rendered prompts of variant `none`, model entry, resolved model, dataset entry) as walla-extract has them."""
    from walla.extract.datasets import default_template, load_dataset_table
    from walla.extract.models import resolve_model
    from walla.extract.prompts import build_prompts, get_template
    from walla.extract.run import _lookup, dataset_request
    from walla.manifests.catalog import load_datasets, load_models, resolve_model_name

    _, m_entry = resolve_model_name(cfg.model, load_models())
    d_entry = _lookup(load_datasets(), cfg.dataset, "dataset")
    template = get_template(default_template(d_entry.loader, d_entry.prompt))
    table, _ = load_dataset_table(dataset_request(d_entry, cfg))
    prompts = build_prompts(
        table, template, "none", option_tokens=d_entry.option_tokens, seed=cfg.context_seed
    )
    out(f"{len(prompts)} questions of {cfg.dataset}, model {cfg.model}")
    return prompts, m_entry, resolve_model(m_entry)


def run_check(cfg, backends: list[str], out=print) -> dict:
    """Score the questions with each backend (+ hf at batch 1) and compare with hf batched."""
    from walla.extract.backends.hf import explain_dtype
    from walla.extract.backends.registry import backend_kind
    from walla.extract.run import backend_request
    from walla.extract.scoring import resolve_option_token_ids

    prompts, m_entry, rm = _prompts(cfg, out)
    device = cfg.device or "cpu"
    dtype, why = explain_dtype(cfg.dtype or m_entry.dtype or "auto", device)  # one concrete dtype for all
    chat = m_entry.chat_template if cfg.chat_template is None else cfg.chat_template
    out(f"dtype {why}")
    results, token_sets, timings = {}, {}, {}
    for name in ["hf"] + [b for b in backends if b != "hf"]:
        t0 = time.perf_counter()
        backend = backend_kind(name).load(backend_request(cfg, rm, dtype, device, chat, m_entry.hidden_size))
        load_s = time.perf_counter() - t0
        try:
            texts = [backend.format_prompt(p.text) for p in prompts]
            union = list(dict.fromkeys(s for p in prompts for s in p.options))
            tok_of = resolve_option_token_ids(backend.encode, backend.encode_bare, texts[0], union)
            token_sets[name] = [tok_of[s] for s in union]
            t0 = time.perf_counter()
            results[name] = backend.score(texts, token_sets[name])
            timings[name] = {"load_s": round(load_s, 2), "score_s": round(time.perf_counter() - t0, 2)}
            if name == "hf":  # the same prompts one at a time
                backend.max_batch_rows = 1
                t0 = time.perf_counter()
                results["hf batch=1"] = backend.score(texts, token_sets[name])
                timings["hf batch=1"] = {"score_s": round(time.perf_counter() - t0, 2)}
        finally:
            backend.close()
    col = {s: i for i, s in enumerate(union)}
    option_cols = [[col[s] for s in p.options] for p in prompts]
    tol = TOLERANCES[dtype]
    rows = []
    for name in results:
        if name == "hf":
            continue
        if token_sets.get(name, token_sets["hf"]) != token_sets["hf"]:
            raise ValueError(f"backend {name} resolves the option tokens differently from hf")
        m = compare(results["hf"], results[name], option_cols)
        rows.append(
            {"name": f"{name} vs hf", "n": len(prompts), "metrics": m, "violations": violations(m, tol)}
        )
    return {
        "model": cfg.model,
        "dataset": cfg.dataset,
        "n_questions": len(prompts),
        "dtype": dtype,
        "tolerances": tol,
        "timings": timings,
        "rows": rows,
        "passed": all(not r["violations"] for r in rows),
    }


app = typer.Typer(add_completion=False, help="walla: cross-stage tools")


@app.callback()
def _root() -> None:
    """walla: cross-stage tools (`walla check`)."""


@app.command()
def check(
    model: str = typer.Option(..., help="model name from manifests/models.yaml"),
    dataset: str = typer.Option(..., help="dataset name from manifests/datasets.yaml"),
    data_file: Path = typer.Option(None, "--data-file", help="local copy of the dataset instead of the hub"),
    limit: int = typer.Option(50, help="first N questions"),
    backends: str = typer.Option("hf,vllm", help="comma list of backends to compare with hf batched"),
    dtype: str = typer.Option(
        None, help="auto | float32 | bfloat16 | float16 (default: the model's manifest)"
    ),
    device: str = typer.Option(None, help="cpu | cuda for the hf backend (default: cpu)"),
    report: Path = typer.Option(Path("walla-check.json"), help="where the JSON report goes"),
    max_model_len: int = typer.Option(None, "--max-model-len", help="vllm: context length"),
    gpu_memory_utilization: float = typer.Option(
        None, "--gpu-memory-utilization", help="vllm: memory fraction"
    ),
) -> None:
    """Parity of option log-probs, hidden states and prompt NLL across backends (exit 1 beyond tolerance)."""
    logging.basicConfig(level=logging.WARNING, format="walla check: %(message)s")
    from walla.extract.config import ExtractConfig
    from walla.extract.hub import HubUnavailableError
    from walla.manifests.validate import build

    names = [b.strip() for b in backends.split(",") if b.strip()]
    try:
        options = dict(
            model=model, dataset=dataset, data_file=data_file, limit=limit, dtype=dtype, device=device
        )
        vllm_opts = {"max_model_len": max_model_len, "gpu_memory_utilization": gpu_memory_utilization}
        cfg = build(ExtractConfig, {**options, "progress": False, **vllm_opts}, where="command line")
        bad = [b for b in names if b not in ("hf", "vllm", "dummy")]
        if bad:
            raise ValueError(f"--backends: unknown {', '.join(bad)} (expected hf, vllm)")
        result = run_check(replace(cfg, backend=None), names, out=typer.echo)
    except KeyError as e:
        typer.echo(f"walla check: error: {e.args[0] if e.args else e}", err=True)
        raise typer.Exit(2) from None
    except HubUnavailableError as e:
        typer.echo(f"walla check: error: {e}", err=True)
        raise typer.Exit(3) from None
    except (ValueError, FileNotFoundError, RuntimeError, OSError) as e:
        typer.echo(f"walla check: error: {' '.join(str(e).split())}", err=True)
        raise typer.Exit(1) from None
    typer.echo(format_table(result["rows"]))
    report.write_text(json.dumps(result, indent=2) + "\n")
    verdict = "PASS" if result["passed"] else "FAIL"
    typer.echo(f"{verdict} ({result['dtype']} tolerances: {result['tolerances']}); report {report}")
    if not result["passed"]:
        raise typer.Exit(1)


def main() -> None:
    app(prog_name="walla")


if __name__ == "__main__":  # vLLM spawns engine processes: run only as a program
    sys.exit(main())
