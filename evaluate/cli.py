"""Command line of the `evaluate` stage (typer). Thin: parse, validate, call report.run().

walla-eval --report tables.md [--scenario NAME ...] [--runs runs] [--no-plots]
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table as RichTable
from walla.evaluate.report import EvalConfig, key_summary, problem_summary, run

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
    scenario: list[str] = typer.Option([], "--scenario", help="scenario name under --runs (repeatable)"),
    runs: Path = typer.Option(Path("runs"), "--runs", help="runs directory written by walla-train"),
    no_plots: bool = typer.Option(False, "--no-plots", help="tables only"),
) -> None:
    """Metrics with 95% intervals over seeds and over test questions (paired bootstrap, with significance
    marks), the paper's tables (.md/.tex/.csv) and plots, from saved runs.

    Exit 1 when a run or scenario file is unreadable (the report is still written without it).
    """
    console = Console()
    if report.suffix.lower() != ".md":
        raise _fail(f"--report {report}: expected a .md path (.tex/.csv are written beside it)", 2)
    cfg = EvalConfig(report=report, runs=runs, scenarios=tuple(scenario), plots=not no_plots)
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


def main() -> None:
    app(prog_name="walla-eval")
