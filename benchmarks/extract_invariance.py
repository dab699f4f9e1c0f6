"""What batch-invariant scoring costs: the hf backend invariant vs padded, same model, dtype and prompts.

    .venv/bin/python benchmarks/extract_invariance.py                                   # SmolLM2, facts + ARC
    .venv/bin/python benchmarks/extract_invariance.py --limit 0                         # every prompt (past an hour on a CPU)
    .venv/bin/python benchmarks/extract_invariance.py --model gemma3-270m --repeat 3
    .venv/bin/python benchmarks/extract_invariance.py --dataset facts --size 400 --device cuda

Loads the model once (as walla-extract does: extract/backends/hf_load.load_hf_backend), renders each dataset's
prompts exactly as the CLI does for its variants (`facts`: the demo's `--size 400`, variants none and relevant;
`arc`: ARC-Challenge dev, 299 prompts, variant none), then scores them in calls of `--shard-rows` rows (the
CLI's score() calls) with `--batch-invariant on` and `off` alternated, `--repeat` times, keeping the best of
each (a shared machine is noisy; only the ratio of two runs taken side by side means anything). Also checks
that the invariant run gave every prompt the same bits as a second invariant run in another batch mix
(reversed order, half the token budget).

Prints per dataset the seconds, tokens per second, which path each side ran (tier) and
`invariance_cost` = invariant seconds / padded seconds (1.0: free; the issue's goal is <= 1/0.85 = 1.18).
Last line: `RESULT model=.. device=.. dtype=.. invariance_cost_<dataset>=<x> ... same_bits=<bool>`.
"""

# ruff: noqa: E402 (the options are read before the imports that load torch)
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from walla.cli.torch_build import device_argument

# prompts per variant on a CPU unless --limit says otherwise: 40 ARC prompts in bf16 took 90 s of CPU time (both
# sides and the check, 2-core CPU), so every prompt (~1,100, each side twice) extrapolates past an hour;
# 32 a variant (96 prompts) take minutes
CPU_LIMIT = 32


