"""Read saved runs (layout of `walla.train.runs`) into arrays aligned on the scenario's TEST questions.

Nothing here recomputes a prediction: evaluation only reads what `walla-train` wrote. Every problem a
user can cause (a missing seed, a run without run.json, a predictions file that does not cover the test
questions) becomes a `Problem` on the scenario instead of an exception, so one bad run never hides the
others from the report.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from walla.train.methods import REGISTRY
from walla.train.runs import METHOD_GROUPS, PREDICTIONS, RUN_META, SCENARIO_META, SCENARIO_TABLE, TRAIN_LOG

EXTRAS = ("wagers", "payouts", "advantage", "pred_score", "pred_baseline")  # optional [M] columns
SEED_DIR = re.compile(r"^seed=(-?\d+)$")


@dataclass(frozen=True)
class Problem:
    kind: str  # "missing" | "incomplete" | "unreadable" | "mismatch"
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
class Scenario:
    """scenario.parquet restricted to the test split (N rows), plus scenario.json."""

    name: str
    path: Path
    meta: dict
    agents: list[str]  # model per slot, len M
    dataset: str
    soft_target: bool
    question_id: np.ndarray  # [N] str
    label: np.ndarray  # [N] int64
    target: np.ndarray  # [N, K] float64
    option_mask: np.ndarray  # [N, K] bool
    probs: np.ndarray  # [N, M, K] float64, the agents' own (uncalibrated) probabilities
    variant: np.ndarray | None  # [N, M] int8 codes of schema.VARIANTS, None if not recorded
    n_rows: int  # rows of all splits

    @property
    def fingerprints(self) -> dict[str, str]:
        return dict(self.meta.get("fingerprints") or {})


@dataclass
class Run:
    """One (method, seed) run, test rows in the scenario's order."""

    method: str
    seed: int
    path: Path
    meta: dict  # run.json
    display: str
    group: str
    weights: np.ndarray  # [N, M]
    agg_probs: np.ndarray  # [N, K]
    agent_probs: np.ndarray | None  # [N, M, K] only for methods that changed the agents' probs
    extras: dict[str, np.ndarray] = field(default_factory=dict)  # name -> [N, M] (non-null columns only)
    train_log: pl.DataFrame | None = None


@dataclass
class ScenarioRuns:
    scenario: Scenario
    runs: dict[str, dict[int, Run]]  # method -> seed -> complete, readable run (display order)
    problems: list[Problem]
    seeds: list[int]  # expected seeds (scenario.json, else every seed seen on disk)


# ----------------------------------------------------------------------------------------- arrow helpers


def _column(table: pa.Table, name: str, where: str) -> pa.ChunkedArray:
    if name not in table.column_names:
        raise KeyError(f"{where}: missing column {name!r} (have {', '.join(table.column_names)})")
    return table.column(name)


def list_matrix(table: pa.Table, name: str, width: int | None, where: str) -> np.ndarray | None:
    """A list<float> column as a float64 [n, width] array; None if every row is null.

    Rows that are null while others are not become NaN rows (e.g. wagers only on some splits).
    """
    col = _column(table, name, where)
    n = len(col)
    if col.null_count == n:
        return None
    arr = col.combine_chunks()
    if pa.types.is_fixed_size_list(arr.type):
        arr = arr.cast(pa.list_(arr.type.value_type))
    lengths = pc.list_value_length(arr).to_numpy(zero_copy_only=False)  # [n], NaN/None for null rows
    valid = ~pc.is_null(arr).to_numpy(zero_copy_only=False)
    widths = np.unique(lengths[valid].astype(np.int64))
    if len(widths) != 1 or (width is not None and widths[0] != width):
        expected = f"{width}" if width is not None else "one common length"
        raise ValueError(f"{where}: column {name!r} has list lengths {widths.tolist()}, expected {expected}")
    w = int(widths[0])
    out = np.full((n, w), np.nan)
    values = arr.flatten().to_numpy(zero_copy_only=False).astype(np.float64)  # skips null rows
    out[valid] = values.reshape(-1, w)
    return out


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None


# ----------------------------------------------------------------------------------------- scenario


