"""What a `walla extract` run imports before it starts work, in seconds, by top-level package.

    .venv/bin/python benchmarks/import_cost.py                  # the hf path (cpu or cuda), best of 5
    .venv/bin/python benchmarks/import_cost.py --backend vllm   # the parent process of --backend vllm
    .venv/bin/python benchmarks/import_cost.py --repeats 3 --top 12 --also datasets

Each repeat is a fresh interpreter running `python -X importtime -c "<what the run imports>"`: the recipe
(walla.extract.run) and the backend (hf: its kind and scoring modules; vllm: its kind and the tokenizer the
parent keeps, the engines run in a worker process), i.e. every module an extraction imports before its first
forward pass but the model's own architecture module. The first repeat on a fresh machine
also pays for reading the files from disk (cold page cache; and for writing .pyc files where the install did
not compile them): it is printed apart, then the best of the others. The table is the best repeat's self time
per top-level package (the sum is the import total); `--also MODULE` adds modules (e.g. datasets) to the set,
to price what a lazy import saves.
Last line: RESULT import_s=<best total> first_s=<first total>
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import time

RUN_IMPORTS = {
    "hf": ("walla.extract.run", "walla.extract.backends.hf._kind", "walla.extract.backends.hf._backend"),
    "vllm": (
        "walla.extract.run",
        "walla.extract.backends.vllm._backend",
        "transformers.models.auto.tokenization_auto",
    ),
}
LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)")


def one(modules: list[str]) -> tuple[float, dict[str, float]]:
    """(wall seconds of the interpreter, {top-level package: self seconds}) for one fresh import of `modules`."""
    code = "; ".join(f"import {m}" for m in modules)
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True)
    wall = time.perf_counter() - t
    if out.returncode != 0:
        raise SystemExit(f"import failed: {out.stderr.strip().splitlines()[-1:]}")
    per: collections.Counter = collections.Counter()
    for line in out.stderr.splitlines():
        m = LINE.match(line)
        if m:
            per[m[4].split(".")[0]] += int(m[1]) / 1e6
    return wall, dict(per)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], usage=argparse.SUPPRESS
    )  # a mistake: one line
    ap.add_argument("--backend", choices=sorted(RUN_IMPORTS), default="hf")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--also", action="append", default=[], help="another module to import with the run's")
    args = ap.parse_args()
    modules = [*RUN_IMPORTS[args.backend], *args.also]
    runs = [one(modules) for _ in range(max(args.repeats, 2))]
    first, rest = runs[0], runs[1:]
    wall, per = min(rest, key=lambda r: sum(r[1].values()))
    total = sum(per.values())
    print(f"imports: {', '.join(modules)}")
    print(f"first interpreter: {sum(first[1].values()):.2f} s of imports ({first[0]:.2f} s wall)")
    print(f"best of {len(rest)} more: {total:.2f} s of imports ({wall:.2f} s wall); by package (self time):")
    for name, sec in sorted(per.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"  {sec:6.2f} s  {100 * sec / total:4.1f}%  {name}")
    print(f"RESULT import_s={total:.2f} first_s={sum(first[1].values()):.2f}")


if __name__ == "__main__":
    main()
