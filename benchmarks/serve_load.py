"""Load test of `walla serve`: forecasts/s and latency p50/p99 at several concurrencies, over loopback HTTP.

    python benchmarks/serve_load.py --runs demo-out/runs --scenario demo-hetero-facts --store demo-out/store
    python benchmarks/serve_load.py ... --concurrency 1,8,32 --requests 64 --device cuda

The pool is loaded once (walla serve's own loading: the run's heads, the LLMs through the backend door) and
served in this process on a free loopback port, over a fresh temporary ledger (every forecast is a round).
For each concurrency C, C client threads (one HTTP connection each) send `--requests` (`--n`) distinct new
questions in the dataset's form, after a warm-up; forecasts/s = answers / wall time, latencies per request.
Then, in the same run (issue 45's goals):

- the latency at the first concurrency (1) over the bare forward of the same prompts through the same models:
  per question, the sum over the distinct models of one scoring pass of that model's distinct prompts
  (extract/scoring.py, what a forecast needs, without HTTP, the queue, the heads, the pool or the ledger),
  medians compared (goal <= 1.5x on this CPU);
- the ledger's share of a forecast: its `timings.ledger_s` (one transaction) over the request's latency,
  summed at the first concurrency (goal <= 10%);
- the ratio of forecasts/s at the largest concurrency to the first (batching at work: >= 4x at 32 vs 1 on a
  CPU), and the prompt tokens the models scored per second at the largest concurrency (a prompt several
  agents share counts once) over `walla extract`'s on the same models (the feature sets' recorded prompt
  tokens / wall seconds; goals >= 0.7x on this CPU, >= 0.8x on a GPU).

The 1-minute load average is printed with the figures (compare runs only on a quiet machine). Prints one
JSON line of the figures last.
"""

# ruff: noqa: E402 (the options are read before the imports that load torch)
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from walla.cli.torch_build import device_argument


