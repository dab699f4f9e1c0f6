"""The evaluation recipe: saved runs -> metrics per seed -> mean ± 95% CI -> tables (.md/.tex/.csv) + PNGs.

    walla-eval --report tables.md [--scenario NAME ...] [--runs runs] [--no-plots]

Reads top to bottom: find scenarios, load their runs (load.py), compute every metric of every run on the
test split and on the hard subset (metrics.py), summarize over seeds (aggregate.py), lay out the paper's
tables (tables.py), draw the plots (plots.py), write the files. Missing, interrupted or unreadable runs
are listed in a "Missing runs" section instead of stopping the report; runs trained from other inputs than
the scenario's current ones are listed under "Stale runs" and never counted (load.py). When scenario.json
records the agents' compute, a compute table and an accuracy-vs-compute plot are added (compute.py).

Choices (documented here because they change numbers):
* the hard subset is defined once per scenario from the agents' own (uncalibrated) probabilities, so every
  row of a hard-subset table is computed on the same questions;
* a method that pooled modified agent probabilities (calibrated WALLA writes them as agent_probs) is
  scored against those probabilities for MRR, Kendall tau and D-Regret (SPEC §9: calibrated logits feed
  every metric);
* MRR is not shown for methods whose weights are equal on every question (UniformAvg; SPEC §10.10).
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from walla.evaluate.aggregate import Summary, summarize
from walla.evaluate.compute import ScenarioCompute, compute_table, scenario_compute
from walla.evaluate.load import Problem, Run, ScenarioRuns, list_scenarios, load_scenario_runs, orphan_runs
from walla.evaluate.metrics import (
    EXTRA_COLUMNS,
    MAIN_COLUMNS,
    METRICS,
    EvalArrays,
    compute_metrics,
    hard_subset,
    mean_per_agent,
    per_agent_brier,
)
from walla.evaluate.tables import CSV_FIELDS, Cell, Column, Row, Table, to_csv_rows, to_latex, to_markdown
from walla.manifests.validate import config
from walla.store.atomic import write_atomic

UNIFORM_ATOL = 1e-6  # |w - 1/M| below which weights count as equal
NOTE_VALUES = "Values ×100: mean ± 95% CI over seeds (t-interval); bold = best aggregation method per column (individual agents excluded)."  # noqa: E501


@config  # the one config validator of every stage (walla.manifests.validate)
class EvalConfig:
    report: Path  # the Markdown report; .tex, .csv and PNGs are written next to it
    runs: Path = Path("runs")
    scenarios: tuple[str, ...] = ()  # empty: every scenario under runs
    plots: bool = True


@dataclass
class ScenarioEval:
    """Metric values of one scenario: per method, per seed, per subset."""

    data: ScenarioRuns
    hard_mask: np.ndarray  # [N] bool
    individual: list[dict[str, dict[str, float]]]  # agent slot -> subset -> metric -> value
    runs: dict[str, dict[int, dict[str, dict[str, float]]]]  # method -> seed -> subset -> metric -> value
    uniform: set[str]  # methods with equal weights on every question of every seed
    compute: ScenarioCompute | str | None = None  # compute.py; a sentence when not recorded

    @property
    def seeds(self) -> list[int]:
        return sorted({s for by_seed in self.runs.values() for s in by_seed})


@dataclass
class ReportResult:
    files: list[Path] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    scenarios: list[ScenarioEval] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)


# ----------------------------------------------------------------------------------------- metrics


def _arrays(run: Run, data: ScenarioRuns, agent_brier: np.ndarray) -> EvalArrays:
    s = data.scenario
    if run.agent_probs is not None:  # the method pooled its own (e.g. calibrated) agent probabilities
        return EvalArrays(run.agg_probs, run.agent_probs, run.weights, s.label, s.target)
    return EvalArrays(run.agg_probs, s.probs, run.weights, s.label, s.target, agent_brier)


def _both(arrays: EvalArrays, mask: np.ndarray) -> dict[str, dict[str, float]]:
    return {"all": compute_metrics(arrays), "hard": compute_metrics(arrays.subset(mask))}


def evaluate_scenario(data: ScenarioRuns) -> ScenarioEval:
    """Every metric for every agent and every complete run; a run whose arrays fail validation is dropped
    and recorded as a problem."""
    s = data.scenario
    n, m, _ = s.probs.shape
    mask = hard_subset(s.probs, s.label)
    agent_brier = per_agent_brier(s.probs, s.target)  # [N, M], shared by every run that pooled s.probs
    individual = []
    for i in range(m):
        onehot = np.zeros((n, m))
        onehot[:, i] = 1.0
        arrays = EvalArrays(s.probs[:, i], s.probs, onehot, s.label, s.target, agent_brier, agent_brier[:, i])
        individual.append(_both(arrays, mask))
    runs: dict[str, dict[int, dict]] = {}
    uniform = set()
    for method, by_seed in data.runs.items():
        equal = True
        for seed, run in by_seed.items():
            try:
                runs.setdefault(method, {})[seed] = _both(_arrays(run, data, agent_brier), mask)
            except ValueError as e:
                data.problems.append(Problem("unreadable", s.name, method, seed, str(e)))
                continue
            equal &= bool(np.all(np.abs(run.weights - 1.0 / m) < UNIFORM_ATOL))
        if method in runs and equal:
            uniform.add(method)
    ev = ScenarioEval(data, mask, individual, runs, uniform)
    ev.compute = scenario_compute(ev)
    return ev


# ----------------------------------------------------------------------------------------- tables


def _caption(ev: ScenarioEval, n: int) -> str:
    s = ev.data.scenario
    kind = "soft targets" if s.soft_target else "hard labels"
    agents = ", ".join(f"{i + 1} {a}" for i, a in enumerate(s.agents))
    seeds = ", ".join(str(x) for x in ev.seeds) or "none"
    fps = ", ".join(f"{k} {v}" for k, v in sorted(s.fingerprints.items())) or "not recorded"
    return (
        f"Scenario {s.name} · dataset {s.dataset} ({kind}) · agents: {agents} · N = {n} test questions · "
        f"seeds: {seeds} · store fingerprints: {fps}"
    )


def _agent_label(i: int, model: str) -> str:
    return f"Agent {i + 1}: {model}"


def metric_table(ev: ScenarioEval, key: str, subset: str, names: list[str], title: str) -> Table:
    """Rows: agents, then methods in group order; columns: `names` (registered metrics)."""
    s = ev.data.scenario
    cols = [Column(n, METRICS[n].label, METRICS[n].higher_is_better, METRICS[n].scale, METRICS[n].decimals)
            for n in names]  # fmt: skip
    n_rows = int(ev.hard_mask.sum()) if subset == "hard" else len(s.label)
    rows = []
    for i, model in enumerate(s.agents):
        vals = ev.individual[i][subset]
        rows.append(Row(_agent_label(i, model), "individual", {c: _cell([vals[c]], n_rows) for c in names}))
    for method, by_seed in ev.runs.items():
        run = next(iter(ev.data.runs[method].values()))
        cells = {}
        for c in names:
            cells[c] = _cell([by_seed[seed][subset][c] for seed in sorted(by_seed)], n_rows)
            if c == "mrr" and method in ev.uniform and cells[c].note is None:
                cells[c].note = "uniform"
        rows.append(Row(run.display, run.group, cells))
    return Table(key, s.name, title, _caption(ev, n_rows), cols, rows, notes=[_scale_note(cols)])


def _scale_note(cols: list[Column]) -> str:
    if all(c.scale == 100.0 for c in cols):
        return NOTE_VALUES
    scales = " ".join(
        f"{', '.join(c.label for c in cols if c.scale == f)} ×{f:g};"
        for f in dict.fromkeys(c.scale for c in cols)
    )
    return (
        f"Values: {scales} mean ± 95% CI over seeds (t-interval); bold = best aggregation method per column."
    )


def _cell(values: list[float], n_rows: int) -> Cell:
    if n_rows == 0:
        return Cell(summarize(values), note="empty")
    return Cell(summarize(values))


def wager_table(ev: ScenarioEval) -> Table | None:
    """The paper's calibration table: per WALLA method, mean wager and mean net payout of each agent."""
    s = ev.data.scenario
    cols: list[Column] = []
    per: dict[str, list[np.ndarray]] = {}  # column key -> per-seed [M] means over test questions
    for method, by_seed in ev.data.runs.items():
        seeds = [r for seed, r in sorted(by_seed.items()) if seed in ev.runs.get(method, {})]
        if not seeds or seeds[0].group != "walla" or "wagers" not in seeds[0].extras:
            continue
        for extra, label in (("wagers", "Wager"), ("payouts", "Net payout")):
            if all(extra in r.extras for r in seeds):
                key = f"{method}:{extra}"
                cols.append(Column(key, label, None, 100.0, 2, span=seeds[0].display))
                per[key] = [mean_per_agent(r.extras[extra]) for r in seeds]
    if not cols:
        return None
    rows = []
    for i, model in enumerate(s.agents):
        cells = {key: Cell(summarize([v[i] for v in vals])) for key, vals in per.items()}
        rows.append(Row(_agent_label(i, model), "individual", cells))
    title = f"{s.name}: mean wager and net payout per agent"
    note = "Values ×100: mean over test questions, then mean ± 95% CI over seeds."
    return Table("wagers", s.name, title, _caption(ev, len(s.label)), cols, rows, bold=False,
                 group_rows=False, notes=[note])  # fmt: skip


