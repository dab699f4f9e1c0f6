"""Prompt tokens/s of each model of `make study` on this CPU, on a small sample (what the study's limits rest on).

    .venv/bin/python benchmarks/study_throughput.py [--n 24] [--threads 2] [--model M ...]

For each model: settle and load it as `walla extract` does (dtype auto, the CPU's batch sizes), then score
the first `--n` ARC-Challenge dev prompts once to warm up and once timed, on `--threads` torch threads. It
prints, per model: the dtype and determinism tier settled, prompt tokens, wall seconds, tokens/s, and tokens
per CPU-second of this process (process_time): on a machine shared with other jobs the wall rate says little
(two OpenMP threads that wait on each other stall when either is descheduled), the CPU-second rate is what
a quiet run's `--threads` cores would each give. RESULT lines are one JSON object per model.
"""

# ruff: noqa: E402 (the options are read before the imports that load torch)
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

MODELS = ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")


def parser() -> argparse.ArgumentParser:
    """The options, built before torch loads: --help and a mistyped flag answer at once (one line, exit 2)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], usage=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, default=24, help="ARC-Challenge dev prompts scored (after a warm-up)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument(
        "--model", action="append", help=f"a model to measure (repeatable; default: {', '.join(MODELS)})"
    )
    ap.add_argument("--data-file", type=Path, default=Path("../shared/data/arc/ARC-Challenge-Dev.jsonl"))
    return ap


if __name__ == "__main__":
    ARGS = parser().parse_args()

import torch


def measure(model: str, data_file: Path, n: int) -> dict:
    from walla.extract.config import ExtractConfig
    from walla.extract.datasets.rows import DatasetRequest
    from walla.extract.datasets.table import load_dataset_table
    from walla.extract.door import open_for
    from walla.extract.prompts import get_template
    from walla.extract.splits import SplitProtocol
    from walla.extract.variant import prepare_variant

    cfg = ExtractConfig(model=model, dataset="arc-challenge", data_file=data_file, device="cpu", limit=n)
    req = DatasetRequest(
        "arc-challenge", "arc", data_file=data_file, split_protocol=SplitProtocol(mode="none"), limit=n
    )
    table, _ = load_dataset_table(req)
    settled, backend = open_for(cfg)
    try:
        prepared = prepare_variant(backend, table, get_template("mc"), "none", None, 0)
        texts = [p.text for p in prepared.prompts]
        backend.score(texts[: max(2, n // 4)], prepared.token_ids)  # warm-up
        c0, t0 = time.process_time(), time.perf_counter()
        res = backend.score(texts, prepared.token_ids)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        backend.close()
    tokens = int(res.n_tokens.sum())
    return {
        "model": model,
        "dtype": settled.identity.get("dtype"),
        "tier": settled.tier,
        "threads": torch.get_num_threads(),
        "prompts": len(texts),
        "prompt_tokens": tokens,
        "wall_s": round(wall, 2),
        "tokens_per_s": round(tokens / wall, 1),
        "tokens_per_cpu_s": round(tokens / cpu, 1),
        "loadavg": Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else None,
    }


def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    for m in args.model or MODELS:
        print("RESULT " + json.dumps(measure(m, args.data_file, args.n)), flush=True)


if __name__ == "__main__":
    main(ARGS)
