"""`walla-train`: train every method x seed of one scenario into runs/ (thin: parse, validate, run).

    walla-train --scenario homo-pubmedqa-aloe-x4 [--methods walla-i,uniform] [--seeds 5 | --seed-list 18,19]
                [--store walla-store] [--runs runs] [--device cpu|cuda] [--force] [--calibrated] [--limit-rows N]

Finished runs (run.json present) are skipped unless --force. Errors a user can cause (unknown scenario
or method, missing feature sets, bad hyper-parameters) print one message and exit with status 2.
"""

from __future__ import annotations

import difflib
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from walla.train.config import TrainConfig

app = typer.Typer(add_completion=False, help="walla train stage: fit every method x seed of a scenario.")
err = Console(stderr=True)


def _fail(msg: str) -> None:
    err.print(f"[bold red]error:[/] {msg}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def _parse_methods(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    from walla.train.methods import REGISTRY

    names = tuple(m.strip() for m in text.split(",") if m.strip())
    if not names:
        _fail("--methods: empty list")
    for m in names:
        if m not in REGISTRY:
            close = difflib.get_close_matches(m, REGISTRY, n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            _fail(f"unknown method {m!r}.{hint} Available: {', '.join(REGISTRY)}")
    return names


def _parse_seeds(n: int | None, seed_list: str | None) -> tuple[int, ...] | None:
    if n is not None and seed_list is not None:
        _fail("give either --seeds N or --seed-list a,b,..., not both")
    if seed_list is not None:
        try:
            return tuple(int(s) for s in seed_list.split(",") if s.strip())
        except ValueError:
            _fail(f"--seed-list: expected comma-separated integers, got {seed_list!r}")
    if n is not None:
        if n < 1:
            _fail(f"--seeds must be >= 1, got {n}")
        return tuple(18 + r for r in range(n))  # SPEC §4.5: repeat r uses seed 18 + r
    return None


def load_entry(scenario: str):
    """The scenario manifest (a module-level function so tests can substitute it)."""
    from walla.store.manifests import load_scenario

    return load_scenario(scenario)


def load_data(entry, store: Path):
    """Assemble the scenario's arrays from the store (substituted in tests)."""
    from walla.store.scenario import assemble_scenario

    if not Path(store).exists():
        raise FileNotFoundError(
            f"store {store} does not exist (run `make extract ...` first, or pass --store)"
        )
    return assemble_scenario(entry, Path(store))


def _summary_table(summary, console: Console) -> None:
    from walla.train.methods import REGISTRY

    table = Table(title=f"{summary.scenario}: test split, mean over seeds", title_justify="left")
    for col, just in (
        ("method", "left"),
        ("display", "left"),
        ("seeds", "right"),
        ("Brier", "right"),
        ("ACC", "right"),
        ("s/run", "right"),
        ("new", "right"),
    ):
        table.add_column(col, justify=just)
    for method, results in summary.by_method().items():
        briers = [r.test_brier for r in results]
        accs = [r.test_acc for r in results]
        new = sum(r.status == "done" for r in results)
        walls = [r.wall_s for r in results if r.status == "done"]
        table.add_row(
            method,
            REGISTRY[method].display,
            str(len(results)),
            f"{sum(briers) / len(briers):.4f}",
            f"{100 * sum(accs) / len(accs):.2f}",
            f"{sum(walls) / len(walls):.2f}" if walls else "-",
            str(new),
        )
    console.print(table)
    console.print(f"runs written under {summary.runs_dir / summary.scenario}")


@app.command()
def train(
    scenario: str = typer.Option(..., "--scenario", help="scenario name (manifests/scenarios) or YAML path"),
    methods: str = typer.Option(None, "--methods", help="comma-separated method names (default: scenario's)"),
    seeds: int = typer.Option(None, "--seeds", help="number of seeds 18, 19, ... (default: scenario's)"),
    seed_list: str = typer.Option(None, "--seed-list", help="explicit seeds, e.g. 18,19"),
    store: Path = typer.Option(Path("walla-store"), "--store", help="feature store root"),
    runs: Path = typer.Option(Path("runs"), "--runs", help="runs root"),
    device: str = typer.Option("cpu", "--device", help="cpu | cuda"),
    force: bool = typer.Option(False, "--force", help="rerun finished runs"),
    calibrated: bool = typer.Option(False, "--calibrated", help="calibrate every agent first (SPEC §9)"),
    limit_rows: int = typer.Option(None, "--limit-rows", help="keep about N rows (split shares kept)"),
) -> None:
    """Fit every method x seed of a scenario; write runs/<scenario>/<method>/seed=<s>/."""
    from walla.store.manifests import ManifestError
    from walla.train.run import run_scenario

    method_names = _parse_methods(methods)
    seed_tuple = _parse_seeds(seeds, seed_list)
    try:
        cfg = TrainConfig(
            scenario=scenario,
            methods=method_names,
            seeds=seed_tuple or (18,),
            store=str(store),
            runs=str(runs),
            device=device,
            force=force,
            calibrated=calibrated,
            limit_rows=limit_rows,
        )
    except ValueError as e:
        _fail(str(e))
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            _fail("--device cuda: no CUDA device is available on this machine (use --device cpu)")
    console = Console()
    try:
        entry = load_entry(scenario)
        data = load_data(entry, store)
    except (ManifestError, KeyError, ValueError, FileNotFoundError, OSError) as e:
        _fail(str(e).strip("'\""))
    method_list = list(cfg.methods or entry.methods)
    seed_values = list(seed_tuple or entry.seeds)
    console.print(
        f"walla-train: scenario [bold]{data.name}[/] ({len(data.split)} questions, {data.n_agents} agents), "
        f"{len(method_list)} methods x {len(seed_values)} seeds -> {runs}"
    )
    columns = (TextColumn("{task.description:<22}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as bar:
        total = bar.add_task("all runs", total=len(method_list) * len(seed_values))
        tasks = {m: bar.add_task(m, total=len(seed_values)) for m in method_list}

        def progress(event: str, method: str, seed: int | None) -> None:
            if event in ("done", "skipped"):
                bar.advance(tasks[method])
                bar.advance(total)

        try:
            summary = run_scenario(
                data,
                method_list,
                seed_values,
                runs,
                force=force,
                device=device,
                calibrated=calibrated or bool(getattr(entry, "calibrated", False)),
                limit=limit_rows,
                progress=progress,
                entry=entry,
            )
        except (KeyError, ValueError, FileNotFoundError) as e:
            bar.stop()
            _fail(str(e).strip("'\""))
        except ModuleNotFoundError as e:
            bar.stop()
            _fail(f"a method's module is not installed: {e}")
    _summary_table(summary, console)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:  # finished runs are complete on disk; the interrupted one has no run.json
        err.print("interrupted; finished runs are kept, rerun to continue")
        sys.exit(130)