def parser() -> argparse.ArgumentParser:
    """The options; built before torch loads, so --help and a mistyped flag answer at once (one line, exit 2)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], usage=argparse.SUPPRESS)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dataset", default="facts,arc", help="comma-separated: facts, arc")
    ap.add_argument("--size", type=int, default=400, help="facts rows (the demo's --size)")
    ap.add_argument(
        "--limit",
        type=int,
        help=f"score only the first N prompts of each variant (default: {CPU_LIMIT} on a CPU, all on an "
        "accelerator; 0: all)",
    )
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cpu", type=device_argument, help="cpu | cuda | cuda:N")
    ap.add_argument("--batch-tokens", type=int, default=8192)
    ap.add_argument("--shard-rows", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=2)
    return ap


if __name__ == "__main__":
    parser().parse_args()

import numpy as np
import torch
from walla.extract.backends.hf import load_hf_backend
from walla.extract.config import ExtractConfig
from walla.extract.datasets.registry import default_template
from walla.extract.datasets.table import load_dataset_table
from walla.extract.models import resolve_model
from walla.extract.prompts import get_template
from walla.extract.run import _lookup, dataset_request
from walla.extract.variant import prepare_variant
from walla.manifests.catalog import load_datasets, load_models

REPO = Path(__file__).resolve().parents[1]
REAL_DATA = Path(os.environ.get("REAL_DATA", REPO.parent / "shared" / "data"))  # as the Makefile
ARC = REAL_DATA / "arc" / "ARC-Challenge-Dev.jsonl"
# dataset name -> (walla dataset, config overrides, variants)
DATASETS = {
    "facts": ("facts", {}, ("none", "relevant")),
    "arc": ("arc-challenge", {"data_file": ARC}, ("none",)),
}


def prompts_of(backend, name: str, size: int | None) -> list[tuple[list[list[int]], list[int]]]:
    """[(token ids of one variant's prompts, its option token ids)] as walla-extract renders them."""
    dataset, extra, variants = DATASETS[name]
    cfg = ExtractConfig(
        model="smollm2-135m",
        dataset=dataset,
        progress=False,
        **extra,
        **({"size": size} if size and name == "facts" else {}),
    )
    d_entry = _lookup(load_datasets(), dataset, "dataset")
    template = get_template(default_template(d_entry.loader, d_entry.prompt))
    table, _ = load_dataset_table(dataset_request(d_entry, cfg))
    out = []
    for v in variants:
        prep = prepare_variant(backend, table, template, v, d_entry.option_tokens, cfg.context_seed)
        out.append((backend.encode_batch([p.text for p in prep.prompts]), prep.token_ids))
    return out


def score_all(backend, jobs, shard_rows: int, invariant: bool):
    """Score every job in calls of `shard_rows` rows; (seconds, [ScoreResult per job])."""
    backend.batch_invariant = invariant
    t = time.perf_counter()
    results = []
    for enc, cand in jobs:
        parts = [
            backend.score([""] * len(enc[a : a + shard_rows]), cand, enc=enc[a : a + shard_rows])
            for a in range(0, len(enc), shard_rows)
        ]
        results.append(parts)
    return time.perf_counter() - t, results


def main() -> None:
    args = parser().parse_args()
    if args.limit is None:
        args.limit = CPU_LIMIT if args.device == "cpu" else 0
    rm = resolve_model(load_models()[args.model])
    t = time.perf_counter()
    be = load_hf_backend(
        rm,
        dtype=args.dtype,
        device=args.device,
        batch_tokens=args.batch_tokens,
        shard_rows=args.shard_rows,
        batch_invariant=True,
    )
    why = be.settle_invariance()
    print(
        f"model {args.model}, {args.dtype} on {args.device} ({torch.get_num_threads()} threads), "
        f"loaded in {time.perf_counter() - t:.1f} s"
    )
    print(f"invariant path: {why}")
    tier_inv = "bitwise (batch-invariant: " + (
        "one attention call per layer, shared prefix cached)"
        if be.attention_batched and be.rows_invariant
        else "attention per prompt)"
        if be.rows_invariant
        else "one prompt per pass)"
    )
    tier_pad = "batch-recorded (padded batches; outputs depend on the batch mix)"
    results, same = {}, True
    for name in args.dataset.split(","):
        jobs = [(enc[: args.limit or None], cand) for enc, cand in prompts_of(be, name, args.size)]
        tokens = sum(len(e) for enc, _ in jobs for e in enc)
        best = {True: np.inf, False: np.inf}
        for _ in range(args.repeat):  # alternated: both sides see the same machine load
            for inv in (False, True):
                s, res = score_all(be, jobs, args.shard_rows, inv)
                best[inv] = min(best[inv], s)
                if inv:
                    inv_res = res
        # the same prompts in another mix: reversed, half the token budget -> the same bits
        budget = be.batch_tokens
        be.batch_tokens = max(1, budget // 2)
        rev = [(enc[::-1], cand) for enc, cand in jobs]
        _, again = score_all(be, rev, args.shard_rows, True)
        be.batch_tokens = budget
        for parts, parts_rev in zip(inv_res, again, strict=True):
            a = np.concatenate([p.raw_logprobs for p in parts])
            b = np.concatenate([p.raw_logprobs for p in parts_rev])[::-1]
            na = np.concatenate([p.prompt_nll for p in parts])
            nb = np.concatenate([p.prompt_nll for p in parts_rev])[::-1]
            same &= bool(np.array_equal(a, b) and np.array_equal(na, nb))
        cost = best[True] / best[False]
        results[name] = cost
        n = sum(len(enc) for enc, _ in jobs)
        print(f"{name}: {n} prompts, {tokens:,} tokens ({tokens / n:.0f} per prompt)")
        print(f"  padded    {best[False]:7.2f} s {tokens / best[False]:8.0f} tok/s  tier {tier_pad}")
        print(f"  invariant {best[True]:7.2f} s {tokens / best[True]:8.0f} tok/s  tier {tier_inv}")
        print(f"  invariance_cost {cost:.2f} (invariant / padded seconds; throughput ratio {1 / cost:.2f})")
    ratios = " ".join(f"invariance_cost_{k}={v:.2f}" for k, v in results.items())
    print(f"RESULT model={args.model} device={args.device} dtype={args.dtype} {ratios} same_bits={same}")


if __name__ == "__main__":
    main()
