"""`walla extract`: run the extraction recipe (extract/run.py) for one model and one dataset.

    walla extract --model smollm2-135m --dataset facts
    walla extract --model smollm2-135m --dataset arc-challenge --data-file ARC-Challenge-Dev.jsonl
    walla extract --model aloe --dataset pubmedqa --backend vllm --backend-arg max_model_len=4096

Thin: the options are ExtractConfig's fields (extract/config.py), generated from them (cli/options.py); the
options and the model and dataset names are checked before the recipe (torch, transformers) is imported.
Every failure is ONE line on stderr with the exit codes of cli/exits.py: 2 for a bad option or an unknown
name (a bad `--backend-arg`, a device this machine lacks), 3 when the hub cannot serve a model or dataset,
1 for bad data or store problems, 130 when interrupted (rerun to resume).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import typer
from walla.cli import options
from walla.cli.exits import answered
from walla.cli.finish import finish
from walla.cli.lazy import run as run_command
from walla.extract.config import ExtractConfig
from walla.manifests.names import check_extract_names

app = options.app(help="walla extract stage: LLM features of a dataset into the store")
HELP = "Extract option log-probs, last-token hidden states and prompt NLL for every prompt variant."
RESUME = "interrupted; rerun the same command to resume after the last durable shard"


def extract(given: dict[str, Any], extras: dict[str, Any]) -> None:
    cfg = options.checked_config(
        ExtractConfig, given, "extract", lambda c: check_extract_names(c.model, c.dataset)
    )
    logging.basicConfig(level=logging.WARNING, format="walla extract: %(message)s")
    with answered("extract", interrupted=RESUME):
        from walla.extract import (
            run as recipe,  # torch and transformers, once the options hold: walla.cli.lazy
        )

        timeline = recipe.Timeline()  # after the imports: start-up includes them
        recipe.run(cfg, out=typer.echo, timeline=timeline)
        typer.echo(timeline.line(), err=True)  # on stderr: stdout's last line stays the feature set's path


options.config_command(app, ExtractConfig, extract, name="extract", help=HELP)


def main() -> None:
    """`python -m walla.extract.cli ...`: `walla extract ...`."""
    finish(run_command(app, sys.argv[1:], "walla extract"), "extract")


if __name__ == "__main__":
    sys.exit(main())
