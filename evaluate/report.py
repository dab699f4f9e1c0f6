"""The evaluation recipe: saved runs -> metrics per seed -> mean ± 95% CI over seeds and over test questions
-> tables (.md/.tex/.csv) + PNGs.

    walla eval --report tables.md [--scenario NAME ...] [--runs runs] [--no-plots]

Reads top to bottom: find scenarios, load their runs (load.py), compute every metric of every run on the
test split and on the hard subset (metrics.py), summarize over seeds (aggregate.py) and over question
resamples (bootstrap.py, significance.py), lay out the paper's tables (tables.py), draw the plots
(plots.py), write the files. Missing, interrupted or unreadable runs
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

import numpy as np
import torch
from threadpoolctl import threadpool_limits
from walla.evaluate import plots
from walla.evaluate.aggregate import summarize
from walla.evaluate.bootstrap import (
    N_RESAMPLES,
    RESAMPLE_SEED,
    calibrated_uniforms,
    counts_from_indices,
    resample_indices,
    row_draws,
    row_resamples,
)
from walla.evaluate.compute import ScenarioCompute, compute_table, scenario_compute
from walla.evaluate.config import EvalConfig
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
from walla.evaluate.output import write_file
from walla.evaluate.significance import MULTIPLICITY_RULE, REFERENCE_RULE, annotate
from walla.evaluate.tables import (
    CSV_FIELDS,
    GROUP_TITLES,
    Cell,
    CellText,
    Column,
    Row,
    Table,
    cell_parts,
    to_csv_rows,
    to_latex,
    to_markdown,
)
from walla.evaluate.validation import Validation, row_validation, validation_scores
from walla.store.schema import VARIANT_CODE

UNIFORM_ATOL = 1e-6  # |w - 1/M| below which weights count as equal
NOTE_VALUES = (
    "Values ×100: mean ± 95% CI over seeds (t-interval), then [lo, hi] the 95% interval over test questions "
    "(below); bold = best aggregation method per column (individual agents excluded)."
)


Views = dict[str, EvalArrays]  # subset -> the arrays one agent / one run is scored on


@dataclass
class ScenarioEval:
    """Metric values of one scenario: per method, per seed, per subset; and the arrays behind them, which
    the bootstrap over questions recomputes the metrics from."""

    data: ScenarioRuns
    hard_mask: np.ndarray  # [N] bool
    individual: list[dict[str, dict[str, float]]]  # agent slot -> subset -> metric -> value
    runs: dict[str, dict[int, dict[str, dict[str, float]]]]  # method -> seed -> subset -> metric -> value
    uniform: set[str]  # methods with equal weights on every question of every seed
    agent_views: list[Views] = field(default_factory=list)  # agent slot -> subset -> arrays
    run_views: dict[str, dict[int, Views]] = field(default_factory=dict)  # method -> seed -> subset -> arrays
    counts: dict[str, np.ndarray] = field(default_factory=dict)  # subset -> [n, B] question resample counts
    uniforms: dict[str, np.ndarray] = field(default_factory=dict)  # subset -> [n, B] calibrated label draws
    validation: Validation = field(default_factory=lambda: Validation({}))  # the ‡ reference's choice
    compute: ScenarioCompute | str | None = None  # compute.py; a sentence when not recorded

    @property
    def own_agents(self) -> list[str]:
        """Methods scored against agent probabilities of their own (calibrated WALLA), not the scenario's."""
        return [mt for mt in self.runs if any(r.agent_probs is not None for r in self.data.runs[mt].values())]

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


def _views(arrays: EvalArrays, mask: np.ndarray) -> Views:
    return {"all": arrays, "hard": arrays.subset(mask)}


def _scores(views: Views) -> dict[str, dict[str, float]]:
    return {subset: compute_metrics(arrays) for subset, arrays in views.items()}


def _resample_counts(n: int) -> np.ndarray:
    """[n, B] counts of the fixed question resamples of an n-question table (bootstrap.py)."""
    return counts_from_indices(resample_indices(n), n)


