"""`walla market agent` and `walla market replay` (registered on walla.market.cli.app when the CLI runs).

They import torch, the extraction backends and the run reader, so they live apart from init/serve/add-agent.
"""

from __future__ import annotations

import logging
from pathlib import Path

import typer
from walla.market.cli import app, fail


def _parse_seeds(text: str | None) -> list[int] | None:
    if text is None or text == "all":
        return None
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise fail(f"--seeds: expected 'all' or comma-separated integers, got {text!r}") from None


@app.command()
def agent(
    url: str = typer.Option(..., "--url", help="the market, e.g. http://127.0.0.1:8765"),
    token: str = typer.Option(..., "--token", help="this agent's token (walla market add-agent)"),
    model: str = typer.Option(
        ..., "--model", help="model name from manifests/models.yaml (or hf:org/name, a dir)"
    ),
    head: Path = typer.Option(..., "--head", help="a WALLA run directory (its state.pt holds the heads)"),
    slot: int = typer.Option(0, "--slot", help="which agent of the run this is (0-based)"),
    dataset: str = typer.Option(
        ..., "--dataset", help="the prompt template and option tokens of this dataset (the run's, e.g. facts)"
    ),
    device: str = typer.Option("cpu", "--device", help="cpu | cuda"),
    learn: bool = typer.Option(True, "--learn/--frozen", help="update the head from its own payouts"),
    batch_size: int = typer.Option(1, "--batch-size", help="resolved rounds per head update"),
    poll: float = typer.Option(2.0, "--poll", help="seconds between polls"),
    max_rounds: int = typer.Option(
        None, "--max-rounds", help="stop after this many reports and their payouts"
    ),
) -> None:
    """Run one agent: report on every open round with the LLM's forecast and the head's wager; learn."""
    logging.basicConfig(level=logging.INFO, format="walla market agent: %(message)s")
    from walla.market.agent import Agent, LLMFeatures
    from walla.market.client import MarketClient, MarketError
    from walla.market.head import AgentHead
    from walla.train.runs import RunFormatError

    if batch_size < 1 or poll <= 0:
        raise fail("--batch-size must be >= 1 and --poll > 0")
    try:
        h = AgentHead.from_run(head, slot)
        client = MarketClient(url, token)
        who = client.me()
        features = LLMFeatures(model, dataset, device=device)
        typer.echo(
            f"walla market agent: {who['name']} on {url}, {model} ({dataset} prompts), head {head} slot {slot}",
            err=True,
        )
        Agent(client, h, features, learn, batch_size).run(poll, max_rounds)
    except (RunFormatError, ValueError, KeyError, FileNotFoundError, OSError) as e:
        raise fail(e.args[0] if isinstance(e, KeyError) and e.args else e) from None
    except MarketError as e:
        raise fail(f"--url {url}: {e}") from None
    except Exception as e:  # httpx transport errors: the market is unreachable
        if type(e).__module__.startswith(("httpx", "httpcore")):
            raise fail(f"--url {url}: cannot reach the market ({e})") from None
        raise


@app.command()
def replay(
    scenario: str = typer.Option(..., "--scenario", help="a trained scenario (walla-train --scenario ...)"),
    runs: Path = typer.Option(Path("runs"), "--runs", help="runs root"),
    store: Path = typer.Option(Path("walla-store"), "--store", help="the feature store it was trained from"),
    method: str = typer.Option("walla-i", "--method", help="walla-i | walla-ii | walla-i-log"),
    seeds: str = typer.Option("all", "--seeds", help="'all' or comma-separated seeds"),
    learn: bool = typer.Option(False, "--learn", help="heads keep learning from their payouts"),
    batch_size: int = typer.Option(1, "--batch-size", help="with --learn: resolved rounds per head update"),
    limit: int = typer.Option(None, "--limit", help="first N test questions only"),
) -> None:
    """Stream a trained scenario's test split through a live market; check it against walla-train's predictions."""
    from walla.market.replay import TOLERANCE, ReplayConfig
    from walla.market.replay import replay as run_replay
    from walla.store.layout import StoreError
    from walla.train.runs import RunFormatError

    if limit is not None and limit < 1:
        raise fail(f"--limit: expected >= 1, got {limit}")
    if batch_size < 1:
        raise fail(f"--batch-size: expected >= 1, got {batch_size}")
    if not runs.is_dir():
        raise fail(f"--runs {runs}: no such directory (run walla-train first)")
    if not store.is_dir():
        raise fail(f"--store {store}: no such directory")
    cfg = ReplayConfig(scenario, runs, store, method, _parse_seeds(seeds), learn, batch_size, limit)
    try:
        result = run_replay(cfg, out=typer.echo)
    except (RunFormatError, StoreError, ValueError, KeyError, FileNotFoundError) as e:
        raise fail(e.args[0] if isinstance(e, KeyError) and e.args else e) from None
    _print_report(result, learn)
    worst = max(result.max_diff.values())
    if not learn and worst > TOLERANCE:
        raise fail(f"live and offline differ by {worst:.3g} > {TOLERANCE:g}")


def _print_report(result, learn: bool) -> None:
    from walla.market.replay import METRICS

    diff = ", ".join(f"{k} {v:.2e}" for k, v in result.max_diff.items())
    typer.echo(f"max |live - offline| over {len(result.seeds)} seed(s): {diff}")
    live, off = result.mean("live"), result.mean("offline")
    label = "live (learning)" if learn else "live"
    typer.echo(
        f"{'metric':<10} {label:>16} {'offline (walla-train)':>22}   (mean over seeds; x100 as in the tables)"
    )
    for k in METRICS:
        typer.echo(f"{k:<10} {100 * live[k]:>16.2f} {100 * off[k]:>22.2f}")
    deficit = sum(s.deficit for s in result.seeds)
    bound = sum(s.deficit_bound for s in result.seeds)
    typer.echo(
        f"market deficit (total net payout) {deficit:.4f} against its bound {bound:.1f} (c2^2/c3 per round)"
    )
