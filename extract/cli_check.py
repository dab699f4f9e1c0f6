"""`walla check`: the parity of the extraction backends on the same questions (the recipe: extract/check.py).

    walla check --model smollm2-135m --dataset arc-challenge --data-file ARC-Challenge-Dev.jsonl --limit 50

Thin: options -> ExtractConfig (the one validator) -> run_check; the table and the JSON report. Exit 2 for
an unknown model/dataset name, 3 when the hub cannot serve it, 1 for bad input or a row beyond tolerance.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

import typer

app = typer.Typer(add_completion=False, help="walla check: backend parity")


@app.command()
def check(
    model: str = typer.Option(..., help="model name from manifests/models.yaml"),
    dataset: str = typer.Option(..., help="dataset name from manifests/datasets.yaml"),
    data_file: Path = typer.Option(None, "--data-file", help="local copy of the dataset instead of the hub"),
    limit: int = typer.Option(50, help="first N questions"),
    backends: str = typer.Option("hf,vllm", help="comma list of backends to compare with hf batched"),
    dtype: str = typer.Option(
        "float32", help="float32 (the sharp comparison) | bfloat16 | float16 | auto (measured)"
    ),
    device: str = typer.Option(None, help="cpu | cuda for the hf backend (default: cpu)"),
    report: Path = typer.Option(Path("walla-check.json"), help="where the JSON report goes"),
    tie_gap: float = typer.Option(
        None, "--tie-gap", help="near-tie: top-2 option probability gap below (default: 0.05)"
    ),
    max_model_len: int = typer.Option(None, "--max-model-len", help="vllm: context length"),
    gpu_memory_utilization: float = typer.Option(
        None, "--gpu-memory-utilization", help="vllm: memory fraction"
    ),
) -> None:
    """Parity of option probabilities, hidden states and prompt NLL across backends (exit 1 beyond tolerance)."""
    # the recipe (torch, transformers, the backends) is imported when the command runs: walla.cli.lazy
    from walla.extract.check import TIE_GAP, format_table, run_check
    from walla.extract.config import ExtractConfig
    from walla.extract.hub import HubUnavailableError
    from walla.manifests.validate import build

    logging.basicConfig(level=logging.WARNING, format="walla check: %(message)s")
    names = [b.strip() for b in backends.split(",") if b.strip()]
    tie_gap = TIE_GAP if tie_gap is None else tie_gap
    try:
        options = dict(
            model=model, dataset=dataset, data_file=data_file, limit=limit, dtype=dtype, device=device
        )
        vllm_opts = {"max_model_len": max_model_len, "gpu_memory_utilization": gpu_memory_utilization}
        cfg = build(ExtractConfig, {**options, "progress": False, **vllm_opts}, where="command line")
        bad = [b for b in names if b not in ("hf", "vllm", "dummy")]
        if bad:
            raise ValueError(f"--backends: unknown {', '.join(bad)} (expected hf, vllm)")
        if not 0 <= tie_gap < 1:
            raise ValueError(f"--tie-gap must be in [0, 1), got {tie_gap}")
        result = run_check(replace(cfg, backend=None), names, out=typer.echo, tie_gap=tie_gap)
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
    how = (
        f"vllm within {result['noise_factor']:g}x hf's own noise (hf padded, hf float32)"
        if result["noise_factor"]
        else "float32 tolerances"
    )
    typer.echo(
        f"{verdict} ({result['dtype']}, {how}; near-tie gap {result['tie_gap']:g}: {result['tolerances']}); "
        f"report {report}"
    )
    if not result["passed"]:
        raise typer.Exit(1)
