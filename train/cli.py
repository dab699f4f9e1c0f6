"""`walla-train`: train every method x seed of one scenario into runs/ (thin: plan, assemble, run).

    walla-train --scenario demo-hetero-facts [--methods walla-i,uniform] [--seeds 5 | --seed-list 18,19]
                [--set walla.lr=1e-4] [--store walla-store] [--runs runs] [--device cpu|cuda|mps|auto]
                [--precision 32-true|bf16-mixed|auto] [--logger csv|tensorboard|wandb] [--force]
                [--calibrated] [--limit-rows N] [--show-plan] [--save-states all|METHODS|FAMILIES]
    walla-train --scenario hetero [--dataset D] [--models a,b]          # every model extracted for D
                [--preset demo|paper]                                   # default: demo iff all embedded
    walla-train --scenario homo --model M --agents N [--dataset D]      # N copies, one sees the context
    walla-train --scenario hetero-context [--irrelevant] [--dataset D]  # all models, one sees the context
    walla-train --scenario S --add-agent M [--drop-agent M] [--from-scratch]  # agents join / leave (join.py)

Runs live under runs/<scenario>/<method>/<key-id>/seed=<s>/ (train/runs.py): another config, precision
or device trains beside the existing runs; finished runs of the same run key are skipped unless --force.
Every error a user can cause is one line on stderr and exit status 2 (--debug shows the traceback).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import typer
import yaml
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from walla.manifests.validate import ConfigError
from walla.store.location import as_location
from walla.store.scenario import assemble_scenario
from walla.train.engine import TrainEnv, resolve_device, resolve_precision
from walla.train.join import initial_params, joined_plan
from walla.train.kinds import KINDS, plan_for_kind
from walla.train.loggers import check_logger
from walla.train.plan import Overrides, load_plan, plan_yaml, with_spec
from walla.train.run import run_plan, states_to_save

app = typer.Typer(add_completion=False, help="walla train stage: fit every method x seed of a scenario.")
err = Console(stderr=True, highlight=False, soft_wrap=True)
USER_ERRORS = (
    ValueError,
    KeyError,
    FileNotFoundError,
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
)


def _fail(msg: str) -> None:
    err.print(f"[bold red]error:[/] {escape(msg)}", markup=True)
    raise typer.Exit(2)


def _parse_list(text: str | None, what: str) -> tuple[str, ...] | None:
    if text is None:
        return None
    names = tuple(m.strip() for m in text.split(",") if m.strip())
    if not names:
        raise ValueError(f"{what}: empty list")
    return names


def _parse_seeds(n: int | None, seed_list: str | None) -> tuple[int, ...] | None:
    if n is not None and seed_list is not None:
        raise ValueError("give either --seeds N or --seed-list a,b,..., not both")
    if seed_list is not None:
        try:
            return tuple(int(s) for s in seed_list.split(",") if s.strip())
        except ValueError:
            raise ValueError(f"--seed-list: expected comma-separated integers, got {seed_list!r}") from None
    if n is not None:
        if n < 1:
            raise ValueError(f"--seeds must be >= 1, got {n}")
        return tuple(18 + r for r in range(n))  # SPEC §4.5: repeat r uses seed 18 + r
    return None


def _parse_sets(items: list[str]) -> dict[str, dict]:
    """--set walla.lr=1e-4 --set route-llm.epochs=2 -> {"walla": {"lr": 1e-4}, "route-llm": {"epochs": 2}}."""
    out: dict[str, dict] = {}
    for item in items:
        key, eq, value = item.partition("=")
        method, dot, field = key.partition(".")
        if not (eq and dot and method and field):
            raise ValueError(f"--set {item!r}: expected METHOD_OR_FAMILY.KEY=VALUE, e.g. walla.lr=1.0e-4")
        out.setdefault(method, {})[field] = yaml.safe_load(value)
    return out


def _summary(results: list[dict], scenario: str, runs: Path, console: Console) -> None:
    table = Table(title=f"{scenario}: test split, mean over seeds", title_justify="left")
    for col in ("method", "display", "seeds", "Brier", "ACC", "s/run", "new"):
        table.add_column(col, justify="left" if col in ("method", "display") else "right")
    by: dict[str, list[dict]] = {}
    for r in results:
        by.setdefault(r["method"], []).append(r)
    for method, rs in by.items():
        walls = [r["wall_time_s"] for r in rs if r["status"] == "done"]
        table.add_row(
            method,
            rs[0].get("display_name", method),
            str(len(rs)),
            f"{sum(r['test_brier'] for r in rs) / len(rs):.4f}",
            f"{100 * sum(r['test_acc'] for r in rs) / len(rs):.2f}",
            f"{sum(walls) / len(walls):.2f}" if walls else "-",
            str(len(walls)),
        )
    console.print(table)
    console.print(f"runs written under {runs / scenario}")


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
    store_arg: str = typer.Option(
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
    console = Console()
    try:
        store = as_location(store_arg)  # a local Path (the fast path) or a RemotePath over fsspec

        overrides = Overrides(
            methods=_parse_list(methods, "--methods"),
            seeds=_parse_seeds(seeds, seed_list),
            calibrated=calibrated,
            hparams=_parse_sets(sets),
        )
        kind_args = dict(
            dataset=dataset,
            models=_parse_list(models, "--models"),
            model=model,
            agents=agents,
            irrelevant=irrelevant,
            eval_dataset=eval_dataset,
        )

        preset_line = None
        if scenario in KINDS:
            plan, preset_line = plan_for_kind(scenario, store, overrides, preset, **kind_args)
        elif preset is not None:
            raise ValueError(
                f"--preset is for --scenario {' | '.join(KINDS)}; scenario {scenario!r} names its presets "
                "in its include: list"
            )
        else:
            plan = load_plan(scenario, overrides)
        base_plan, origin = plan, None
        if add_agent or drop_agent:
            plan, origin = joined_plan(
                plan, list(add_agent), list(drop_agent), None if from_scratch else join_epochs
            )
            if from_scratch:
                plan = with_spec(plan, dataclasses.replace(plan.spec, name=f"{plan.spec.name}-scratch"))
        elif from_scratch:
            raise ValueError("--from-scratch goes with --add-agent / --drop-agent")
        states = states_to_save(save_states, plan)
        if show_plan:
            sys.stdout.write((f"# {preset_line}\n" if preset_line else "") + plan_yaml(plan))
            return
        if preset_line:
            console.print(preset_line, highlight=False, markup=False)

        check_logger(logger)
        dev = resolve_device(device)
        env = TrainEnv(device=dev, precision=resolve_precision(precision, dev), store=store)
        if not store.is_dir():
            raise FileNotFoundError(
                f"store {store_arg} does not exist (run `make extract ...` first, or pass --store)"
            )
        data = assemble_scenario(plan.scenario, store)
        if limit_rows is not None:
            if limit_rows < 3:
                raise ValueError(f"--limit-rows must be >= 3, got {limit_rows}")
            data = data.limit_rows(limit_rows)
        initial = None
        if origin is not None and not from_scratch:  # continue the base runs of this command's key
            base_data = assemble_scenario(base_plan.scenario, store)
            if limit_rows is not None:
                base_data = base_data.limit_rows(limit_rows)
            initial = initial_params(base_plan, plan, origin, base_data, data, runs, env)
        console.print(
            f"walla-train: scenario [bold]{data.name}[/] ({len(data.split)} questions, {data.n_agents} agents), "
            f"{len(plan.methods)} methods x {len(plan.seeds)} seeds on {env.device} ({env.precision}) -> {runs}"
        )
        columns = (
            TextColumn("{task.description:<22}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=console, transient=False) as bar:
            total = bar.add_task("all runs", total=len(plan.methods) * len(plan.seeds))
            tasks = {m.name: bar.add_task(m.name, total=len(plan.seeds)) for m in plan.methods}

            def progress(event: str, method: str, seed: int | None) -> None:
                if event in ("done", "skipped"):
                    bar.advance(tasks[method])
                    bar.advance(total)

            results = run_plan(
                plan,
                data,
                runs,
                env,
                force=force,
                logger=logger,
                progress=progress,
                note=lambda s: console.print(f"note: {s}", highlight=False),
                initial=initial,
                save_states=states,
            )
        _summary(results, data.name, runs, console)
    except typer.Exit:
        raise
    except (ConfigError, *USER_ERRORS, RuntimeError, OSError, ModuleNotFoundError) as e:
        if debug:
            raise
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        _fail(str(msg))


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:  # finished runs are complete on disk; the interrupted one has no run.json
        err.print("interrupted; finished runs are kept, rerun to continue")
        sys.exit(130)
