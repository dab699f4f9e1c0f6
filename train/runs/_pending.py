"""Which runs of a run key are still to train, and what else lies beside them (train/run.py's step 4).

    todo, kept, notes = pending_runs(runs, data, "walla-i", kid, plan.seeds, ids, force=False)
    notes += keys_beside(runs, data.name, "walla-i", kid)

A run is kept only when it is complete (run.json, a readable predictions.parquet) and was trained from
the same inputs (its inputs id); the others are trained again, each with a note saying why.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from walla.store.scenario import ScenarioData
from walla.train.runs._layout import PREDICTIONS, RUN_META, STATE, RunFormatError, list_run_dirs, run_dir
from walla.train.runs._reader import read_run_meta


def pending_runs(
    runs: Path,
    data: ScenarioData,
    name: str,
    kid: str,
    seeds: Iterable[int],
    ids: dict[int, str],
    force: bool,
    need_state: bool = False,
) -> tuple[list[int], dict[int, dict], list[str]]:
    """(seeds to train, {seed: run.json} of the runs kept, notes): missing, incomplete or stale runs (inputs
    or schema changed) of run key `kid` are trained again, or all with force; with `need_state`, so are the
    complete runs without a state.pt."""
    todo, kept, notes = [], {}, []
    for s in seeds:
        path = run_dir(runs, data.name, name, kid, s)
        if force or not (path / RUN_META).exists():
            todo.append(s)
            continue
        try:
            meta = read_run_meta(path)
            pq.read_metadata(path / PREDICTIONS)  # a truncated or corrupt predictions file: redo the run
        except (RunFormatError, OSError, pa.ArrowException) as e:
            meta = {}
            notes.append(f"{name} seed {s}: {str(e).splitlines()[0]}; retraining")
        if meta.get("inputs_id") == ids[s] and need_state and not (path / STATE).exists():
            todo.append(s)
            notes.append(f"{name} seed {s}: trained without its state; retraining to write {STATE}")
            continue
        if meta.get("inputs_id") == ids[s]:
            kept[s] = meta
            continue
        todo.append(s)
        if meta:
            notes.append(f"{name} seed {s}: trained from other inputs or by another walla train; retraining")
    return todo, kept, notes


def keys_beside(runs: Path, scenario: str, method: str, kid: str) -> list[str]:
    """Notes on the other run directories of a method: other run keys are kept beside this one (their own
    rows in walla eval), runs of the layout before run keys are never counted."""
    found = [d for d in list_run_dirs(runs, scenario) if d.method == method]
    others = sorted({d.key_id for d in found if d.key_id not in (None, kid)})
    legacy = sorted(str(d.path) for d in found if d.key_id is None)
    notes = []
    if others:
        notes.append(
            f"{method}: run key {kid}; {len(others)} other key(s) beside it ({', '.join(others)}: another "
            "config, precision, device or init), each its own row in walla eval"
        )
    if legacy:
        notes.append(
            f"{method}: {len(legacy)} run(s) written before run keys ({legacy[0]}, ...) are never counted; "
            "delete them once retrained"
        )
    return notes
