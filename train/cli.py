"""`walla train`: train every method x seed of one scenario into runs/ (thin: options -> TrainConfig -> run).

    walla train --scenario demo-hetero-facts [--methods walla-i,uniform] [--seeds 5 | --seed-list 18,19]
                [--set walla.lr=1e-4] [--store walla-store] [--runs runs] [--device cpu|cuda|mps|auto]
                [--precision 32-true|bf16-mixed|auto] [--logger csv|tensorboard|wandb] [--force]
                [--calibrated] [--limit-rows N] [--show-plan] [--save-states all|METHODS|FAMILIES]
    walla train --scenario hetero [--dataset D] [--models a,b]          # every model extracted for D
                [--preset demo|paper]                                   # default: demo iff all embedded
    walla train --scenario homo --model M --agents N [--dataset D]      # N copies, one sees the context
    walla train --scenario hetero-context [--irrelevant] [--dataset D]  # all models, one sees the context
    walla train --scenario S --add-agent M [--drop-agent M] [--from-scratch]  # agents join / leave (join.py)

Runs live under runs/<scenario>/<method>/<key-id>/seed=<s>/ (train/runs/_layout.py): another config, precision
or device trains beside the existing runs; finished runs of the same run key are skipped unless --force.
The options are TrainConfig's fields (train/config.py), generated from them (cli/options.py); the options
and the scenario's name are checked before the recipe (train/run.py, torch, Lightning) is imported. Errors
are one line with the exit codes of cli/exits.py (--debug shows the traceback).
"""

from __future__ import annotations

import inspect
from typing import Any

import typer
from rich.console import Console
from walla.cli import options
from walla.cli.exits import USAGE, answered, fail
from walla.manifests.names import check_scenario, unknown
from walla.train.config import TrainConfig

app = options.app()
HELP = "Fit every method x seed of a scenario; write runs/<scenario>/<method>/<key-id>/seed=<s>/."
DEBUG = inspect.Parameter(
    "debug",
    inspect.Parameter.KEYWORD_ONLY,
    default=typer.Option(False, "--debug", help="show tracebacks"),
    annotation=bool,
)


def train(given: dict[str, Any], extras: dict[str, Any]) -> None:
    cfg = options.checked_config(TrainConfig, given, "train", lambda c: check_scenario(c.scenario, c.runs))
    if cfg.methods:  # the registry's names (it imports numpy, ~0.3 s): only when --methods names some
        from walla.train.methods import ALL, REGISTRY

        for name in cfg.methods:
            if name != ALL and name not in REGISTRY:
                methods = {"a method": (REGISTRY, "--methods {name}")}
                raise fail("train", unknown("method", name, methods, f"{ALL} or walla ls methods"), USAGE)
    interrupted = "interrupted; finished runs are kept, rerun to continue"
    with answered("train", extras["debug"], interrupted):
        from walla.train import run as recipe  # torch and Lightning, once the options hold: walla.cli.lazy

        recipe.run(cfg, Console())


options.config_command(app, TrainConfig, train, name="train", help=HELP, extra=[DEBUG])
