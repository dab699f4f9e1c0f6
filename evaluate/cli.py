"""`walla eval`, the command line of the `evaluate` stage (typer). Thin: options -> EvalConfig -> report.run().

walla eval --report tables.md [--scenario NAME ...] [--runs runs] [--no-plots]

The options are EvalConfig's fields (evaluate/config.py), by the same names. `walla-eval` is the same command.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table as RichTable

app = typer.Typer(add_completion=False, no_args_is_help=True, help="walla evaluate stage")
CAPTION = (
    "† differs from UniformAvg, ‡ from the baseline best on validation (paired bootstrap over questions, "
    "5% family-wise per column; see the report)"
)


def _fail(message: str, code: int) -> typer.Exit:
    """One line on stderr (newlines inside a library's message folded), then exit `code`."""
    typer.echo("error: " + " ".join(str(message).split()), err=True)
    return typer.Exit(code)


@app.command()
def main_command(
    report: Path = typer.Option(
        ..., "--report", help="Markdown report to write; .tex/.csv/PNGs go next to it"
    ),
    scenarios: list[str] = typer.Option([], "--scenario", help="scenario name under --runs (repeatable)"),
    runs: Path = typer.Option(Path("runs"), "--runs", help="runs directory written by walla train"),
    plots: bool = typer.Option(True, "--plots/--no-plots", help="--no-plots: tables only"),
) -> None:
    """Metrics with 95% intervals, the paper's tables (.md/.tex/.csv) and plots, from saved runs.

    Intervals over seeds and over test questions (paired bootstrap, with significance marks). Exit 1 when a
    run or scenario file is unreadable (the report is still written without it).
    """
    options = dict(locals())  # every option above, named as EvalConfig's fields
    # the config and the recipe (torch, scipy) are imported when the command runs: walla.cli.lazy
    from walla.evaluate.config import EvalConfig
    from walla.evaluate.report import key_summary, problem_summary, run
    from walla.manifests.validate import build

    console = Console()
    try:
        cfg = build(EvalConfig, options, where="command line")
    except ValueError as e:
        raise _fail(e, 2) from None
    try:
        result = run(cfg)
    except (OSError, ValueError) as e:
        raise _fail(e, 1) from None
    for ev in result.scenarios:
        s = ev.data.scenario
        main = next(t for t in result.tables if t.scenario == s.name and t.key == "main")
        cols, rows = key_summary(main)
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
    if unreadable:  # a broken file is an error (exit 1), after the report of everything else is written
        raise _fail(f"{unreadable[0].line()} ({problem_summary(result.problems)}, listed in {report})", 1)
    if result.problems:
        typer.echo(f"warning: {problem_summary(result.problems)} (listed in {report})", err=True)
