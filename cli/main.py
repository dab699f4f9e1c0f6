"""`walla`: one root command over every stage, in the spirit of torchtune's `tune` (one module per command).

    walla extract --model smollm2-135m --dataset facts     walla.extract.cli (stage 1)
    walla store ls | verify | rm                           walla.store.cli
    walla train --scenario demo-hetero-facts               walla.train.cli (stage 2)
    walla eval --report tables.md                          walla.evaluate.cli (stage 3)
    walla check --model M --dataset D                      walla.extract.parity_cli (backend parity)
    walla market init | serve | add-agent | agent | replay walla.market.cli (the live market)
    walla serve --runs runs --scenario demo-hetero-facts   walla.serve.cli (a trained pool, live)
    walla demo                                             walla.cli.demo (what `make demo` runs)
    walla study                                            walla.cli.study (what `make study` runs)
    walla ls models | datasets | scenarios | backends | methods   walla.cli.ls (the names walla accepts)

Each subcommand's module is imported when it runs (cli/lazy.py), so `walla --help` and `walla SUB --help`
answer without importing torch. The older names `walla-extract`, `walla-store`, `walla-train`,
`walla-eval` and `walla-market` are the same commands (the aliases below). Every error is one line on
stderr, `walla <sub>: error: ...`, with the exit codes of cli/exits.py (one table for every subcommand:
2 usage, 1 data or state, 3 a service that does not answer). `walla --install-completion` sets up shell
completion (typer's).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from importlib.metadata import version

import typer
from walla.cli.finish import finish
from walla.cli.lazy import Lazy, lazy_group, load, run

COMMANDS = {  # the one list of walla's subcommands: name -> where it lives, its one-line help
    "extract": Lazy(
        "walla.extract.cli:app",
        "Extract option log-probs, last-token hidden states and prompt NLL for every prompt variant.",
    ),
    "store": Lazy("walla.store.cli:app", "List, verify and remove feature sets and question tables."),
    "train": Lazy(
        "walla.train.cli:app",
        "Fit every method x seed of a scenario; write runs/<scenario>/<method>/<key-id>/seed=<s>/.",
    ),
    "eval": Lazy(
        "walla.evaluate.cli:app",
        "Metrics with 95% intervals, the paper's tables (.md/.tex/.csv) and plots, from saved runs.",
    ),
    "check": Lazy(
        "walla.extract.parity_cli:app",
        "Parity of option probabilities, hidden states and prompt NLL across backends (exit 1 beyond "
        "tolerance).",
    ),
    "market": Lazy(
        "walla.market.cli:market_app",
        "A live wagering market: its ledger, HTTP server, live agents and replays.",
    ),
    "serve": Lazy(
        "walla.serve.cli:app",
        "Serve a trained pool: new questions answered live, calibrated and wager-weighted, OpenAI-compatible.",
    ),
    "demo": Lazy(
        "walla.cli.demo:app",
        "The offline demo of `make demo`: extract two embedded LLMs, train three scenarios, report.",
    ),
    "study": Lazy(
        "walla.cli.study:app",
        "Four embedded LLM families on real ARC, MMLU, MedMCQA and PubMedQA: extract, train, report.",
    ),
    "ls": Lazy(
        "walla.cli.ls:app", "List the names walla accepts: models, datasets, scenarios, backends or methods."
    ),
}


def _version(value: bool) -> None:
    if value:
        typer.echo(f"walla {version('walla')}")
        raise typer.Exit()


app = typer.Typer(
    cls=lazy_group(COMMANDS),
    no_args_is_help=True,
    rich_markup_mode=None,  # help as written: no rich markup eats `[ray]`, no `<bool>` after a flag
    context_settings={"max_content_width": 110},
)


@app.callback()
def _root(
    show_version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_version, help="Print walla's version and exit."
    ),
) -> None:
    """walla: aggregate LLM predictions with wagering mechanisms (extract -> store -> train -> eval)."""


def _subcommand(argv: Sequence[str]) -> str | None:
    return next((a for a in argv if not a.startswith("-")), None)


def main() -> None:
    """`walla ...`"""
    finish(run(app, sys.argv[1:], "walla"), _subcommand(sys.argv[1:]))


def _alias(name: str) -> Callable[[], None]:
    """`walla-<name> ...` is `walla <name> ...` (the console scripts of earlier versions)."""

    def alias() -> None:
        finish(run(load(COMMANDS[name]), sys.argv[1:], f"walla {name}"), name)

    alias.__doc__ = f"`walla-{name} ...`: `walla {name} ...`"
    return alias


walla_extract = _alias("extract")
walla_store = _alias("store")
walla_train = _alias("train")
walla_eval = _alias("eval")
walla_market = _alias("market")