def list_scenarios(runs_dir: Path) -> list[str]:
    """Names of sub-directories that look like scenarios (hold scenario.parquet or a method dir)."""
    if not runs_dir.is_dir():
        raise FileNotFoundError(
            f"runs directory {runs_dir} does not exist (run walla-train first, or pass --runs)"
        )
    return sorted(
        p.name
        for p in runs_dir.iterdir()
        if p.is_dir() and ((p / SCENARIO_TABLE).exists() or any(q.is_dir() for q in p.iterdir()))
    )


def read_scenario(path: Path) -> Scenario:
    """scenario.parquet + scenario.json of one scenario directory, test rows only."""
    table_path, meta_path = path / SCENARIO_TABLE, path / SCENARIO_META
    for p in (table_path, meta_path):
        if not p.exists():
            raise FileNotFoundError(f"{p}: missing (written by walla-train before any run)")
    meta = _read_json(meta_path)
    for key in ("agents", "dataset"):
        if key not in meta:
            raise KeyError(f"{meta_path}: missing key {key!r}")
    agents = list(meta["agents"])
    m = len(agents)
    table = pq.read_table(table_path)
    n_rows = table.num_rows
    where = str(table_path)
    table = table.filter(pc.equal(_column(table, "split", where), "test"))
    if table.num_rows == 0:
        raise ValueError(f"{table_path}: no row with split == 'test' ({n_rows} rows in total)")
    target = list_matrix(table, "target", meta.get("K"), where)
    k = target.shape[1]
    flat = list_matrix(table, "agent_probs", m * k, where)
    mask = list_matrix(table, "option_mask", k, where)
    variant = list_matrix(table, "variant", m, where) if "variant" in table.column_names else None
    qid = np.asarray(_column(table, "question_id", where).to_pylist(), dtype=object)
    if len(set(qid)) != len(qid):
        raise ValueError(f"{table_path}: duplicate question_id among test rows")
    return Scenario(
        name=path.name,
        path=path,
        meta=meta,
        agents=agents,
        dataset=str(meta["dataset"]),
        soft_target=bool(meta.get("soft_target", False)),
        question_id=qid,
        label=np.asarray(_column(table, "label", where).to_numpy(), dtype=np.int64),
        target=target,
        option_mask=np.ones_like(target, dtype=bool) if mask is None else mask.astype(bool),
        probs=flat.reshape(-1, m, k),  # agent-major flat [M*K] -> [N, M, K]
        variant=None if variant is None else variant.astype(np.int8),
        n_rows=n_rows,
    )


# ----------------------------------------------------------------------------------------- runs


def method_info(method: str, meta: dict) -> tuple[str, str]:
    """(display name, group) from run.json, falling back to the method registry."""
    info = REGISTRY.get(method)
    display = meta.get("display_name") or (info.display if info else method)
    group = meta.get("group") or (info.group if info else "learning_based")
    return str(display), str(group)


def method_order(method: str, group: str) -> tuple[int, int, str]:
    """Paper order: group (individual, learning-free, learning-based, WALLA), then registry order."""
    g = METHOD_GROUPS.index(group) if group in METHOD_GROUPS else len(METHOD_GROUPS)
    names = list(REGISTRY)
    return g, names.index(method) if method in names else len(names), method


def _align(qid: np.ndarray, wanted: np.ndarray, where: str) -> np.ndarray:
    """Row of `qid` holding each question of `wanted`; every one must be there exactly once."""
    pos = {q: i for i, q in enumerate(qid)}
    if len(pos) != len(qid):
        raise ValueError(f"{where}: duplicate question_id among test rows")
    missing = [q for q in wanted if q not in pos]
    if missing or len(qid) != len(wanted):
        raise ValueError(
            f"{where}: test rows do not match {SCENARIO_TABLE} ({len(qid)} rows, "
            f"{len(missing)} of {len(wanted)} scenario test questions missing, e.g. {missing[:3]})"
        )
    return np.fromiter((pos[q] for q in wanted), dtype=np.int64, count=len(qid))


