"""Whether a saved run still counts: staleness (its inputs and schema) and lineage (a joined run's base).

The ONE check of every reader of runs (stale_run_reason): walla eval, the market's heads and replays,
`walla serve` and joining; and the `walla train` command a message about a stale run says to rerun.
"""

from __future__ import annotations

from pathlib import Path

from walla.train.runs._identity import TRAIN_SCHEMA, key_id
from walla.train.runs._layout import (
    KEY_FILE,
    SCENARIO_META,
    SEED_DIR,
    RunFormatError,
    is_complete,
    run_dir,
    scenario_dir,
)
from walla.train.runs._reader import read_json, read_key_file, read_run_meta


def stale_reason(key: dict | None, current_inputs_id: str | None) -> str | None:
    """Why a run of run key `key` is stale for a scenario whose current inputs id is `current_inputs_id`
    (None: it is current): the one rule of walla eval, joining (--add-agent) and the market's live heads."""
    if key is None:
        return "run.json has no run key"
    if key.get("scenario_inputs_id") != current_inputs_id:
        return "trained from other inputs than the scenario's current ones (other feature sets, questions or spec)"
    if key.get("schema") != TRAIN_SCHEMA:
        return f"trained by walla train schema {key.get('schema')!r}, this one is {TRAIN_SCHEMA}"
    return None


def lineage_reason(path: str | Path, meta: dict) -> str | None:
    """Why a joined run (run key `init: {continued_from, base_key_id}`) no longer counts although its own
    inputs are current (None: it does, or it is not a joined run): a joined run is current only while the
    base run it continued is still the current run of its base key and seed -- the base scenario's inputs
    are the ones it was joined from (key `base_inputs_id`), and that run is complete, current and not
    retrained since (run.json `continued.inputs_id`). The rule of walla eval,
    the market's heads and replays (stale_run_reason), so a join of an old base is never averaged with a
    join of the new one."""
    path = Path(path)
    key = meta.get("run_key") if isinstance(meta.get("run_key"), dict) else {}
    init = key.get("init")
    if not (isinstance(init, dict) and "continued_from" in init):
        return None
    cont = meta.get("continued")
    if "base_inputs_id" not in key or not isinstance(cont, dict):
        return "a joined run without the record of the base run it continued (joined by an older walla train)"
    runs, base = path.parents[3], str(init["continued_from"])
    bpath = run_dir(
        runs, base, str(key.get("method")), str(init.get("base_key_id")), int(meta.get("seed", -1))
    )
    if not is_complete(bpath):
        return f"the base run it continued ({bpath}) is gone"
    try:
        bmeta = read_run_meta(bpath)
        current = read_json(scenario_dir(runs, base) / SCENARIO_META).get("inputs_id")
    except RunFormatError as e:
        return f"its base run cannot be read ({e})"
    if key["base_inputs_id"] != current:
        return (
            f"it continued runs of base scenario {base} of inputs {key['base_inputs_id']}, the base "
            f"scenario's inputs are now {current} (re-extracted or retrained since)"
        )
    bkey = bmeta.get("run_key") if isinstance(bmeta.get("run_key"), dict) else None
    why = stale_reason(bkey, current)  # a base run is never itself a join (its key: plan_key, default init)
    if why is not None:
        return f"the base run it continued ({bpath}) does not count: {why}"
    if bmeta.get("inputs_id") != cont.get("inputs_id"):
        return f"the base run it continued ({bpath}) was retrained since it was continued"
    return None


def stale_run_reason(path: str | Path, meta: dict, current_inputs_id: str | None) -> str | None:
    """Why the run at `path` (its run.json `meta`) does not count for a scenario whose current inputs id
    is `current_inputs_id` (None: it counts): stale_reason, then lineage_reason. The ONE check of every
    reader of runs: walla eval (evaluate/load.py), what the market plays (read_current_run_meta; replays
    and `walla serve` through train/runs/_choice.py choose_runs) and joining (train/join.py)."""
    key = meta.get("run_key") if isinstance(meta.get("run_key"), dict) else None
    return stale_reason(key, current_inputs_id) or lineage_reason(path, meta)


def train_command(scenario_meta: dict, name: str, key_dir_path: str | Path | None = None) -> str:
    """The `walla train` command that trains a scenario's runs, as the command that trained them recorded
    it (key.json `command` of `key_dir_path`, with that key's settings; else scenario.json's; written from
    the options that built the scenario, which a kind or a join needs), else the one of a named manifest."""
    recorded = None
    if key_dir_path is not None and (Path(key_dir_path) / KEY_FILE).exists():
        try:
            recorded = read_key_file(key_dir_path).get("command")
        except RunFormatError:
            recorded = None
    return str(recorded or scenario_meta.get("command") or f"walla train --scenario {name}")


def retrain_command(
    scenario_meta: dict,
    name: str,
    key_dir_path: str | Path | None,
    method: str,
    seed: int | None,
    states: bool,
) -> str:
    """The `walla train` command that retrains one run: train_command of its scenario and key, then
    `--methods <method>`, `--seed-list <seed>` and, with `states`, `--save-states <method>` -- a rerun
    without it writes the run without its heads (state.pt), so a fix of a run that has them, or that a
    market head needs, must not drop it. Every message that says to rerun a run prints this."""
    out = f"{train_command(scenario_meta, name, key_dir_path)} --methods {method}"
    out += f" --seed-list {seed}" if seed is not None else ""
    return out + (f" --save-states {method}" if states else "")


def run_seed(path: str | Path) -> int | None:
    """The seed of a run directory named seed=<s> (None: another name)."""
    m = SEED_DIR.match(Path(path).name)
    return int(m.group(1)) if m else None


def read_current_run_meta(path: str | Path) -> dict:
    """run.json of a run another run may start from (a live market head): complete, its run key that of
    its directory <runs>/<scenario>/<method>/<key-id>/seed=<s>, and current for the scenario's
    scenario.json (stale_run_reason, lineage included) -- the runs walla eval counts.

    Raises:
        RunFormatError: one line naming the run, why it does not count and the fix.
    """
    path = Path(path)
    meta = read_run_meta(path)
    key = meta.get("run_key") if isinstance(meta.get("run_key"), dict) else None
    kdir = path.parent
    scenario = kdir.parent.parent
    scen = read_json(scenario / SCENARIO_META)
    method = kdir.parent.name  # a run another starts from: its heads are the point
    retrain = f"rerun {retrain_command(scen, scenario.name, kdir, method, run_seed(path), states=True)}"
    why = stale_run_reason(path, meta, scen.get("inputs_id"))
    if why is None and (key_id(key) != kdir.name or key.get("method") != kdir.parent.name):
        why = f"its run key is not the one of directory {kdir.parent.name}/{kdir.name} (moved or edited by hand)"
    if why is not None:
        raise RunFormatError(f"{path}: stale run: {why}; not used: {retrain}")
    return meta
