"""The evaluation recipe: saved runs -> metrics per seed -> mean ± 95% CI over seeds and over test questions
-> tables (.md/.tex/.csv) + PNGs.

    walla eval --report tables.md [--scenario NAME ...] [--runs runs] [--no-plots]

Reads top to bottom: find scenarios, load their runs (load.py), compute every metric of every run on the
test split and on the hard subset (scenario_eval.py, metrics.py), summarize over seeds (aggregate.py) and
over question resamples (intervals/bootstrap.py, significance.py), lay out the paper's tables (scenario_tables.py;
tables.py formats them), draw the plots (plots.py), write the files. Missing, interrupted or unreadable runs
are listed in a "Missing runs" section instead of stopping the report; runs trained from other inputs than
the scenario's current ones are listed under "Stale runs" and never counted (load.py). When scenario.json
records the agents' compute, a compute table and an accuracy-vs-compute plot are added (compute.py).

Choices (documented here because they change numbers):
* the hard subset is defined once per scenario from the agents' own (uncalibrated) probabilities, so every
  row of a hard-subset table is computed on the same questions;
* a method that pooled modified agent probabilities (calibrated WALLA writes them as agent_probs) is
  scored against those probabilities for MRR, Kendall tau and D-Regret (SPEC §9: calibrated logits feed
  every metric). Every other row is scored against the raw agents, so such rows sit in their own block
  with a footnote, and those columns are neither bold nor compared for them;
* MRR is not shown for methods whose weights are equal on every question (UniformAvg; SPEC §10.10).
"""

from __future__ import annotations

import csv
import io
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from threadpoolctl import threadpool_limits
from walla.evaluate import plots
from walla.evaluate.compute import ScenarioCompute
from walla.evaluate.config import EvalConfig
from walla.evaluate.intervals.bootstrap import N_RESAMPLES, RESAMPLE_SEED
from walla.evaluate.intervals.significance import MULTIPLICITY_RULE, REFERENCE_RULE
from walla.evaluate.load import Problem, list_scenarios, load_scenario_runs, orphan_runs
from walla.evaluate.scenario_eval import ScenarioEval, evaluate_scenario
from walla.evaluate.scenario_tables import scenario_tables
from walla.evaluate.selective import selective_curves
from walla.evaluate.tables import (
    CSV_FIELDS,
    CellText,
    Column,
    Table,
    cell_parts,
    to_csv_rows,
    to_latex,
    to_markdown,
)
from walla.store.atomic import write_file


@dataclass
class ReportResult:
    files: list[Path] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    scenarios: list[ScenarioEval] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)


def render_markdown(
    cfg: EvalConfig, evals: list[ScenarioEval], tables: list[Table], figures: dict, problems: list[Problem]
) -> str:
    names = ", ".join(ev.data.scenario.name for ev in evals) or "none"
    out = [
        "# walla evaluation report",
        "",
        f"Runs: `{cfg.runs}` · scenarios: {names} · metrics on the test split · intervals: 95% t-interval "
        f"over seeds and 95% percentile interval of a paired bootstrap over test questions ({N_RESAMPLES} "
        f"resamples, numpy default_rng({RESAMPLE_SEED})).",
        "",
        f"Marks: {MULTIPLICITY_RULE}. ‡ reference: {REFERENCE_RULE}.",
        "",
    ]
    stale = [p for p in problems if p.kind == "stale"]
    other = [p for p in problems if p.kind != "stale"]
    if problems:
        out += [f"> **Warning:** {problem_summary(problems)}; see *Missing runs* / *Stale runs*.", ""]
    for ev in evals:
        name = ev.data.scenario.name
        out += [f"## Scenario `{name}`", ""]
        for t in (t for t in tables if t.scenario == name):
            out += [to_markdown(t)]
        if isinstance(ev.compute, str):
            out += [f"*{ev.compute}*", ""]
        if figures.get(name):
            out += ["### Plots", ""]
            for path, caption in figures[name]:
                out += [f"![{caption}]({os.path.relpath(path, cfg.report.parent)})", f"*{caption}*", ""]
    if other:
        out += ["## Missing runs", ""] + [f"- {p.line()}" for p in other] + [""]
    if stale:
        why = "Trained from other inputs than the scenario's current ones; not counted in any table."
        out += ["## Stale runs", "", why, ""] + [f"- {p.line()}" for p in stale] + [""]
    return "\n".join(out).rstrip() + "\n"


