"""`walla demo`: the whole offline pipeline on two small embedded LLMs (what `make demo` runs).

    walla demo [--out demo-out] [--facts 400] [--seeds 5] [--scenario S ...] [--model M ...]

Read top to bottom: generate `--facts` private-fact questions and extract them with each model, with and
without the fact (variants none,relevant); train every method x seed of the paper's three scenario kinds
(homogeneous with private context, heterogeneous without context, heterogeneous with private context);
write the report. Each step is the stage's own command (`walla extract|train|eval`, in this process), so
its output and exit codes are exactly those of the command; the first step that fails stops the demo.
"""

from __future__ import annotations

import time
from pathlib import Path

import typer
from walla.cli import options
from walla.cli.lazy import run
from walla.cli.main import app as root

MODELS = ("smollm2-135m", "gemma3-270m")  # the two embedded offline LLMs (pip extra walla[embedded])
SCENARIOS = ("demo-homo-facts", "demo-hetero-nocontext", "demo-hetero-facts")
# Runs keep a head state (state.pt) only where something reads it: the demo keeps WALLA I's heads of
# demo-homo-facts, which `walla market replay --scenario demo-homo-facts` plays (docs/market.md).
STATES = ("demo-homo-facts:walla-i", "demo-hetero-facts:walla-i")  # replay; serve (docs/serve.md)

app = options.app(help="walla demo: the offline pipeline of `make demo`")


def steps(
    out: Path,
    facts: int,
    seeds: int,
    models: list[str],
    scenarios: list[str],
    states: tuple[str, ...] | list[str] = STATES,
) -> list[list[str]]:
    """The demo's `walla` command lines, in order. `states`: SCENARIO:METHODS whose runs keep state.pt."""
    keep = {}
    for item in states:
        scenario, sep, methods = item.partition(":")
        if not (sep and scenario and methods):
            raise typer.BadParameter(f"--save-states {item!r}: expected SCENARIO:METHODS, e.g. {STATES[0]}")
        keep[scenario] = methods
    store, runs = str(out / "store"), str(out / "runs")
    extract = [
        ["extract", "--model", m, "--dataset", "facts", "--size", str(facts), "--variants", "none,relevant"]
        + ["--store", store]
        for m in models
    ]
    train = [
        ["train", "--scenario", s, "--store", store, "--runs", runs, "--seeds", str(seeds)]
        + (["--save-states", keep[s]] if s in keep else [])
        for s in scenarios
    ]
    return [*extract, *train, ["eval", "--report", str(out / "tables.md"), "--runs", runs]]


@app.command()
def demo(
    out: Path = typer.Option(Path("demo-out"), "--out", help="where the store, runs and tables.md go"),
    facts: int = typer.Option(400, "--facts", help="private-fact questions to generate (35% test)"),
    seeds: int = typer.Option(5, "--seeds", help="seeds per method"),
    scenarios: list[str] = typer.Option(list(SCENARIOS), "--scenario", help="scenario manifests to train"),
    models: list[str] = typer.Option(list(MODELS), "--model", help="models to extract"),
    states: list[str] = typer.Option(
        list(STATES), "--save-states", help="SCENARIO:METHODS whose runs keep their heads (state.pt)"
    ),
) -> None:
    """The offline demo of `make demo`: extract two embedded LLMs, train three scenarios, report."""
    start = time.monotonic()
    for argv in steps(out, facts, seeds, models, scenarios, states):
        code = run(root, argv, "walla")
        if code != 0:
            raise typer.Exit(code)
    typer.echo(f"walla demo: done in {int(time.monotonic() - start)} s -> {out / 'tables.md'}")
