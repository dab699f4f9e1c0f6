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

Runs live under runs/<scenario>/<method>/<key-id>/seed=<s>/ (train/runs.py): another config, precision
or device trains beside the existing runs; finished runs of the same run key are skipped unless --force.
Every error a user can cause is one line on stderr and exit status 2 (--debug shows the traceback).
The options are TrainConfig's fields (train/config.py), by the same names; the recipe is train/run.py.
`walla-train` is the same command.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

app = typer.Typer(add_completion=False, help="walla train stage: fit every method x seed of a scenario.")
err = Console(stderr=True, highlight=False, soft_wrap=True)
USER_ERRORS = (ValueError, KeyError, RuntimeError, OSError, ModuleNotFoundError)  # ConfigError: a ValueError


def _fail(msg: str) -> None:
    err.print(f"[bold red]error:[/] {escape(msg)}", markup=True)
    raise typer.Exit(2)


@app.command()
def train(
    scenario: str = typer.Option(
        ..., "--scenario", help="manifest name or YAML path, or hetero | homo | hetero-context"
    ),
    dataset: str = typer.Option(
        None, "--dataset", help="hetero/homo/hetero-context: the dataset (default: the store's one)"
    ),
    models: str = typer.Option(
        None, "--models", help="hetero/hetero-context: comma-separated models (default: all extracted)"
    ),
    model: str = typer.Option(None, "--model", help="homo: the model copied into every slot"),
    agents: int = typer.Option(None, "--agents", help="homo: number of agents"),
    irrelevant: bool = typer.Option(
        False, "--irrelevant", help="hetero-context: one more agent sees another question's context"
    ),
    eval_dataset: str = typer.Option(
        None, "--eval-dataset", help="hetero/homo/hetero-context: test on every row of this dataset (OOD)"
    ),
    preset: str = typer.Option(
        None,
        "--preset",
        help="hetero/homo/hetero-context: demo | paper hyper-parameters (default: demo iff every agent "
        "is an embedded model)",
    ),
    add_agent: list[str] = typer.Option(
        [], "--add-agent", help="a model joins the trained scenario S (repeatable)"
    ),
    drop_agent: list[str] = typer.Option(
        [], "--drop-agent", help="the last agent of this model leaves S (repeatable)"
    ),
    from_scratch: bool = typer.Option(
        False, "--from-scratch", help="with --add/--drop-agent: train every head anew"
    ),
    join_epochs: int = typer.Option(
        1, "--join-epochs", help="with --add/--drop-agent: passes over the training stream"
    ),
    methods: str = typer.Option(
        None, "--methods", help="comma-separated method names (default: the scenario's)"
    ),
    seeds: int = typer.Option(None, "--seeds", help="number of seeds 18, 19, ... (default: the scenario's)"),
    seed_list: str = typer.Option(None, "--seed-list", help="explicit seeds, e.g. 18,19"),
    sets: list[str] = typer.Option([], "--set", help="hyper-parameter override METHOD_OR_FAMILY.KEY=VALUE"),
    store: str = typer.Option(
        "walla-store", "--store", help="feature store: a directory or an fsspec URL (s3://...)"
    ),
    runs: Path = typer.Option(Path("runs"), "--runs", help="runs root"),
    device: str = typer.Option("cpu", "--device", help="cpu | cuda | cuda:N | mps | auto"),
    precision: str = typer.Option(
        "32-true", "--precision", help="Lightning precision: 32-true | bf16-mixed | 16-mixed | 64-true | auto"
    ),
    logger: str = typer.Option("csv", "--logger", help="csv (always written) | tensorboard | wandb"),
    force: bool = typer.Option(False, "--force", help="rerun finished runs"),
    save_states: str = typer.Option(
        None,
        "--save-states",
        help="methods whose runs write state.pt (for --add-agent and walla market): all, or names or "
        "families, e.g. walla-i or walla (default: none; predictions are always written)",
    ),
    calibrated: bool = typer.Option(
        None, "--calibrated/--uncalibrated", help="calibrate every agent first (SPEC §9)"
    ),
    limit_rows: int = typer.Option(None, "--limit-rows", help="keep about N rows (split shares kept)"),
    show_plan: bool = typer.Option(False, "--show-plan", help="print the resolved plan as YAML and exit"),
    debug: bool = typer.Option(False, "--debug", help="show tracebacks"),
) -> None:
    """Fit every method x seed of a scenario; write runs/<scenario>/<method>/<key-id>/seed=<s>/."""
    options = dict(locals())  # every option above, named as TrainConfig's fields
    del options["debug"]
    try:
        # the config and the recipe (torch, Lightning) are imported when the command runs: walla.cli.lazy
        from walla.manifests.validate import build
        from walla.train.config import TrainConfig
        from walla.train.run import run

        run(build(TrainConfig, options, where="command line"), Console())
    except typer.Exit:
        raise
    except KeyboardInterrupt:  # finished runs are complete on disk; the interrupted one has no run.json
        err.print("interrupted; finished runs are kept, rerun to continue")
        raise typer.Exit(130) from None
    except USER_ERRORS as e:  # one line (a ConfigError: one per problem), naming the option
        if debug:
            raise
        _fail(str(e.args[0] if isinstance(e, KeyError) and e.args else e))
