"""The ONE reader of the run format (walla eval, the market, joining): scenario tables, runs, key files.

A missing, unreadable or wrong file is one RunFormatError naming it and the fix (layout: train/runs/_layout.py).
Whether a run read here still counts is train/runs/_lineage.py.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from walla.manifests.catalog import collect_tables
from walla.manifests.scenario import Scenario, ScenarioSpec
from walla.manifests.validate import ConfigError, build
from walla.store.scenario import assemble_scenario
from walla.train.runs._layout import (
    EXTRAS,
    KEY_FILE,
    PREDICTIONS,
    RUN_META,
    SCENARIO_META,
    SCENARIO_TABLE,
    SEED_DIR,
    TRAIN_LOG,
    RunFormatError,
    scenario_dir,
)


def _read(path: Path, parse, what: str, fix: str):
    """parse(path), with a missing or unreadable file as one RunFormatError naming it and the fix."""
    try:
        return parse(path)
    except FileNotFoundError:
        raise RunFormatError(f"{path}: missing") from None
    except (
        ValueError,
        UnicodeDecodeError,
        OSError,
        pa.ArrowException,
    ) as e:  # JSONDecodeError is a ValueError
        raise RunFormatError(f"{path}: not {what} ({e}); {fix}") from None


def read_json(path: Path) -> dict:
    fix = (
        "rerun walla train (it rewrites the file)"
        if path.name == SCENARIO_META
        else "rerun walla train --force"
    )
    out = _read(path, lambda p: json.loads(p.read_text(encoding="utf-8")), "valid JSON", fix)
    if not isinstance(out, dict):
        raise RunFormatError(f"{path}: expected a JSON object")
    return out


def _read_table(path: Path) -> pa.Table:
    return _read(path, pq.read_table, "a readable Parquet file", "rerun walla train with --force")


def list_matrix(table: pa.Table, name: str, width: int | None, where: str) -> np.ndarray | None:
    """A list<float> column as float64 [n, width]; None if all null (null rows -> NaN)."""
    if name not in table.column_names:
        raise RunFormatError(f"{where}: missing column {name!r} (have {', '.join(table.column_names)})")
    col = table.column(name)
    n = len(col)
    if col.null_count == n:
        return None
    arr = col.combine_chunks()
    lengths = pc.list_value_length(arr).to_numpy(zero_copy_only=False)
    valid = ~pc.is_null(arr).to_numpy(zero_copy_only=False)
    widths = np.unique(lengths[valid].astype(np.int64))
    if len(widths) != 1 or (width is not None and widths[0] != width):
        raise RunFormatError(f"{where}: column {name!r} has list lengths {widths.tolist()}, expected {width}")
    out = np.full((n, int(widths[0])), np.nan)
    out[valid] = arr.flatten().to_numpy(zero_copy_only=False).astype(np.float64).reshape(-1, int(widths[0]))
    return out


@dataclasses.dataclass
class ScenarioTable:
    """scenario.parquet + scenario.json read back, restricted to one split (test by default)."""

    name: str
    path: Path
    meta: dict  # scenario.json
    agents: list[str]  # model per slot, len M
    question_id: np.ndarray  # [N] str
    label: np.ndarray  # [N] int64
    target: np.ndarray  # [N, K] float64
    option_mask: np.ndarray  # [N, K] bool
    probs: np.ndarray  # [N, M, K] float64, the agents' own (uncalibrated) probabilities
    variant: np.ndarray  # [N, M] int8 codes of store.schema.VARIANTS

    @property
    def soft_target(self) -> bool:
        return bool(self.meta.get("soft_target", False))

    @property
    def dataset(self) -> str:
        return str(self.meta.get("dataset", "?"))

    @property
    def fingerprints(self) -> dict[str, str]:
        return dict(self.meta.get("fingerprints") or {})


# what a well-formed but wrong file raises inside the readers: a missing key or column, a column of another
# type (written by another version, or by hand); reported as RunFormatError naming the file
_BAD_CONTENT = (KeyError, TypeError, IndexError, pa.ArrowException)


def _content_error(path: Path, e: BaseException, fix: str) -> RunFormatError:
    text = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e).split("\n")[0]
    if isinstance(e, KeyError) and " " not in text:  # pyarrow's KeyError is a sentence already
        text = f"missing key {text!r}"
    return RunFormatError(f"{path}: {text}; not written by this walla train: {fix}")


def read_scenario_table(runs: str | Path, scenario: str, split: str = "test") -> ScenarioTable:
    """scenario.parquet + scenario.json, one split. Raises RunFormatError naming a missing or bad file."""
    try:
        return _scenario_table(runs, scenario, split)
    except _BAD_CONTENT as e:
        where = scenario_dir(runs, scenario) / SCENARIO_TABLE
        raise _content_error(where, e, f"rerun walla train --scenario {scenario}") from None


def _scenario_table(runs: str | Path, scenario: str, split: str) -> ScenarioTable:
    d = scenario_dir(runs, scenario)
    meta = read_json(d / SCENARIO_META)
    where = str(d / SCENARIO_TABLE)
    table = _read_table(d / SCENARIO_TABLE)
    table = table.filter(pc.equal(table.column("split"), split))
    if table.num_rows == 0:
        raise RunFormatError(f"{where}: no row with split == {split!r}")
    m = len(meta["agents"])
    target = list_matrix(table, "target", meta.get("K"), where)
    k = target.shape[1]
    return ScenarioTable(
        name=scenario,
        path=d,
        meta=meta,
        agents=list(meta["agents"]),
        question_id=np.asarray(table.column("question_id").to_pylist(), dtype=object),
        label=table.column("label").to_numpy().astype(np.int64),
        target=target,
        option_mask=list_matrix(table, "option_mask", k, where).astype(bool),
        probs=list_matrix(table, "agent_probs", m * k, where).reshape(-1, m, k),
        variant=list_matrix(table, "variant", m, where).astype(np.int8),
    )


@dataclasses.dataclass
class RunRecord:
    """One complete run read back, its rows aligned on a ScenarioTable's questions."""

    method: str
    seed: int
    path: Path
    meta: dict  # run.json
    weights: np.ndarray  # [N, M]
    agg_probs: np.ndarray  # [N, K]
    agent_probs: np.ndarray | None  # [N, M, K] for methods that changed the agents' probs
    extras: dict[str, np.ndarray]  # name -> [N, M] (non-null columns only)
    train_log: pl.DataFrame
    label: str | None = None  # row label set by walla eval when the method has runs of several keys

    @property
    def display(self) -> str:
        return self.label or str(self.meta.get("display_name", self.method))

    @property
    def run_key(self) -> dict | None:
        key = self.meta.get("run_key")
        return key if isinstance(key, dict) else None

    @property
    def group(self) -> str:
        return str(self.meta.get("group", "learning_based"))


