"""Gather a scenario's saved runs for evaluation, through the one run-format reader (walla.train.runs).

Nothing here recomputes a prediction or knows a file name: `walla.train.runs` reads, this module only
decides which runs count. A run counts when it is complete, readable, and was trained from the
scenario's CURRENT inputs (its run.json `scenario_inputs_id` equals scenario.json's `inputs_id`); every
other run becomes a `Problem` listed in the report and is never aggregated into a row.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from walla.train.methods import REGISTRY
from walla.train.runs import (
    METHOD_GROUPS,
    SCENARIO_META,
    RunFormatError,
    RunRecord,
    ScenarioTable,
    is_complete,
    list_run_dirs,
    list_scenarios,
    read_run,
    read_scenario_table,
)

Run = RunRecord  # evaluation reads RunRecords; the alias keeps plots/report signatures short
Scenario = ScenarioTable
__all__ = [
    "Problem",
    "Run",
    "Scenario",
    "ScenarioRuns",
    "list_scenarios",
    "load_scenario_runs",
    "orphan_runs",
]


@dataclass(frozen=True)
class Problem:
    kind: str  # "missing" | "incomplete" | "unreadable" | "stale"
    scenario: str
    method: str | None
    seed: int | None
    detail: str

    def line(self) -> str:
        where = "/".join(
            x for x in (self.scenario, self.method, None if self.seed is None else f"seed={self.seed}") if x
        )
        return f"{where}: {self.kind}: {self.detail}"


@dataclass
class ScenarioRuns:
    scenario: ScenarioTable
    runs: dict[str, dict[int, RunRecord]]  # method -> seed -> counted run (paper order)
    problems: list[Problem]
    seeds: list[int]  # expected seeds (scenario.json)


def method_order(method: str, group: str) -> tuple[int, int, str]:
    """Paper order: group (individual, learning-free, learning-based, WALLA), then registry order."""
    g = METHOD_GROUPS.index(group) if group in METHOD_GROUPS else len(METHOD_GROUPS)
    names = list(REGISTRY)
    return g, names.index(method) if method in names else len(names), method


def load_scenario_runs(runs_dir: Path, name: str) -> ScenarioRuns:
    """The scenario's test table and every counted run; problems collected, not raised.

    Raises:
        RunFormatError: only when the scenario itself (scenario.parquet / scenario.json) cannot be read.
    """
    table = read_scenario_table(runs_dir, name)
    current = table.meta.get("inputs_id")
    found = list_run_dirs(runs_dir, name)
    seeds = sorted({int(s) for s in table.meta.get("seeds", [])}) or sorted(
        {s for d in found.values() for s in d}
    )
    problems: list[Problem] = []
    runs: dict[str, dict[int, RunRecord]] = {}
    for method in dict.fromkeys([*table.meta.get("methods", []), *found]):
        for seed in sorted(set(seeds) | set(found.get(method, {}))):
            path = found.get(method, {}).get(seed)
            if path is None:
                problems.append(Problem("missing", name, method, seed, "no run directory"))
                continue
            if not is_complete(path):
                problems.append(
                    Problem("incomplete", name, method, seed, f"{path}: no run.json (interrupted?)")
                )
                continue
            try:
                run = read_run(path, table)
            except RunFormatError as e:
                problems.append(Problem("unreadable", name, method, seed, str(e)))
                continue
            if run.meta.get("scenario_inputs_id") != current:
                problems.append(
                    Problem(
                        "stale",
                        name,
                        method,
                        seed,
                        f"{path}: trained from other inputs than the scenario's current ones (other feature "
                        f"sets, questions or spec); not counted: rerun walla-train --scenario {name}",
                    )
                )
                continue
            runs.setdefault(method, {})[seed] = run
    ordered = sorted(runs, key=lambda mt: method_order(mt, next(iter(runs[mt].values())).group))
    return ScenarioRuns(table, {mt: runs[mt] for mt in ordered}, problems, seeds)


def orphan_runs(runs_dir: Path) -> list[Problem]:
    """Directories under runs_dir holding run directories but no scenario.json (deleted or never written):
    their runs cannot be read, and a report that left them out without a word would look complete."""
    listed = set(list_scenarios(runs_dir))
    return [
        Problem("unreadable", d.name, None, None,
                f"{d / SCENARIO_META}: missing, so its runs cannot be read; rerun walla-train --scenario {d.name}")
        for d in sorted(Path(runs_dir).iterdir())
        if d.is_dir() and d.name not in listed and list_run_dirs(runs_dir, d.name)
    ]  # fmt: skip
