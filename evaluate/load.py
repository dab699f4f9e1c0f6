"""Gather a scenario's saved runs for evaluation, through the one run-format reader (walla.train.runs._reader).

Nothing here recomputes a prediction or knows a file name: `walla.train.runs._reader` reads, this module only
decides which runs count and how they form rows. A run counts when it is complete, readable, carries a
run key (run.json `run_key`) and was trained from the scenario's CURRENT inputs by this schema of
walla train, and, for a joined run (--add-agent / --drop-agent), while the base run it continued is still
the current run of its key (train/runs/_lineage.py stale_run_reason, the check every reader of runs makes); every
other run becomes a `Problem` listed in the report and is never aggregated into a row.

Seeds are averaged only within one run key: a method trained under several keys (another lr, another
precision, ...) gives one row per key, each labelled by the fields that differ (`WALLA I (lr=0.001)`),
adjacent in the method's place; the key with the most seeds keeps the method's name as its row key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from walla.train.methods import REGISTRY
from walla.train.runs import (
    METHOD_GROUPS,
    SCENARIO_META,
    STATE,
    TRAIN_SCHEMA,
    VALIDITY,
    RunDir,
    RunFormatError,
    RunRecord,
    ScenarioTable,
    is_complete,
    key_dir,
    key_id,
    list_run_dirs,
    list_scenarios,
    read_key_file,
    read_run,
    read_scenario_table,
    retrain_command,
    stale_run_reason,
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
        seed = None if self.seed is None else f"seed={self.seed}"
        where = "/".join(x for x in (self.scenario, self.method, seed) if x)
        return f"{where}: {self.kind}: {self.detail}"


@dataclass
class ScenarioRuns:
    scenario: ScenarioTable
    runs: dict[str, dict[int, RunRecord]]  # row key (method, or method@key-id) -> seed -> run (paper order)
    problems: list[Problem]
    seeds: list[int]  # expected seeds (scenario.json)


def method_order(method: str, group: str) -> tuple[int, int, str]:
    """Paper order: group (individual, learning-free, learning-based, WALLA), then registry order."""
    g = METHOD_GROUPS.index(group) if group in METHOD_GROUPS else len(METHOD_GROUPS)
    names = list(REGISTRY)
    return g, names.index(method) if method in names else len(names), method


# ------------------------------------------------------------------------------------ which runs count


def _stale(name: str, d: RunDir, why: str, fix: str) -> Problem:
    return Problem("stale", name, d.method, d.seed, f"{d.path}: {why}; not counted: {fix}")


def _counted(d: RunDir, table: ScenarioTable, problems: list[Problem]) -> RunRecord | None:
    """The run of directory `d` if it counts; else None, with the reason appended to `problems`."""
    name = table.name
    kdir = d.path.parent if d.key_id is not None else None
    states = (d.path / STATE).exists()  # its rerun keeps the heads it has
    retrain = f"rerun {retrain_command(table.meta, name, kdir, d.method, d.seed, states)}"
    if d.key_id is None:
        why = "written by a walla train without run keys (layout <method>/seed=<s>)"
        problems.append(_stale(name, d, why, f"{retrain}, then delete this directory"))
        return None
    if not is_complete(d.path):
        problems.append(
            Problem("incomplete", name, d.method, d.seed, f"{d.path}: no run.json (interrupted?)")
        )
        return None
    try:
        run = read_run(d.path, table)
    except RunFormatError as e:
        problems.append(Problem("unreadable", name, d.method, d.seed, str(e)))
        return None
    key = run.run_key
    why = stale_run_reason(
        d.path, run.meta, table.meta.get("inputs_id")
    )  # the one rule (train/runs/_lineage.py)
    if why is not None:
        problems.append(_stale(name, d, why, retrain))
    elif key_id(key) != d.key_id or key.get("method") != d.method:
        why = f"its run key is not the one of directory {d.method}/{d.key_id} (moved or edited by hand)"
        problems.append(Problem("unreadable", name, d.method, d.seed, f"{d.path}: {why}; {retrain} --force"))
    else:
        return run
    return None


def _planned(runs_dir: Path, name: str, method: str, kid: str, current: str | None) -> list[int]:
    """Seeds planned for a run key (its key.json), if the key is of the current inputs and schema."""
    try:
        meta = read_key_file(key_dir(runs_dir, name, method, kid))
    except RunFormatError:
        return []
    key = meta.get("run_key") or {}
    if key.get("scenario_inputs_id") != current or key.get("schema") != TRAIN_SCHEMA:
        return []
    return [int(s) for s in meta.get("seeds", [])]


def _missing(runs_dir: Path, table: ScenarioTable, method: str, dirs: list[RunDir], seeds: list[int]):
    """Problems for planned runs with no directory: every expected seed of a method with no run key on
    disk, and every seed recorded in a key's key.json without its seed directory."""
    name, current = table.name, table.meta.get("inputs_id")
    kids = dict.fromkeys(d.key_id for d in dirs if d.key_id is not None)
    have = {(d.key_id, d.seed) for d in dirs}
    if not kids:
        legacy = {d.seed for d in dirs}
        return [Problem("missing", name, method, s, "no run directory") for s in seeds if s not in legacy]
    return [
        Problem("missing", name, method, s, f"{key_dir(runs_dir, name, method, kid)}: planned, no seed={s}")
        for kid in kids
        for s in _planned(runs_dir, name, method, kid, current)
        if (kid, s) not in have
    ]


