"""`walla eval`, the command line of the `evaluate` stage. Thin: options -> EvalConfig -> report.run().

    walla eval [--report runs/tables.md] [--scenario NAME ...] [--runs runs] [--no-plots]

The options are EvalConfig's fields (evaluate/config.py), generated from them (cli/options.py); the options,
the runs directory and the scenario names are checked before the recipe (torch, scipy) is imported. Exit
codes: cli/exits.py (1 when a run or scenario file is unreadable; the report is still written without it).
"""

from __future__ import annotations

from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table as RichTable
from walla.cli import options
from walla.cli.exits import DATA, USAGE, answered, fail
from walla.evaluate.config import EvalConfig
from walla.manifests.names import trained_scenarios, unknown

app = options.app(help="walla evaluate stage")
HELP = "Metrics with 95% intervals, the paper's tables (.md/.tex/.csv) and plots, from saved runs."
CAPTION = (
    "† differs from UniformAvg, ‡ from the baseline best on validation (paired bootstrap over questions, "
    "5% family-wise per column; see the report)"
)


def _check_runs(cfg: EvalConfig) -> None:
    """The runs directory and the scenarios asked for, before the recipe loads."""
    if not cfg.runs.is_dir():
        what = "is a file, expected" if cfg.runs.exists() else "does not exist; expected"
        raise fail("eval", f"runs directory {cfg.runs} {what} the directory walla train wrote (--runs)", DATA)
    have = trained_scenarios(cfg.runs)
    for name in cfg.scenarios:
        if have and name not in have:
            where = f"trained under {cfg.runs}"
            listing = f"{where}: {', '.join(have)}"
            raise fail(
                "eval", unknown("scenario", name, {where: (have, "--scenario {name}")}, listing), USAGE
            )


def evaluate(given: dict[str, Any], extras: dict[str, Any]) -> None:
    cfg = options.build_config(EvalConfig, given, "eval")
    _check_runs(cfg)
    console = Console()
    with answered("eval"):
        from walla.evaluate import report as recipe  # torch and scipy, once the options hold: walla.cli.lazy

        result = recipe.run(cfg)
    for ev in result.scenarios:
        s = ev.data.scenario
        main = next(t for t in result.tables if t.scenario == s.name and t.key == "main")
        cols, rows = recipe.key_summary(main)
        title = f"{s.name} · {s.dataset} · N={len(s.label)} test · seeds {len(ev.seeds)} (×100)"
        t = RichTable(title=title, caption=CAPTION)
        t.add_column("method")
        for c in cols:
            t.add_column(f"{c.label} ± seeds", justify="right")
            t.add_column("95% questions", justify="left")
        for label, texts in rows:
            cells = []
            for x in texts:
                cells += [x.mean + ("" if x.ci is None else f" ± {x.ci}"), (x.boot or "") + x.marks]
            t.add_row(escape(label), *(escape(c) for c in cells))
        console.print(t)
    for path in result.files:
        console.print(f"wrote {path}", highlight=False, soft_wrap=True)
    unreadable = [p for p in result.problems if p.kind == "unreadable"]
    summary = recipe.problem_summary(result.problems)
    if unreadable:  # a broken file is an error (exit 1), after the report of everything else is written
        raise fail("eval", f"{unreadable[0].line()} ({summary}, listed in {cfg.report})", DATA)
    if result.problems:
        typer.echo(f"walla eval: warning: {summary} (listed in {cfg.report})", err=True)


options.config_command(app, EvalConfig, evaluate, name="eval", help=HELP)