def evaluate_scenario(data: ScenarioRuns) -> ScenarioEval:
    """Every metric for every agent and every complete run; a run whose arrays fail validation is dropped
    and recorded as a problem."""
    s = data.scenario
    n, m, _ = s.probs.shape
    mask = hard_subset(s.probs, s.label)
    agent_brier = per_agent_brier(s.probs, s.target)  # [N, M], shared by every run that pooled s.probs
    ev = ScenarioEval(data, mask, [], {}, set())
    for i in range(m):
        onehot = np.zeros((n, m))
        onehot[:, i] = 1.0
        arrays = EvalArrays(s.probs[:, i], s.probs, onehot, s.label, s.target, agent_brier, agent_brier[:, i])
        ev.agent_views.append(_views(arrays, mask))
        ev.individual.append(_scores(ev.agent_views[-1]))
    for method, by_seed in data.runs.items():
        equal = True
        for seed, run in by_seed.items():
            try:
                views = _views(_arrays(run, data, agent_brier), mask)
                ev.runs.setdefault(method, {})[seed] = _scores(views)
            except ValueError as e:
                data.problems.append(Problem("unreadable", s.name, method, seed, str(e)))
                continue
            ev.run_views.setdefault(method, {})[seed] = views
            equal &= bool(np.all(np.abs(run.weights - 1.0 / m) < UNIFORM_ATOL))
        if method in ev.runs and equal:
            ev.uniform.add(method)
    ev.counts = {"all": _resample_counts(n), "hard": _resample_counts(int(mask.sum()))}
    ev.uniforms = {"all": calibrated_uniforms(n), "hard": calibrated_uniforms(int(mask.sum()))}
    ev.validation = validation_scores(data)
    data.problems += [Problem("unreadable", s.name, None, None, p) for p in ev.validation.problems]
    ev.compute = scenario_compute(data, ev.individual, ev.runs)
    return ev


# ----------------------------------------------------------------------------------------- tables


def _caption(ev: ScenarioEval, n: int) -> str:
    s = ev.data.scenario
    kind = "soft targets" if s.soft_target else "hard labels"
    agents = ", ".join(f"{i + 1} {a}" for i, a in enumerate(s.agents))
    seeds = ", ".join(str(x) for x in ev.seeds) or "none"
    used = ((s.meta or {}).get("meta") or {}).get("feature_sets") or {}
    tier = {u.get("fingerprint"): u.get("determinism") for u in used.values() if isinstance(u, dict)}
    fps = (
        ", ".join(
            f"{k} {v}" + (f" ({tier[v]})" if tier.get(v) else "") for k, v in sorted(s.fingerprints.items())
        )
        or "not recorded"
    )
    return (
        f"Scenario {s.name} · dataset {s.dataset} ({kind}) · agents: {agents} · N = {n} test questions · "
        f"seeds: {seeds} · store fingerprints: {fps}"
    )


def _agent_label(i: int, model: str) -> str:
    return f"Agent {i + 1}: {model}"


def _column(name: str) -> Column:
    info = METRICS[name]
    return Column(name, info.label, info.higher_is_better, info.scale, info.decimals)


def metric_table(ev: ScenarioEval, key: str, subset: str, names: list[str], title: str) -> Table:
    """Rows: agents, then methods in group order, then the methods scored against their own (calibrated)
    agents in a block of their own; columns: `names` (registered metrics), each cell with its seed
    interval, question interval and significance marks (significance.py)."""
    s = ev.data.scenario
    cols = [_column(n) for n in names]
    n_rows = int(ev.hard_mask.sum()) if subset == "hard" else len(s.label)
    counts = ev.counts[subset], ev.uniforms[subset]
    rows = []
    for i, model in enumerate(s.agents):
        vals, views = ev.individual[i][subset], [ev.agent_views[i][subset]]
        cells = {c: _cell(c, [vals[c]], views, *counts) for c in names}
        rows.append(Row(_agent_label(i, model), "individual", cells))
    own = ev.own_agents
    by_group: dict[bool, list[Row]] = {False: [], True: []}
    for method, by_seed in ev.runs.items():
        run = next(iter(ev.data.runs[method].values()))
        seeds = sorted(by_seed)
        views = [ev.run_views[method][seed][subset] for seed in seeds]
        cells = {}
        for c in names:
            cells[c] = _cell(c, [by_seed[seed][subset][c] for seed in seeds], views, *counts)
            if c == "mrr" and method in ev.uniform and cells[c].note is None:
                cells[c].note = "uniform"
            cells[c].comparable = not (method in own and METRICS[c].scored_on_agents)
        group = "calibrated" if method in own else run.group
        validation = row_validation(ev.validation, method, subset)
        by_group[method in own].append(Row(run.display, group, cells, run.method, validation))
    notes = [_scale_note(cols)] + ([own_agents_note(ev, own, cols)] if own else [])
    table = Table(
        key, s.name, title, _caption(ev, n_rows), cols, rows + by_group[False] + by_group[True], notes=notes
    )
    questions = (
        f"the {n_rows} questions of the hard subset" if subset == "hard" else f"the {n_rows} test questions"
    )
    annotate(table, questions, ev.validation.questions.get(subset), n=n_rows)
    return table


