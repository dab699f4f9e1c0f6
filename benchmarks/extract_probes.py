"""What the hf backend's load-time invariance probes cost on a cold cache (issue 39: <= 10 s for a new model).

    .venv/bin/python benchmarks/extract_probes.py                          # SmolLM2 and Gemma-3-270M
    .venv/bin/python benchmarks/extract_probes.py --model gemma3-270m --threads 1

Loads the model as walla extract does (bf16 on the CPU, weights from $WALLA_CACHE's GGUF copy: run
`walla extract` once first), then runs the two probes of batch-invariant scoring with an empty checks folder:
the GEMM row probe (hf_checks.rows_invariant) and the packed-forward probe (hf_checks.packed_invariant). Prints
each one's wall and process CPU seconds, and the LM head's share of them (the head's GEMMs dominate a large
vocabulary). On a shared machine wall seconds move with the load; `--threads 1` CPU seconds move far less (no
threads waiting on each other), so compare those between two versions. Last line: `RESULT model=.. rows_s=..
packed_s=.. rows_cpu_s=.. packed_cpu_s=..` per model.
"""

# ruff: noqa: E402 (the options are read before the imports that load torch)
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path


def parser() -> argparse.ArgumentParser:
    """The options, built before torch loads: --help and a mistyped flag answer at once (one line, exit 2)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], usage=argparse.SUPPRESS)
    ap.add_argument("--model", default="smollm2-135m,gemma3-270m", help="comma-separated models.yaml names")
    ap.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    ap.add_argument("--batch-tokens", type=int, default=8192)
    return ap


if __name__ == "__main__":
    parser().parse_args()

import torch
from walla.extract.backends.hf import HFBackend, load_model
from walla.extract.backends.hf import _lm_head as lm_head
from walla.extract.backends.hf import _probes as hf_checks
from walla.extract.models import resolve_model
from walla.manifests.catalog import load_models


def timed(run, *args, **kwargs) -> tuple:
    """(result, wall seconds, process CPU seconds) of run(*args, **kwargs)."""
    t, c = time.perf_counter(), time.process_time()
    out = run(*args, **kwargs)
    return out, time.perf_counter() - t, time.process_time() - c


def main() -> None:
    args = parser().parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    head_cpu = [0.0]
    logits = lm_head.logits

    def counted(*a, **k):  # the LM head's GEMMs, as both probes and scoring call them
        c = time.process_time()
        out = logits(*a, **k)
        head_cpu[0] += time.process_time() - c
        return out

    lm_head.logits = counted
    results = []
    for name in args.model.split(","):
        model, tok = load_model(resolve_model(load_models()[name]), torch.bfloat16, "cpu")
        be = HFBackend(model, tok, batch_tokens=args.batch_tokens, batch_invariant=True, fixed_shapes=False)
        root = Path(tempfile.mkdtemp(prefix="walla-probes-"))
        head_cpu[0] = 0.0
        (ok, min_rows, why), rows_s, rows_cpu = timed(
            hf_checks.rows_invariant,
            be.model,
            be.batch_tokens,
            root,
            head_rows=be.head_rows(),
            vocab_chunk=be.vocab_chunk,
        )
        rows_head, head_cpu[0] = head_cpu[0], 0.0
        be.rows_invariant, be.min_rows = ok, max(2, min_rows)
        why_packed, packed_s, packed_cpu = "not run (rows differ)", 0.0, 0.0
        if ok:  # as HFBackend.settle_invariance: the packed probe runs where the GEMM rows agree
            (_, why_packed), packed_s, packed_cpu = timed(hf_checks.packed_invariant, be, root)
        print(f"{name} ({torch.get_num_threads()} threads): {why}; {why_packed}")
        print(
            f"  rows probe {rows_s:.1f} s (CPU {rows_cpu:.1f} s, LM head {rows_head:.1f}), packed probe "
            f"{packed_s:.1f} s (CPU {packed_cpu:.1f} s, LM head {head_cpu[0]:.1f})"
        )
        results.append(
            f"model={name} rows_s={rows_s:.2f} packed_s={packed_s:.2f} rows_cpu_s={rows_cpu:.2f} "
            f"packed_cpu_s={packed_cpu:.2f}"
        )
    print("RESULT " + " ".join(results))


if __name__ == "__main__":
    main()