def parser() -> argparse.ArgumentParser:
    """The options, built before torch loads: --help and a mistyped flag answer at once (one line, exit 2)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], usage=argparse.SUPPRESS)
    ap.add_argument("--runs", type=Path, required=True)
    ap.add_argument("--scenario", required=True)
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--method", default="walla-i")
    ap.add_argument(
        "--device",
        type=device_argument,
        help="cpu | cuda | cuda:N (default: the device kind the feature sets recorded)",
    )
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--requests", "--n", type=int, default=64, help="forecasts per concurrency level")
    ap.add_argument("--max-wait-ms", type=float, default=10.0)
    return ap


if __name__ == "__main__":
    parser().parse_args()

import httpx
import numpy as np
import uvicorn
from walla.market.ledger import Ledger
from walla.market.local import free_port
from walla.serve.app import create_serve_app
from walla.serve.forecast import Forecaster
from walla.serve.loading import ServeConfig, load_pool
from walla.store.features import META_FILE
from walla.store.files import read_json

COLORS = ["red", "blue", "green", "white", "black", "yellow", "grey", "pink"]
THINGS = ["lamp", "door", "cup", "box", "car", "chair", "book", "coat"]


def questions(n: int, offset: int) -> list[dict]:
    """n distinct new questions in the facts dataset's form (a fact, then a yes/no question)."""
    out = []
    for i in range(offset, offset + n):
        thing, c1, c2 = THINGS[i % 8], COLORS[(i // 8) % 8], COLORS[(i // 64) % 8]
        fact = f"The {thing} in room {i} is {c1}."
        out.append({"question": f"{fact} Is the {thing} in room {i} {c2}?", "options": ["Yes", "No"]})
    return out


def extract_tokens_per_s(pool) -> float | None:
    """walla extract's prompt tokens/s over the feature sets the run was trained on (their meta.json)."""
    tokens, seconds = 0.0, 0.0
    for rec in (pool.choice.table.meta.get("meta") or {}).get("feature_sets", {}).values():
        try:
            compute = read_json(Path(rec["path"]) / META_FILE)["compute"]
        except (OSError, ValueError, KeyError):
            continue
        tokens += compute.get("prompt_tokens") or 0
        seconds += compute.get("wall_s") or 0
    return tokens / seconds if seconds else None


def bare_forward(fc: Forecaster, qs: list[dict]) -> list[float]:
    """Per question: seconds of one scoring pass of each distinct model over its distinct prompts, summed
    (the forward passes a forecast needs, nothing else)."""
    from walla.extract.scoring import score_prompts

    out = []
    for q in qs:
        job = fc.prepare(q["question"], q["options"])
        t = time.perf_counter()
        for k, prompts in job.per_model.items():
            score_prompts(fc.llms[k].backend, [(p, job.strings) for p in prompts])
        out.append(time.perf_counter() - t)
    return out


def scored_tokens(fc: Forecaster) -> int:
    """Prompt tokens the models scored (a prompt several agents share is scored once)."""
    return sum(b.stats.tokens for b in fc.batchers.values())


def level(url: str, c: int, n: int, offset: int, fc: Forecaster) -> dict:
    qs = questions(n, offset)
    lat: list[float] = []
    ledger: list[float] = []
    tokens = [0]
    lock = threading.Lock()

    def worker(part: list[dict]) -> None:
        with httpx.Client(base_url=url, timeout=600) as client:
            for q in part:
                t = time.perf_counter()
                r = client.post("/v1/forecast", json=q)
                r.raise_for_status()
                with lock:
                    lat.append(time.perf_counter() - t)
                    tokens[0] += r.json()["usage"]["prompt_tokens"]
                    ledger.append(r.json()["timings"].get("ledger_s", 0.0))

    t0, scored0 = time.perf_counter(), scored_tokens(fc)
    with ThreadPoolExecutor(c) as ex:
        list(ex.map(worker, [qs[i::c] for i in range(c)]))
    wall = time.perf_counter() - t0
    return {
        "concurrency": c,
        "requests": n,
        "forecasts_per_s": n / wall,
        "p50_s": float(np.percentile(lat, 50)),
        "p99_s": float(np.percentile(lat, 99)),
        "prompt_tokens_per_s": tokens[0] / wall,  # usage: summed over the agents
        "scored_tokens_per_s": (scored_tokens(fc) - scored0) / wall,  # what the models computed
        "ledger_share": sum(ledger) / sum(lat),
    }


def main() -> int:
    args = parser().parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    t0 = time.perf_counter()
    pool = load_pool(
        ServeConfig(
            scenario=args.scenario, runs=args.runs, store=args.store, method=args.method, device=args.device
        )
    )
    load_s = time.perf_counter() - t0
    tiers = sorted({a.llm.tier for a in pool.agents})
    print(
        f"{pool.model_id}: loaded in {load_s:.1f} s; agents {[a.model for a in pool.agents]}, tiers {tiers}"
    )
    with tempfile.TemporaryDirectory(prefix="walla-serve-load-") as tmp:
        ledger = Ledger.open(str(Path(tmp) / "serve.db"))
        fc = Forecaster(pool, ledger, max_wait=args.max_wait_ms / 1000, max_queue=4096).start()
        port = free_port()
        server = uvicorn.Server(
            uvicorn.Config(
                create_serve_app(fc, open_access=True), host="127.0.0.1", port=port, log_level="warning"
            )
        )
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        url = f"http://127.0.0.1:{port}"
        while not server.started:
            time.sleep(0.05)
        level(url, max(levels), max(levels), 10**6, fc)  # warm-up: first passes, thread pools, the ledger
        rows, offset = [], 0
        for c in levels:
            rows.append(level(url, c, args.requests, offset, fc))
            offset += args.requests
            r = rows[-1]
            print(
                f"concurrency {c:3d}: {r['forecasts_per_s']:7.2f} forecasts/s, p50 {r['p50_s'] * 1000:8.1f} ms, "
                f"p99 {r['p99_s'] * 1000:8.1f} ms, {r['scored_tokens_per_s']:7.0f} prompt tokens scored/s"
            )
        bare = bare_forward(fc, questions(args.requests, 2 * 10**6))  # the batchers idle: these alone
        stats = {b.name: vars(b.stats) for b in fc.batchers.values()}
        server.should_exit = True
        thread.join(10)
        fc.stop()
        pool.close()
        ledger.close()
    ratio = rows[-1]["forecasts_per_s"] / rows[0]["forecasts_per_s"]
    ext = extract_tokens_per_s(pool)
    top = rows[-1]["scored_tokens_per_s"]
    bare_p50 = float(np.median(bare))
    over_bare = rows[0]["p50_s"] / bare_p50
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"load average {load:.2f} on {os.cpu_count()} CPUs")
    print(
        f"concurrency {levels[0]}: p50 {rows[0]['p50_s'] * 1000:.1f} ms vs the bare forward's "
        f"{bare_p50 * 1000:.1f} ms: {over_bare:.2f}x (CPU goal <= 1.5x); ledger {rows[0]['ledger_share']:.1%} "
        "of a forecast (goal <= 10%)"
    )
    print(f"throughput at concurrency {levels[-1]} vs {levels[0]}: {ratio:.2f}x (CPU goal >= 4x)")
    if ext:
        print(
            f"concurrency {levels[-1]}: served prompt tokens scored/s {top:.0f} vs walla extract's {ext:.0f}: "
            f"{top / ext:.2f}x (CPU goal >= 0.7x, GPU >= 0.8x)"
        )
    print(
        json.dumps(
            {
                "model": pool.model_id,
                "load_s": load_s,
                "levels": rows,
                "ratio": ratio,
                "bare_forward_p50_s": bare_p50,
                "c1_over_bare": over_bare,
                "ledger_share_c1": rows[0]["ledger_share"],
                "served_over_extract": top / ext if ext else None,
                "load_average": load,
                "extract_tokens_per_s": ext,
                "batcher": stats,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