def own_agents_note(ev: ScenarioEval, methods: list[str], cols: list[Column]) -> str:
    """The footnote of the block of rows scored against their own (calibrated) agent probabilities."""
    runs = [next(iter(ev.data.runs[mt].values())) for mt in methods]
    calibrated = [r for r in runs if _config(r).get("calibrated")]
    what = (
        "agent probabilities recalibrated by per-agent temperature heads fit on train + val only"
        if len(calibrated) == len(runs)
        else "agent probabilities of their own"
    )
    on_agents = [c.label for c in cols if METRICS[c.key].scored_on_agents]
    if on_agents:
        scored = (
            f"{'its' if len(runs) == 1 else 'their'} {', '.join(on_agents)} are measured against those agents, "
            "every other row's against the raw "
            "agents, so these cells are neither bold nor compared (no marks); the other columns depend on the "
            "aggregate only and are compared as usual"
        )
    else:
        scored = "every column of this table depends on the aggregate only, so they are compared as usual"
    roles = [r.display for r in calibrated if _heads_by_role(ev, r)]
    whose = "" if len(roles) == len(runs) else f" (in {', '.join(roles)})"
    by_role = (
        f" Each agent's temperature head{whose} is chosen by whether that agent held the relevant private "
        "context on the question: the agent's own knowledge at test time, as in the paper."
        if roles
        else ""
    )
    names = ", ".join(r.display for r in runs)
    return f"{GROUP_TITLES['calibrated']}: {names} pool{'s' if len(runs) == 1 else ''} {what}; {scored}.{by_role}"


def _config(run: Run) -> dict:
    config = run.meta.get("config")
    return config if isinstance(config, dict) else {}


def _heads_by_role(ev: ScenarioEval, run: Run) -> bool:
    """Whether the run's calibration had one head per context role (train/calibration.py `_roles`: by_role
    yes, or auto when the scenario routes the relevant context to some agents)."""
    by_role = (_config(run).get("calibration") or {}).get("by_role", "auto")
    routed = bool((ev.data.scenario.variant == VARIANT_CODE["relevant"]).any())
    return by_role == "yes" or (by_role == "auto" and routed)


def _scale_note(cols: list[Column]) -> str:
    if all(c.scale == 100.0 for c in cols):
        return NOTE_VALUES
    scales = " ".join(
        f"{', '.join(c.label for c in cols if c.scale == f)} ×{f:g};"
        for f in dict.fromkeys(c.scale for c in cols)
    )
    return (
        f"Values: {scales} mean ± 95% CI over seeds (t-interval), then [lo, hi] the 95% interval over test "
        "questions (below); bold = best aggregation method per column."
    )


def _cell(
    name: str, values: list[float], views: list[EvalArrays], counts: np.ndarray, uniforms: np.ndarray
) -> Cell:
    """Seed summary of `values` and, on a non-empty subset, the seed mean on every question resample
    (and, for a calibration error, on every calibrated label draw)."""
    if counts.shape[0] == 0:
        return Cell(summarize(values), note="empty")
    info = METRICS[name]
    return Cell(
        summarize(values),
        resamples=row_resamples(info, views, counts),
        draws=row_draws(info, views, uniforms),
    )


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
    caption = _caption(ev, len(s.label))
    return Table("wagers", s.name, title, caption, cols, rows, bold=False, group_rows=False, notes=[note])


def scenario_tables(ev: ScenarioEval) -> list[Table]:
    s = ev.data.scenario
    main = MAIN_COLUMNS["soft" if s.soft_target else "hard"]
    extra = [c for c in EXTRA_COLUMNS if c != "class_auc" or s.target.shape[1] == 2]  # class AUC: binary only
    hard = f"{s.name}: hard subset (questions every agent answers correctly removed)"
    tables = [
        metric_table(ev, "main", "all", main, f"{s.name}: all test questions"),
        metric_table(ev, "hard", "hard", main, hard),
        metric_table(ev, "other", "all", extra, f"{s.name}: other metrics (all test questions)"),
    ]
    wagers = wager_table(ev)
    if isinstance(ev.compute, ScenarioCompute):
        tables.append(compute_table(ev.compute, s.name, _caption(ev, len(s.label))))
    return tables + ([wagers] if wagers else [])


# ----------------------------------------------------------------------------------------- writing


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