def read_run(path: Path, scenario: Scenario, method: str, seed: int) -> Run:
    """One complete run directory, aligned on the scenario's test questions."""
    meta = _read_json(path / RUN_META)
    pred_path = path / PREDICTIONS
    if not pred_path.exists():
        raise FileNotFoundError(f"{pred_path}: missing although run.json exists")
    where = str(pred_path)
    table = pq.read_table(pred_path)
    table = table.filter(pc.equal(_column(table, "split", where), "test"))
    qid = np.asarray(_column(table, "question_id", where).to_pylist(), dtype=object)
    if not np.array_equal(qid, scenario.question_id):  # fast path: the writer kept the scenario's order
        table = table.take(pa.array(_align(qid, scenario.question_id, where)))
    m, k = len(scenario.agents), scenario.target.shape[1]
    weights = list_matrix(table, "weights", m, where)
    agg = list_matrix(table, "agg_probs", k, where)
    if weights is None or agg is None:
        raise ValueError(f"{where}: 'weights' and 'agg_probs' must not be null")
    for name, arr in (("weights", weights), ("agg_probs", agg)):
        if not np.isfinite(arr).all():
            raise ValueError(f"{where}: non-finite values in {name!r} on test rows")
    extras = {}
    for name in EXTRAS:
        if name in table.column_names:
            arr = list_matrix(table, name, m, where)
            if arr is not None:
                extras[name] = arr
    agent_probs = None
    if "agent_probs" in table.column_names:
        flat = list_matrix(table, "agent_probs", m * k, where)
        agent_probs = None if flat is None else flat.reshape(-1, m, k)
    log_path = path / TRAIN_LOG
    train_log = pl.read_parquet(log_path) if log_path.exists() else None
    display, group = method_info(method, meta)
    return Run(method, seed, path, meta, display, group, weights, agg, agent_probs, extras, train_log)


def _expected(meta: dict, key: str) -> list | None:
    for d in (meta, meta.get("manifest") or {}, meta.get("scenario") or {}, meta.get("config") or {}):
        if isinstance(d, dict) and isinstance(d.get(key), list):
            return list(d[key])
    return None


def load_scenario_runs(runs_dir: Path, name: str) -> ScenarioRuns:
    """The scenario and every run under runs_dir/name; problems collected, not raised.

    Raises only when the scenario itself (scenario.parquet / scenario.json) cannot be read.
    """
    scenario = read_scenario(runs_dir / name)
    problems: list[Problem] = []
    found: dict[str, dict[int, Path]] = {}
    for mdir in sorted(p for p in (runs_dir / name).iterdir() if p.is_dir()):
        for sdir in sorted(p for p in mdir.iterdir() if p.is_dir()):
            match = SEED_DIR.match(sdir.name)
            if match is None:
                problems.append(
                    Problem("unreadable", name, mdir.name, None, f"{sdir}: not a seed=<int> directory")
                )
                continue
            found.setdefault(mdir.name, {})[int(match.group(1))] = sdir

    seeds = _expected(scenario.meta, "seeds")
    seeds = sorted({int(s) for s in seeds}) if seeds else sorted({s for d in found.values() for s in d})
    methods = _expected(scenario.meta, "methods") or []
    scen_fp = scenario.fingerprints

    runs: dict[str, dict[int, Run]] = {}
    for method in list(dict.fromkeys([*methods, *found])):
        for seed in sorted(set(seeds) | set(found.get(method, {}))):
            sdir = found.get(method, {}).get(seed)
            if sdir is None:
                problems.append(Problem("missing", name, method, seed, "no run directory"))
                continue
            if not (sdir / RUN_META).exists():
                problems.append(
                    Problem("incomplete", name, method, seed, f"{sdir}: no {RUN_META} (interrupted?)")
                )
                continue
            try:
                run = read_run(sdir, scenario, method, seed)
            except (OSError, KeyError, ValueError, pa.ArrowException) as e:
                problems.append(Problem("unreadable", name, method, seed, str(e).strip("'\"")))
                continue
            run_fp = run.meta.get("fingerprints") or run.meta.get("store_fingerprints")
            if scen_fp and run_fp and dict(run_fp) != scen_fp:
                problems.append(
                    Problem("mismatch", name, method, seed, "store fingerprints differ from scenario.json")
                )
            runs.setdefault(method, {})[seed] = run
    ordered = sorted(runs, key=lambda mt: method_order(mt, next(iter(runs[mt].values())).group))
    return ScenarioRuns(scenario, {mt: runs[mt] for mt in ordered}, problems, seeds)
