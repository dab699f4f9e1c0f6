"""On-disk layout of training runs: the contract between `walla-train` and `walla-eval`.

    <runs>/<scenario>/scenario.parquet          one row per question: question_id, split, label,
                                                 target [K], option_mask [K], agent_probs [M*K] (flat,
                                                 agent-major), variant [M], plus scenario.json beside it
                                                 (agents, dataset, soft_target, K, M, fingerprints).
    <runs>/<scenario>/<method>/seed=<s>/
        predictions.parquet  question_id, split, weights [M], agg_probs [K],
                             wagers [M] | null, payouts [M] | null, advantage [M] | null,
                             pred_score [M] | null, pred_baseline [M] | null  (diagnostic heads),
                             agent_probs [M*K] | null (only when the method changes agent probs, e.g.
                             calibrated: the per-agent probs it actually pooled),
                             plus any method-specific extra list columns (e.g. "confidence" [M])
        train_log.parquet    per training batch: step, epoch, n_seen, metric columns (may be empty)
        run.json             resolved config, method, display_name, group (individual |
                             learning_free | learning_based | walla), seed, store fingerprints,
                             wall time. Written LAST: its presence marks the run complete.

Every file is written to a temp name in the same directory and os.replace'd into place.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from walla.store.atomic import write_atomic, write_json, write_parquet

SCENARIO_TABLE = "scenario.parquet"
SCENARIO_META = "scenario.json"
PREDICTIONS = "predictions.parquet"
TRAIN_LOG = "train_log.parquet"
RUN_META = "run.json"  # completion marker, written last

METHOD_GROUPS = ("individual", "learning_free", "learning_based", "walla")

SEED_DIR = re.compile(r"^seed=(-?\d+)$")
PRED_LISTS = ("wagers", "payouts", "advantage", "pred_score", "pred_baseline")  # optional [M] columns


def scenario_dir(runs: str | Path, scenario: str) -> Path:
    return Path(runs) / scenario


def run_dir(runs: str | Path, scenario: str, method: str, seed: int) -> Path:
    return Path(runs) / scenario / method / f"seed={int(seed)}"


def is_complete(path: str | Path) -> bool:
    """A run directory is complete iff its run.json (written last) exists."""
    return (Path(path) / RUN_META).exists()


def _list_col(name: str, arr: np.ndarray | None, n: int) -> pl.Series:
    """[n, W] array -> list<f32> column; None -> an all-null list<f32> column."""
    if arr is None:
        return pl.Series(name, [None] * n, dtype=pl.List(pl.Float32))
    arr = np.ascontiguousarray(np.asarray(arr, dtype=np.float32).reshape(n, -1))
    return pl.Series(name, arr).cast(pl.List(pl.Float32))


def _jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _jsonable(dataclasses.asdict(obj))
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    return obj


def write_scenario_table(
    runs: str | Path, data, methods: list[str] | tuple[str, ...] = (), seeds: list[int] | tuple[int, ...] = ()
) -> Path:
    """scenario.parquet + scenario.json of a ScenarioData under <runs>/<scenario>/ (atomic).

    The table is rewritten only when its content changes; `methods` and `seeds` are merged with those
    already recorded, so walla-eval knows every run it should expect.
    """
    d = scenario_dir(runs, data.name)
    d.mkdir(parents=True, exist_ok=True)
    n, m, k = data.probs.shape
    meta_path, table_path = d / SCENARIO_META, d / SCENARIO_TABLE
    old = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    meta = {
        "name": data.name,
        "dataset": data.dataset,
        "agents": list(data.agents),
        "soft_target": bool(data.soft_target),
        "K": int(k),
        "M": int(m),
        "N": int(n),
        "splits": {s: int((data.split == s).sum()) for s in ("train", "val", "test")},
        "fingerprints": dict(data.fingerprints),
        "methods": list(dict.fromkeys([*old.get("methods", []), *methods])),
        "seeds": sorted({*map(int, old.get("seeds", [])), *map(int, seeds)}),
        "meta": _jsonable({k2: v for k2, v in data.meta.items() if not isinstance(v, np.ndarray)}),
    }
    same_table = table_path.exists() and old.get("fingerprints") == meta["fingerprints"] and old.get("N") == n
    if not same_table:
        df = pl.DataFrame(
            [
                pl.Series("question_id", np.asarray(data.question_id).astype(str)),
                pl.Series("split", np.asarray(data.split).astype(str)),
                pl.Series("label", np.asarray(data.label, dtype=np.int64)),
                _list_col("target", data.target, n),
                pl.Series("option_mask", np.asarray(data.option_mask, dtype=bool)).cast(pl.List(pl.Boolean)),
                _list_col("agent_probs", np.asarray(data.probs).reshape(n, m * k), n),  # agent-major
                pl.Series("variant", np.asarray(data.variant, dtype=np.int8)).cast(pl.List(pl.Int8)),
            ]
        )
        write_parquet(table_path, df)
    if meta != old:
        write_json(meta_path, meta)
    return d


def read_scenario_table(runs: str | Path, scenario: str) -> tuple[pl.DataFrame, dict]:
    """(scenario.parquet, scenario.json) of one scenario. Raises FileNotFoundError naming the file."""
    d = scenario_dir(runs, scenario)
    for p in (d / SCENARIO_TABLE, d / SCENARIO_META):
        if not p.exists():
            raise FileNotFoundError(f"{p}: missing (walla-train writes it before any run of {scenario!r})")
    return pl.read_parquet(d / SCENARIO_TABLE), json.loads((d / SCENARIO_META).read_text())


def write_run(
    path: str | Path,
    question_id: np.ndarray,
    split: np.ndarray,
    output,
    train_log: list[dict] | pl.DataFrame | None,
    meta: dict,
) -> Path:
    """predictions.parquet, train_log.parquet, then run.json (the completion marker), each atomically.

    Args:
        path: the run directory (run_dir(...)); created if missing.
        question_id, split: [n] of the rows `output` covers (all rows of all splits).
        output: a MethodOutput (weights [n, M], agg_probs [n, K], extras).
        train_log: one dict per training batch (may be empty / None).
        meta: run.json content (resolved config, method, display_name, group, seed, fingerprints, ...).
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / RUN_META).unlink(missing_ok=True)  # a rewrite is incomplete until run.json is back
    n = len(question_id)
    weights, agg = np.asarray(output.weights), np.asarray(output.agg_probs)
    if weights.shape[0] != n or agg.shape[0] != n:
        raise ValueError(f"{path}: output covers {weights.shape[0]} rows, expected {n} (one per question)")
    if not (np.isfinite(weights).all() and np.isfinite(agg).all()):
        raise ValueError(f"{path}: non-finite weights or agg_probs (method {meta.get('method')!r})")
    extras = dict(output.extras or {})
    reserved = {"question_id", "split", "weights", "agg_probs"}
    clash = sorted(set(extras) & reserved)
    if clash:
        raise ValueError(f"{path}: MethodOutput extras may not be named {clash} (reserved columns)")
    other = sorted(set(extras) - set(PRED_LISTS) - {"agent_probs"})  # method-specific extras, kept as is
    cols = [
        pl.Series("question_id", np.asarray(question_id).astype(str)),
        pl.Series("split", np.asarray(split).astype(str)),
        _list_col("weights", weights, n),
        _list_col("agg_probs", agg, n),
        *(_list_col(name, extras.get(name), n) for name in PRED_LISTS),
        _list_col("agent_probs", extras.get("agent_probs"), n),
        *(_list_col(name, extras[name], n) for name in other),
    ]
    write_parquet(path / PREDICTIONS, pl.DataFrame(cols))
    if isinstance(train_log, pl.DataFrame):
        log_df = train_log
    elif train_log:
        log_df = pl.DataFrame(train_log, infer_schema_length=None)
    else:
        log_df = pl.DataFrame(schema={"step": pl.Int64, "epoch": pl.Int64, "n_seen": pl.Int64})
    write_parquet(path / TRAIN_LOG, log_df)
    full = {"written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **_jsonable(meta)}
    text = json.dumps(full, indent=2, sort_keys=True, allow_nan=True) + "\n"
    write_atomic(path / RUN_META, lambda p: p.write_text(text, encoding="utf-8"))  # LAST: marks complete
    return path


@dataclasses.dataclass
class RunRecord:
    """One complete run read back from disk."""

    path: Path
    meta: dict  # run.json
    predictions: pl.DataFrame  # question_id, split, weights, agg_probs, extras (list columns)
    train_log: pl.DataFrame

    def array(self, column: str, split: str | None = None) -> np.ndarray | None:
        """A list column as float32 [n, W] (rows of `split` only if given); None if all null."""
        df = self.predictions if split is None else self.predictions.filter(pl.col("split") == split)
        col = df[column]
        if col.null_count() == len(col):
            return None
        return np.asarray(col.to_list(), dtype=np.float32)


def read_run(path: str | Path) -> RunRecord:
    """Read a complete run directory. Raises FileNotFoundError if run.json or predictions are missing."""
    path = Path(path)
    if not is_complete(path):
        raise FileNotFoundError(f"{path}: no {RUN_META}; the run is incomplete (interrupted?) or absent")
    pred = path / PREDICTIONS
    if not pred.exists():
        raise FileNotFoundError(f"{pred}: missing although {RUN_META} exists")
    log = path / TRAIN_LOG
    return RunRecord(
        path=path,
        meta=json.loads((path / RUN_META).read_text()),
        predictions=pl.read_parquet(pred),
        train_log=pl.read_parquet(log) if log.exists() else pl.DataFrame(),
    )


@dataclasses.dataclass(frozen=True)
class RunRef:
    scenario: str
    method: str
    seed: int
    path: Path
    complete: bool


def list_runs(runs: str | Path, scenario: str | None = None, complete_only: bool = True) -> list[RunRef]:
    """Runs under <runs> (one scenario or all), sorted by scenario, method, seed."""
    root = Path(runs)
    if not root.is_dir():
        return []
    scenarios = [scenario] if scenario is not None else sorted(p.name for p in root.iterdir() if p.is_dir())
    out = []
    for sc in scenarios:
        sdir = root / sc
        if not sdir.is_dir():
            continue
        for mdir in sorted(p for p in sdir.iterdir() if p.is_dir()):
            for rdir in sorted(p for p in mdir.iterdir() if p.is_dir()):
                match = SEED_DIR.match(rdir.name)
                if match is None:
                    continue
                done = is_complete(rdir)
                if done or not complete_only:
                    out.append(RunRef(sc, mdir.name, int(match.group(1)), rdir, done))
    return sorted(out, key=lambda r: (r.scenario, r.method, r.seed))