@contextmanager
def _single_thread():
    """Scoring calls torch and BLAS (the bootstrap's [resamples x questions] products) on small arrays,
    where worker threads only add contention (up to 10x slower on a busy 2-core machine); restore the
    caller's settings afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with threadpool_limits(limits=1):
            yield
    finally:
        torch.set_num_threads(before)


def run(cfg: EvalConfig) -> ReportResult:
    """Evaluate every (selected) scenario under cfg.runs and write the report files.

    Raises:
        FileNotFoundError: the runs directory does not exist.
        ValueError: no scenario found, or a requested scenario is not there.
    """
    with _single_thread():
        return _run(cfg)


def _run(cfg: EvalConfig) -> ReportResult:
    available = list_scenarios(cfg.runs)
    if not available:
        orphans = "".join(f"; {p.line()}" for p in orphan_runs(cfg.runs))
        raise ValueError(f"no scenario under {cfg.runs} (expected <runs>/<scenario>/scenario.json){orphans}")
    unknown = [s for s in cfg.scenarios if s not in available]
    if unknown:
        raise ValueError(
            f"scenario(s) {', '.join(unknown)} not under {cfg.runs}; available: {', '.join(available)}"
        )
    result = ReportResult(problems=[] if cfg.scenarios else orphan_runs(cfg.runs))
    figures: dict[str, list[tuple[Path, str]]] = {}
    for name in cfg.scenarios or available:
        try:
            data = load_scenario_runs(cfg.runs, name)
        except (OSError, ValueError) as e:  # load.py turns every format error into a RunFormatError
            result.problems.append(Problem("unreadable", name, None, None, str(e)))
            continue
        ev = evaluate_scenario(data)
        result.problems += data.problems
        result.scenarios.append(ev)
        result.tables += scenario_tables(ev)
        if cfg.plots:
            prefix = cfg.report.parent / f"{cfg.report.stem}-{name}"
            compute = ev.compute if isinstance(ev.compute, ScenarioCompute) else None
            figures[name] = plots.scenario_plots(data, prefix, compute)
            curve = plots.selective_plot(selective_curves(ev), name, Path(f"{prefix}-selective.png"))
            if curve is not None:
                figures[name].append((curve, "Selective answers: accuracy vs coverage"))
            result.files += [p for p, _ in figures[name]]
    if not result.scenarios:
        raise ValueError(
            f"no readable scenario under {cfg.runs}: " + "; ".join(p.line() for p in result.problems)
        )

    md = render_markdown(cfg, result.scenarios, result.tables, figures, result.problems)
    tex = "% walla evaluation tables (booktabs); generated by walla eval\n\n" + "\n".join(
        to_latex(t) for t in result.tables
    )
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for t in result.tables:
        writer.writerows(to_csv_rows(t))
    written = [
        (cfg.report, md),
        (cfg.report.with_suffix(".tex"), tex),
        (cfg.report.with_suffix(".csv"), buf.getvalue()),
    ]
    for path, text in written:
        write_file(path, lambda p, text=text: p.write_text(text, encoding="utf-8"))
    result.files = [p for p, _ in written] + result.files
    return result


def key_summary(table: Table) -> tuple[list[Column], list[tuple[str, list[CellText]]]]:
    """The CLI's short summary of a main table: its ACC/DRegret (KLD/DRegret) columns and, per method row,
    the texts of those cells."""
    keys = ("kld", "d_regret") if any(c.key == "kld" for c in table.columns) else ("accuracy", "d_regret")
    cols = [c for c in table.columns if c.key in keys]
    rows = [(r.label, [cell_parts(r.cells.get(c.key), c) for c in cols]) for r in table.rows if r.method]
    return cols, rows


def problem_summary(problems: list[Problem]) -> str:
    """'2 missing, 1 stale run(s) not counted' (kinds in first-seen order)."""
    kinds = {k: sum(p.kind == k for p in problems) for k in dict.fromkeys(p.kind for p in problems)}
    return ", ".join(f"{n} {k}" for k, n in kinds.items()) + " run(s) not counted"
