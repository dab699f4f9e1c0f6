"""`walla market replay`: a trained scenario's test split through a live market, checked against walla train.

walla market replay --scenario demo-homo-facts --runs runs --store walla-store [--key KEY_ID | --run DIR]
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from walla.cli import options
from walla.cli.exits import USAGE
from walla.market.launch import fail

if TYPE_CHECKING:
    from walla.market.replay import ReplayResult

app = options.app()


def _parse_seeds(text: str | None) -> list[int] | None:
    if text is None or text == "all":
        return None
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise fail(f"--seeds: expected 'all' or comma-separated integers, got {text!r}", USAGE) from None


@app.command("replay")
def replay_command(
    scenario: str = typer.Option(None, "--scenario", help="a trained scenario (walla train --scenario ...)"),
    runs: Path = typer.Option(Path("runs"), "--runs", help="runs root"),
    store: Path = typer.Option(Path("walla-store"), "--store", help="the feature store it was trained from"),
    method: str = typer.Option(None, "--method", help="walla-i (default) | walla-ii | walla-i-log"),
    key: str = typer.Option(
        None, "--key", help="the run key id (runs/<scenario>/<method>/<key-id>) when the method has several"
    ),
    run: Path = typer.Option(
        None, "--run", help="a run key directory or one of its seed=<s> dirs (instead of --scenario/--key)"
    ),
    seeds: str = typer.Option("all", "--seeds", help="'all' or comma-separated seeds"),
    learn: bool = typer.Option(False, "--learn", help="heads keep learning from their payouts"),
    batch_size: int = typer.Option(1, "--batch-size", help="with --learn: resolved rounds per head update"),
    limit: int = typer.Option(None, "--limit", help="first N test questions only"),
    db: str = typer.Option(
        None, "--db", help="keep the replay's ledger in this new SQLite file (one seed), e.g. to audit it"
    ),
) -> None:
    """Stream a trained scenario's test split through a live market; check it against walla train's predictions."""
    if limit is not None and limit < 1:
        raise fail(f"--limit: expected >= 1, got {limit}", USAGE)
    if batch_size < 1:
        raise fail(f"--batch-size: expected >= 1, got {batch_size}", USAGE)
    if run is None and scenario is None:
        raise fail("name the trained runs: --scenario NAME (with --runs), or --run DIR", USAGE)
    if run is None and not runs.is_dir():
        raise fail(f"--runs {runs}: no such directory (run walla train first)")
    if not store.is_dir():
        raise fail(f"--store {store}: no such directory")
    seed_list = _parse_seeds(seeds)
    if db is not None and ("://" in db or Path(db).exists() or len(seed_list or []) != 1):
        raise fail(
            f"--db {db}: expected a new SQLite file and one seed (--seeds S): each seed is its own market",
            USAGE,
        )
    # its one implementation module, once the options hold: the replay (a live server, torch, the trained
    # heads) is imported when it runs (walla.cli.lazy)
    from walla.market import replay as recipe

    cfg = recipe.ReplayConfig(
        scenario,
        None if run is not None else runs,
        store,
        method,
        seed_list,
        learn,
        batch_size,
        limit,
        db=db,
        key=key,
        run=run,
    )
    try:
        result = recipe.replay(cfg, out=typer.echo)
    except (ValueError, KeyError, FileNotFoundError) as e:  # RunFormatError, StoreError: ValueErrors
        raise fail(e.args[0] if isinstance(e, KeyError) and e.args else e) from None
    _print_report(result, learn, recipe.METRICS)
    worst = max(result.max_diff.values())
    if not learn and worst > recipe.TOLERANCE:
        raise fail(f"live and offline differ by {worst:.3g} > {recipe.TOLERANCE:g}")


def _print_report(result: ReplayResult, learn: bool, metrics: tuple[str, ...]) -> None:
    diff = ", ".join(f"{k} {v:.2e}" for k, v in result.max_diff.items())
    typer.echo(f"max |live - offline| over {len(result.seeds)} seed(s) of run key {result.key_id}: {diff}")
    live, off = result.mean("live"), result.mean("offline")
    label = "live (learning)" if learn else "live"
    typer.echo(
        f"{'metric':<10} {label:>16} {'offline (walla train)':>22}   (mean over seeds; x100 as in the tables)"
    )
    for k in metrics:
        typer.echo(f"{k:<10} {100 * live[k]:>16.2f} {100 * off[k]:>22.2f}")
    deficit = sum(s.deficit for s in result.seeds)
    bound = sum(s.deficit_bound for s in result.seeds)
    typer.echo(
        f"market deficit (total net payout) {deficit:.4f} against its bound {bound:.1f} (c2^2/c3 per round)"
    )
