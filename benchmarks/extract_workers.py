"""Extraction throughput with Ray workers: `walla-extract --workers 1` vs `--workers 2` on this machine.

    .venv/bin/python benchmarks/extract_workers.py                  # smollm2-135m, 128 ARC rows, fp32
    .venv/bin/python benchmarks/extract_workers.py --rows 299 --shard-rows 32 --repeat 2

Each setting runs the real CLI in a fresh process into a fresh temp store (one process without Ray for
reference, then a local Ray with 1 and with 2 actors; --repeat rounds of the three, best of each: the
machine is shared and noisy), and reports
  scoring: rows/s from the first range handed out to the commit (what more workers speed up),
  total:   rows/s of the whole command (Ray start and per-actor model loading included).
Ray gives each of N actors cpus // N torch threads, so on this 2-core machine 2 workers x 1 thread compete
with 1 worker x 2 threads for the same two cores: expect ~1x here. The speed-up the design is for comes
from more machines/GPUs (one actor per GPU), which a 2-core VM cannot show.
Needs ../shared/data/arc/ARC-Challenge-Dev.jsonl (or --data-file) and the ray extra.
Last line: RESULT workers2_over_1=<scoring rows/s with 2 workers / with 1 worker>
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WROTE = re.compile(r"^wrote \S+: (\d+) rows in ([0-9.]+) s")


def extract(args, store: Path, workers: int | None) -> dict:
    cmd = [str(Path(sys.executable).with_name("walla-extract")), "--model", args.model]
    cmd += ["--dataset", "arc-challenge", "--data-file", str(args.data_file), "--limit", str(args.rows)]
    cmd += [
        "--dtype",
        "float32",
        "--store",
        str(store),
        "--shard-rows",
        str(args.shard_rows),
        "--no-progress",
    ]
    cmd += ["--workers", str(workers)] if workers else []
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    total = time.perf_counter() - t
    if r.returncode:
        sys.exit(f"{' '.join(cmd)} failed: {r.stderr.strip()[-500:]}")
    rows, secs = next((int(m[1]), float(m[2])) for m in map(WROTE.match, r.stdout.splitlines()) if m)
    return {"rows": rows, "scoring_s": secs, "total_s": total}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], usage=argparse.SUPPRESS
    )  # a mistake: one line
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--rows", type=int, default=128)
    ap.add_argument("--shard-rows", type=int, default=16, help="rows per range (= per durable shard)")
    ap.add_argument("--repeat", type=int, default=1, help="rounds of the three settings (best of each)")
    ap.add_argument("--data-file", type=Path, default=ROOT.parent / "shared/data/arc/ARC-Challenge-Dev.jsonl")
    args = ap.parse_args()
    if not args.data_file.is_file():
        sys.exit(f"{args.data_file} is missing; give --data-file (an ARC-Challenge jsonl)")
    try:
        import ray  # noqa: F401
    except ImportError:
        sys.exit("the ray extra is not installed: pip install 'walla[ray]'")
    results = {}
    settings = (("1 process (no Ray)", None), ("Ray, 1 worker", 1), ("Ray, 2 workers", 2))
    for _ in range(args.repeat):
        for label, workers in settings:
            root = Path(tempfile.mkdtemp(prefix="walla-bench-workers-"))
            try:
                r = extract(args, root / "store", workers)
            finally:
                shutil.rmtree(root, ignore_errors=True)
            print(
                f"  {label}: scoring {r['scoring_s']:.1f} s, whole command {r['total_s']:.1f} s", flush=True
            )
            if label not in results or r["scoring_s"] < results[label]["scoring_s"]:
                results[label] = r
    for label, _ in settings:
        r = results[label]
        print(
            f"{label:20s} {r['rows']} rows: scoring {r['scoring_s']:6.1f} s = {r['rows'] / r['scoring_s']:6.2f} rows/s; "
            f"whole command {r['total_s']:6.1f} s = {r['rows'] / r['total_s']:6.2f} rows/s"
        )
    one, two = results["Ray, 1 worker"], results["Ray, 2 workers"]
    ratio = one["scoring_s"] / two["scoring_s"]
    print(f"whole command, 2 workers over 1: {one['total_s'] / two['total_s']:.2f}")
    plain = results["1 process (no Ray)"]
    print(f"scoring, 2 workers over 1 process without Ray: {plain['scoring_s'] / two['scoring_s']:.2f}")
    print(f"RESULT workers2_over_1={ratio:.2f}")


if __name__ == "__main__":
    main()