def read_run_meta(path: Path) -> dict:
    return read_json(Path(path) / RUN_META)


def read_run(path: Path, table: ScenarioTable) -> RunRecord:
    """One complete run directory, its rows aligned on `table`'s questions (every one exactly once)."""
    try:
        return _read_run(Path(path), table)
    except _BAD_CONTENT as e:
        raise _content_error(Path(path) / PREDICTIONS, e, "rerun walla train with --force") from None


def _read_run(path: Path, table: ScenarioTable) -> RunRecord:
    meta = read_run_meta(path)
    where = str(path / PREDICTIONS)
    pred = _read_table(path / PREDICTIONS)
    qid = np.asarray(pred.column("question_id").to_pylist(), dtype=object)
    pos = {q: i for i, q in enumerate(qid)}
    missing = [q for q in table.question_id if q not in pos]
    if missing or len(pos) != len(qid):
        raise RunFormatError(f"{where}: {len(missing)} of the scenario's questions missing or duplicated")
    pred = pred.take(pa.array([pos[q] for q in table.question_id], type=pa.int64()))
    m, k = len(table.agents), table.target.shape[1]
    weights, agg = list_matrix(pred, "weights", m, where), list_matrix(pred, "agg_probs", k, where)
    if weights is None or agg is None or not (np.isfinite(weights).all() and np.isfinite(agg).all()):
        raise RunFormatError(f"{where}: 'weights' / 'agg_probs' null or non-finite")
    extras = {
        e: a for e in EXTRAS if e in pred.column_names and (a := list_matrix(pred, e, m, where)) is not None
    }
    flat = list_matrix(pred, "agent_probs", m * k, where) if "agent_probs" in pred.column_names else None
    log = (
        pl.read_csv(path / TRAIN_LOG, infer_schema_length=None)
        if (path / TRAIN_LOG).exists()
        else pl.DataFrame()
    )
    match = SEED_DIR.match(path.name)
    seed = int(meta.get("seed", match.group(1) if match else -1))
    method = str(meta.get("method", path.parent.parent.name))
    probs = None if flat is None else flat.reshape(-1, m, k)
    return RunRecord(method, seed, path, meta, weights, agg, probs, extras, log)


def read_scenario_meta(path: str | Path) -> dict:
    """A scenario directory's scenario.json (RunFormatError naming it when missing or unreadable)."""
    return read_json(Path(path) / SCENARIO_META)


def read_key_file(path: str | Path) -> dict:
    """A key directory's key.json (see write_key_file)."""
    return read_json(Path(path) / KEY_FILE)


def scenario_data(table, store: Path):
    """The scenario's ScenarioData from `store`, assembled from the resolved spec its scenario.json recorded
    (`table`: read_scenario_table's): the features a run was trained on, as walla train assembled them (the
    market's replay and walla serve read a run's questions this way)."""
    problems: list[str] = []
    models, datasets = collect_tables(None, problems)
    if problems:
        raise ConfigError(problems)
    spec = build(ScenarioSpec, table.meta["spec"], where=f"{table.path}/scenario.json: spec")
    return assemble_scenario(Scenario(spec, models, datasets), store)