# ------------------------------------------------------------------------------------ rows and labels

_ABSENT = object()


def _differing(keys: list[dict], prefix: str = "") -> list[str]:
    """Dotted paths at which the run keys' values differ (recursing where every key holds a mapping)."""
    out = []
    for field in dict.fromkeys(f for k in keys for f in k):
        values = [k.get(field, _ABSENT) for k in keys]
        if all(isinstance(v, dict) for v in values):
            out += _differing(values, f"{prefix}{field}.")
        elif any(v != values[0] for v in values):
            out.append(prefix + field)
    return out


def _value(key: dict, path: str) -> str:
    v: Any = key
    for part in path.split("."):
        v = v.get(part, _ABSENT) if isinstance(v, dict) else _ABSENT
    if v is _ABSENT:
        return "–"
    if isinstance(v, bool) or v is None:
        return json.dumps(v)
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, dict):
        return "on"
    return v if isinstance(v, str) else json.dumps(v)


def _name(path: str, key: dict) -> str:
    """'config.lr' -> 'lr' (a method's own keys by their name), unless that would read as a key field."""
    short = path.removeprefix("config.")
    return short if short == path or short.split(".")[0] not in key else path


def _label(display: str, key: dict, paths: list[str]) -> str:
    parts = ", ".join(f"{_name(p, key)}={_value(key, p)}" for p in paths)
    if display.endswith(")") and " (" in display:  # 'WALLA I (log pool)' -> 'WALLA I (log pool, lr=0.001)'
        return f"{display[:-1]}, {parts})"
    return f"{display} ({parts})"


def _rows(method: str, groups: dict[str, dict[int, RunRecord]]) -> list[tuple[str, dict[int, RunRecord]]]:
    """(row key, seed -> run) per run key of one method: the key with the most seeds (then the earliest
    written) first, under the method's name; with several keys, each row labelled by what differs."""
    ordered = sorted(
        groups.values(), key=lambda g: (-len(g), min(str(r.meta.get("written_at", "")) for r in g.values()))
    )
    if len(ordered) == 1:
        return [(method, ordered[0])]
    keys = [{k: v for k, v in next(iter(g.values())).run_key.items() if k not in VALIDITY} for g in ordered]
    paths = _differing(keys)
    out = []
    for i, (group, key) in enumerate(zip(ordered, keys, strict=True)):
        first = next(iter(group.values()))
        label = _label(str(first.meta.get("display_name", method)), key, paths)
        for run in group.values():
            run.label = label
        out.append((method if i == 0 else f"{method}@{first.path.parent.name}", dict(sorted(group.items()))))
    return out


def load_scenario_runs(runs_dir: Path, name: str) -> ScenarioRuns:
    """The scenario's test table and every counted run, one row per (method, run key); problems collected,
    not raised.

    Raises:
        RunFormatError: only when the scenario itself (scenario.parquet / scenario.json) cannot be read.
    """
    table = read_scenario_table(runs_dir, name)
    found = list_run_dirs(runs_dir, name)
    seeds = sorted({int(s) for s in table.meta.get("seeds", [])}) or sorted({d.seed for d in found})
    problems: list[Problem] = []
    rows: list[tuple[str, dict[int, RunRecord]]] = []
    for method in dict.fromkeys([*table.meta.get("methods", []), *(d.method for d in found)]):
        dirs = [d for d in found if d.method == method]
        problems += _missing(runs_dir, table, method, dirs, seeds)
        groups: dict[str, dict[int, RunRecord]] = {}
        for d in dirs:
            run = _counted(d, table, problems)
            if run is not None:
                groups.setdefault(str(d.key_id), {})[d.seed] = run
        if groups:
            rows += _rows(method, groups)
    order = {row: i for i, (row, _) in enumerate(rows)}  # within a method: _rows' order

    def paper(item: tuple[str, dict[int, RunRecord]]) -> tuple:
        run = next(iter(item[1].values()))
        return (*method_order(run.method, run.group), order[item[0]])

    return ScenarioRuns(table, dict(sorted(rows, key=paper)), problems, seeds)


def orphan_runs(runs_dir: Path) -> list[Problem]:
    """Directories under runs_dir holding run directories but no scenario.json (deleted or never written):
    their runs cannot be read, and a report that left them out without a word would look complete."""
    listed = set(list_scenarios(runs_dir))
    return [
        Problem(
            "unreadable",
            d.name,
            None,
            None,
            f"{d / SCENARIO_META}: missing, so its runs cannot be read; rerun the walla train command that built {d.name}",
        )
        for d in sorted(Path(runs_dir).iterdir())
        if d.is_dir() and d.name not in listed and list_run_dirs(runs_dir, d.name)
    ]
