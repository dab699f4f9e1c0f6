"""`walla check`: the parity of the extraction backends on the same questions (the recipe: extract/parity.py).

    walla check --model smollm2-135m --dataset arc-challenge --data-file ARC-Challenge-Dev.jsonl --limit 50

Thin: options -> ExtractConfig (the one validator) -> run_check; the table and the JSON report. Exit codes:
cli/exits.py (2 a bad option or an unknown model/dataset name, 3 when the hub cannot serve it, 1 bad data
or a row beyond tolerance).
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

import typer
from walla.cli import options
from walla.cli.exits import DATA, answered
from walla.extract.backends.registry import backend_names
from walla.extract.config import ExtractConfig
from walla.manifests.names import check_extract_names
from walla.manifests.validate import COMMAND_LINE, UsageError, build

app = options.app(help="walla check: backend parity")


@app.command()
def check(
    model: str = typer.Option(..., help="model name from manifests/models.yaml"),
    dataset: str = typer.Option(..., help="dataset name from manifests/datasets.yaml"),
    data_file: Path = typer.Option(None, "--data-file", help="local copy of the dataset instead of the hub"),
    limit: int = typer.Option(50, help="first N questions"),
    backends: str = typer.Option(
        None,
        help="comma list of registered backends to compare with hf batched (default: every one usable here)",
    ),
    dtype: str = typer.Option(
        "float32", help="float32 (the sharp comparison) | bfloat16 | float16 | auto (measured)"
    ),
    device: str = typer.Option(None, help="cpu | cuda for the hf backend (default: cpu)"),
    report: Path = typer.Option(Path("walla-check.json"), help="where the JSON report goes"),
    tie_gap: float = typer.Option(
        None, "--tie-gap", help="near-tie: top-2 option probability gap below (default: 0.05)"
    ),
    backend_arg: list[str] = typer.Option(
        None,
        "--backend-arg",
        help="key=value for each compared backend whose options have that key, repeatable",
    ),
) -> None:
    """Parity of option probabilities, hidden states and prompt NLL across backends (exit 1 beyond tolerance)."""
    logging.basicConfig(level=logging.WARNING, format="walla check: %(message)s")
    names = [b.strip() for b in backends.split(",") if b.strip()] if backends else None
    with answered("check"):
        given = dict(
            model=model, dataset=dataset, data_file=data_file, limit=limit, dtype=dtype, device=device
        )
        cfg = build(
            ExtractConfig, {**given, "progress": False, "backend_args": backend_arg or []}, COMMAND_LINE
        )
        bad = [b for b in names or [] if b not in backend_names()]
        if bad:
            raise UsageError(f"--backends: unknown {', '.join(bad)} (expected {', '.join(backend_names())})")
        if tie_gap is not None and not 0 <= tie_gap < 1:
            raise UsageError(f"--tie-gap must be in [0, 1), got {tie_gap}")
        check_extract_names(cfg.model, cfg.dataset)
        from walla.extract import parity as recipe  # torch, transformers, the backends: walla.cli.lazy

        names = recipe.usable_backends() if names is None else names
        args = cfg.backend_args
        unused = set(args) - {k for b in {"hf", *names} for k in recipe.args_for(b, args)}
        if unused:
            raise UsageError(
                f"--backend-arg {', '.join(sorted(unused))}: no compared backend has that option"
            )
        tie_gap = recipe.TIE_GAP if tie_gap is None else tie_gap
        result = recipe.run_check(replace(cfg, backend=None), names, out=typer.echo, tie_gap=tie_gap)
    typer.echo(recipe.format_table(result["rows"]))
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
        raise typer.Exit(DATA)  # the FAIL line above names it