def scenario_tables(ev: ScenarioEval) -> list[Table]:
    s = ev.data.scenario
    main = MAIN_COLUMNS["soft" if s.soft_target else "hard"]
    extra = [c for c in EXTRA_COLUMNS if c != "class_auc" or s.target.shape[1] == 2]  # class AUC: binary only
    tables = [
        metric_table(ev, "main", "all", main, f"{s.name}: all test questions"),
        metric_table(ev, "hard", "hard", main,
                     f"{s.name}: hard subset (questions every agent answers correctly removed)"),
        metric_table(ev, "other", "all", extra, f"{s.name}: other metrics (all test questions)"),
    ]  # fmt: skip
    wagers = wager_table(ev)
    if isinstance(ev.compute, ScenarioCompute):
        tables.append(compute_table(ev.compute, s.name, _caption(ev, len(s.label))))
    return tables + ([wagers] if wagers else [])


# ----------------------------------------------------------------------------------------- writing


def write_file(path: Path, write: Callable[[Path], None]) -> Path:
    """Atomically write one output file (walla.store.atomic); an OSError becomes one line naming `path`."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return write_atomic(path, write)
    except OSError as e:
        raise ValueError(f"cannot write {path}: {e.strerror or e}") from None


def render_markdown(cfg: EvalConfig, evals: list[ScenarioEval], tables: list[Table], figures: dict,
                    problems: list[Problem]) -> str:  # fmt: skip
    names = ", ".join(ev.data.scenario.name for ev in evals) or "none"
    out = [
        "# walla evaluation report",
        "",
        f"Runs: `{cfg.runs}` · scenarios: {names} · metrics on the test split.",
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
        out += ["## Stale runs", "", "Trained from other inputs than the scenario's current ones; not counted "
                "in any table.", ""] + [f"- {p.line()}" for p in stale] + [""]  # fmt: skip
    return "\n".join(out).rstrip() + "\n"


@contextmanager
def _torch_single_thread():
    """Scoring calls torch on small arrays, where intra-op threads only add contention (10x slower on a
    busy 2-core machine); restore the caller's setting afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run(cfg: EvalConfig) -> ReportResult:
    """Evaluate every (selected) scenario under cfg.runs and write the report files.

    Raises:
        FileNotFoundError: the runs directory does not exist.
        ValueError: no scenario found, or a requested scenario is not there.
    """
    with _torch_single_thread():
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
            from walla.evaluate import plots  # matplotlib only when drawing

            prefix = cfg.report.parent / f"{cfg.report.stem}-{name}"
            compute = ev.compute if isinstance(ev.compute, ScenarioCompute) else None
            figures[name] = plots.scenario_plots(data, prefix, compute)
            result.files += [p for p, _ in figures[name]]
    if not result.scenarios:
        raise ValueError(
            f"no readable scenario under {cfg.runs}: " + "; ".join(p.line() for p in result.problems)
        )

    md = render_markdown(cfg, result.scenarios, result.tables, figures, result.problems)
    tex = "% walla evaluation tables (booktabs); generated by walla-eval\n\n" + "\n".join(
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


def key_summary(ev: ScenarioEval) -> list[tuple[str, dict[str, Summary]]]:
    """(row label, metric -> summary) for the CLI's short summary: ACC/DRegret or KLD/DRegret."""
    keys = ["kld", "d_regret"] if ev.data.scenario.soft_target else ["accuracy", "d_regret"]
    out = []
    for method, by_seed in ev.runs.items():
        display = next(iter(ev.data.runs[method].values())).display
        out.append((display, {k: summarize([v["all"][k] for v in by_seed.values()]) for k in keys}))
    return out


def problem_summary(problems: list[Problem]) -> str:
    """'2 missing, 1 stale run(s) not counted' (kinds in first-seen order)."""
    kinds = {k: sum(p.kind == k for p in problems) for k in dict.fromkeys(p.kind for p in problems)}
    return ", ".join(f"{n} {k}" for k, n in kinds.items()) + " run(s) not counted"
