"""The ONE writer of the run format (walla train): scenario table, key file, run (layout: train/runs/_layout.py).

Every file is written atomically; run.json last, so a run directory without it is incomplete.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import polars as pl
from walla.store.atomic import write_atomic, write_json, write_parquet
from walla.train.runs._identity import data_inputs_id, jsonable, key_id
from walla.train.runs._layout import (
    EXTRAS,
    KEY_FILE,
    PREDICTIONS,
    RUN_META,
    SCENARIO_META,
    SCENARIO_TABLE,
    RunFormatError,
    key_dir,
    scenario_dir,
)
from walla.train.runs._reader import read_json


def _list_col(name: str, arr: np.ndarray | None, n: int) -> pl.Series:
    """[n, W] array -> list<f32> column; None -> an all-null list<f32> column."""
    if arr is None:
        return pl.Series(name, [None] * n, dtype=pl.List(pl.Float32))
    arr = np.ascontiguousarray(np.asarray(arr, dtype=np.float32).reshape(n, -1))
    return pl.Series(name, arr).cast(pl.List(pl.Float32))


def write_scenario_table(
    runs: str | Path, data, spec: dict, methods=(), seeds=(), command: str | None = None
) -> dict:
    """scenario.parquet + scenario.json under <runs>/<scenario>/ (atomic); returns scenario.json.

    The table is rewritten only when the scenario's inputs change; `methods` and `seeds` are merged with
    those already recorded (for the same inputs), so walla eval knows every run it should expect.
    `command`: the `walla train` command that builds this scenario (train/join.py train_command; None keeps
    the recorded one), named by every message that says how to retrain its runs (train_command here).
    """
    d = scenario_dir(runs, data.name)
    d.mkdir(parents=True, exist_ok=True)
    n, m, k = data.probs.shape
    ident = data_inputs_id(data, spec)
    try:  # a missing or unreadable scenario.json is simply rewritten (its runs then count as stale)
        old = read_json(d / SCENARIO_META)
    except RunFormatError:
        old = {}
    same = old.get("inputs_id") == ident and (d / SCENARIO_TABLE).exists()
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
        "inputs_id": ident,
        "spec": jsonable(spec),
        "methods": list(dict.fromkeys([*(old.get("methods", []) if same else []), *methods])),
        "seeds": sorted({*map(int, old.get("seeds", []) if same else []), *map(int, seeds)}),
        "meta": jsonable({k2: v for k2, v in data.meta.items() if not isinstance(v, np.ndarray)}),
    }
    if command or old.get("command"):
        meta["command"] = command or old["command"]
    if not same:
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
        write_parquet(d / SCENARIO_TABLE, df)
    if meta != old:
        write_json(d / SCENARIO_META, meta)
    return meta


def write_run(path: Path, question_id, split, output, meta: dict) -> Path:
    """predictions.parquet, then run.json (the completion marker), each atomically (logs/ came first).

    Args:
        path: the run directory (run_dir(...)); created if missing.
        question_id, split: [n] of the rows `output` covers (all rows of all splits).
        output: a MethodOutput (weights [n, M], agg_probs [n, K], extras).
        meta: run.json content (see the module docstring).
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
    clash = sorted(set(extras) & {"question_id", "split", "weights", "agg_probs"})
    if clash:
        raise ValueError(f"{path}: MethodOutput extras may not be named {clash} (reserved columns)")
    other = sorted(set(extras) - set(EXTRAS) - {"agent_probs"})  # method-specific extras, kept as is
    cols = [
        pl.Series("question_id", np.asarray(question_id).astype(str)),
        pl.Series("split", np.asarray(split).astype(str)),
        _list_col("weights", weights, n),
        _list_col("agg_probs", agg, n),
        *(_list_col(name, extras.get(name), n) for name in EXTRAS),
        _list_col("agent_probs", extras.get("agent_probs"), n),
        *(_list_col(name, extras[name], n) for name in other),
    ]
    write_parquet(path / PREDICTIONS, pl.DataFrame(cols))
    stamped = {"written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **jsonable(meta)}
    text = json.dumps(stamped, indent=2, sort_keys=True, allow_nan=True) + "\n"
    write_atomic(path / RUN_META, lambda p: p.write_text(text, encoding="utf-8"))  # LAST: marks complete
    return path


def write_key_file(runs: str | Path, scenario: str, key: dict, seeds, command: str | None = None) -> Path:
    """<method>/<key-id>/key.json: the run key and every seed planned for it (merged with those already
    recorded for the same key), so walla eval can name a planned run that never started; `command`: the
    `walla train` command that trains this key (its settings included; None keeps the recorded one), what
    a message about its runs says to rerun (train_command)."""
    d = key_dir(runs, scenario, key["method"], key_id(key))
    d.mkdir(parents=True, exist_ok=True)
    try:
        old = read_json(d / KEY_FILE)
    except RunFormatError:
        old = {}
    kept = old.get("seeds", []) if old.get("run_key") == jsonable(key) else []
    meta = {"run_key": jsonable(key), "seeds": sorted({*map(int, kept), *map(int, seeds)})}
    if command or old.get("command"):
        meta["command"] = command or old["command"]
    if meta != old:
        write_json(d / KEY_FILE, meta)
    return d / KEY_FILE
