"""The paper's tables of one evaluated scenario: main, hard subset, other metrics, compute, wagers.

    tables = scenario_tables(evaluate_scenario(data))   # -> [Table]; tables.py formats them

Rows are the agents, then the methods in group order, then the methods scored against their own
(calibrated) agents in a block of their own with a footnote (their agent-scored columns are neither bold
nor compared); each cell holds its seed interval, question interval and significance marks
(intervals/significance.py). MRR is not shown for methods whose weights are equal on every question (UniformAvg;
SPEC §10.10).
"""

from __future__ import annotations

import numpy as np
from walla.evaluate.aggregate import summarize
from walla.evaluate.compute import ScenarioCompute, compute_table
from walla.evaluate.diagnostics import diagnostics_table
from walla.evaluate.intervals.bootstrap import row_draws, row_resamples
from walla.evaluate.intervals.significance import annotate
from walla.evaluate.load import Run
from walla.evaluate.metrics import EXTRA_COLUMNS, MAIN_COLUMNS, METRICS, EvalArrays, mean_per_agent
from walla.evaluate.scenario_eval import ScenarioEval
from walla.evaluate.selective import selective_table
from walla.evaluate.tables import GROUP_TITLES, Cell, Column, Row, Table
from walla.evaluate.validation import row_validation
from walla.store.schema import VARIANT_CODE

NOTE_VALUES = (
    "Values ×100: mean ± 95% CI over seeds (t-interval), then [lo, hi] the 95% interval over test questions "
    "(below); bold = best aggregation method per column (individual agents excluded)."
)


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
    interval, question interval and significance marks (intervals/significance.py)."""
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
    """Whether the run's calibration had one head per context role (train/calibration/_temperature.py `_roles`: by_role
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
    tables += [wagers] if wagers else []
    return tables + [t for t in (selective_table(ev), diagnostics_table(ev)) if t is not None]
