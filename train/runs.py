"""The on-disk format of training runs: the ONE writer (walla train) and the ONE reader (walla eval).

    <runs>/<scenario>/scenario.parquet   one row per question: question_id, split, label, target [K],
                                          option_mask [K], agent_probs [M*K] (agent-major), variant [M]
    <runs>/<scenario>/scenario.json      agents, dataset, soft_target, K, M, N, splits, fingerprints
                                          (feature sets used: "<model>/<variant>" -> fp), inputs_id,
                                          methods and seeds ever planned, the resolved spec, the
                                          `walla train` command that builds it (train_command)
    <runs>/<scenario>/.lock              one walla train per runs dir and scenario at a time
    <runs>/<scenario>/<method>/<key-id>/key.json   the run key of the runs below, and the seeds planned
    <runs>/<scenario>/<method>/<key-id>/seed=<s>/
        predictions.parquet  question_id, split, weights [M], agg_probs [K], wagers/payouts/advantage/
                             pred_score/pred_baseline [M] | null, agent_probs [M*K] | null (methods that
                             change agents' probs, e.g. calibration), method-specific extra list columns
        logs/metrics.csv     the training curve, one row per training batch: step, epoch, n_seen, metric
                             columns (Lightning's CSVLogger, train/loggers.py; absent for methods without
                             training); logs/tensorboard/ with --logger tensorboard
        state.pt             the trained state, only for the methods of --save-states (train/run.py): WALLA
                             heads continued by --add-agent and played by walla market
        run.json             method, display_name, group, seed, run_key, key_id, config (resolved),
                             inputs_id, fingerprints, device, precision, wall_time_s, test_brier, test_acc,
                             continued (a joined run: the base run's scenario, key_id, seed, inputs_id);
                             written LAST: marks the run complete

A run's identity is its RUN KEY (`run_key`): everything that changes its result except the seed -- the
training code's schema version (TRAIN_SCHEMA), the scenario's inputs id, the method, its resolved config,
the calibration config, the precision and device kind (for methods that compute with them) and where
its initial parameters came from (a joined run: the base key, and the base scenario's inputs id as a
third validity field, `base_inputs_id`). Its validity fields say whether a run is still valid (a run of
other inputs or of another schema is stale and is retrained in place; a joined run counts only while the
base run it continued is current: lineage_reason); the rest are what the user chose, and
their hash is the directory `<key-id>`: a second configuration of a method lives beside the first, never
over it, and walla eval never averages seeds of different keys. `inputs_id` (the run key and the seed)
tells walla train whether a finished run can be kept. Directories `<method>/seed=<s>/` directly under the
scenario are the layout before run keys: listed (key_id None) so that they are reported stale, never read
as current runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from walla.store.atomic import write_atomic, write_json, write_parquet

SCENARIO_TABLE, SCENARIO_META, LOCK = "scenario.parquet", "scenario.json", ".lock"
PREDICTIONS, TRAIN_LOG, STATE, RUN_META = "predictions.parquet", "logs/metrics.csv", "state.pt", "run.json"
KEY_FILE = "key.json"
METHOD_GROUPS = ("individual", "learning_free", "learning_based", "walla")
EXTRAS = ("wagers", "payouts", "advantage", "pred_score", "pred_baseline")  # optional [M] columns
SEED_DIR = re.compile(r"^seed=(-?\d+)$")
KEY_DIR = re.compile(r"^[0-9a-f]{10}$")  # key_id(): 10 hex digits
# The training code's version: runs of another schema are stale, never counted. Bump it whenever training
# numbers change -- tests/train/test_golden.py fails until you do (train/golden.py, train/golden.json).
# 2: one optimizer path through the engine (f370f1e: MasterAdam C kernel and hand-written backward removed)
TRAIN_SCHEMA = 2
# run-key fields whose change makes a run stale (same key_id); base_inputs_id: a joined run's only
VALIDITY = ("schema", "scenario_inputs_id", "base_inputs_id")


class RunFormatError(ValueError):  # a run or scenario file that cannot be read as this format (names it)
    pass


def scenario_dir(runs: str | Path, scenario: str) -> Path:
    return Path(runs) / scenario


def key_dir(runs: str | Path, scenario: str, method: str, key_id: str) -> Path:
    return scenario_dir(runs, scenario) / method / key_id


def run_dir(runs: str | Path, scenario: str, method: str, key_id: str, seed: int) -> Path:
    return key_dir(runs, scenario, method, key_id) / f"seed={int(seed)}"


def jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return jsonable(dataclasses.asdict(obj))
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    return obj


def inputs_id(*parts: Any) -> str:
    """sha256 (16 hex) of the canonical JSON of everything a result depends on."""
    text = json.dumps(jsonable(parts), sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def data_inputs_id(data, spec: dict) -> str:
    """What a scenario's rows are: feature sets, question ids and splits, and the spec."""
    qid = hashlib.sha256("\n".join(map(str, data.question_id)).encode()).hexdigest()
    split = hashlib.sha256("".join(s[:2] for s in map(str, data.split)).encode()).hexdigest()
    return inputs_id(dict(data.fingerprints), qid, split, spec, data.name)


def device_kind(device: str) -> str:
    """'cuda:1' -> 'cuda': the kind of device changes a result, its index does not."""
    return str(device).split(":", 1)[0]


def run_key(
    scenario_inputs_id: str,
    method: str,
    config: Any,
    *,
    calibration: Any = None,
    precision: str | None = None,
    device: str | None = None,
    init: str | dict = "default init",
    base_inputs_id: str | None = None,
) -> dict:
    """A run's identity (see the module docstring), as plain JSON data.

    `precision` / `device`: None for a method whose result cannot depend on them (it computes nothing
    with torch's device or Lightning's precision); `calibration`: None when the agents are not calibrated.
    `base_inputs_id`: a joined run's (init {continued_from, base_key_id}) base scenario's inputs id, a
    validity field like the scenario's own: a join of a base retrained from other inputs is stale, and
    retrained in place (lineage_reason).
    """
    key = {
        "schema": TRAIN_SCHEMA,
        "scenario_inputs_id": scenario_inputs_id,
        "method": method,
        "config": jsonable(config),
        "calibration": jsonable(calibration),
        "precision": precision,
        "device": None if device is None else device_kind(device),
        "init": init,
    }
    if key["device"] == "cuda":
        # CUDA runs draw their init on the device (engine.init_generator), other values than the host-drawn
        # init of CUDA runs before it: another key. CPU keys are unchanged (the CPU init is the same).
        key["init_drawn_on"] = "cuda"
    if base_inputs_id is not None:
        key["base_inputs_id"] = base_inputs_id
    return key


def key_id(key: dict) -> str:
    """The directory name of a run key: the hash of what the user chose (not of the VALIDITY fields, so a
    run of old inputs or an old schema is retrained in place rather than kept beside)."""
    return inputs_id({k: v for k, v in key.items() if k not in VALIDITY})[:10]


# ---------------------------------------------------------------------------------------------- writer


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
        old = _read_json(d / SCENARIO_META)
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
        old = _read_json(d / KEY_FILE)
    except RunFormatError:
        old = {}
    kept = old.get("seeds", []) if old.get("run_key") == jsonable(key) else []
    meta = {"run_key": jsonable(key), "seeds": sorted({*map(int, kept), *map(int, seeds)})}
    if command or old.get("command"):
        meta["command"] = command or old["command"]
    if meta != old:
        write_json(d / KEY_FILE, meta)
    return d / KEY_FILE


# ---------------------------------------------------------------------------------------------- reader


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


def _read_json(path: Path) -> dict:
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
    meta = _read_json(d / SCENARIO_META)
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


def is_complete(path: str | Path) -> bool:  # run.json is written last
    return (Path(path) / RUN_META).exists()


def read_run_meta(path: Path) -> dict:
    return _read_json(Path(path) / RUN_META)


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
        current = _read_json(scenario_dir(runs, base) / SCENARIO_META).get("inputs_id")
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
    and `walla serve` through market/run_choice.py choose_runs) and joining (train/join.py)."""
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
    scen = _read_json(scenario / SCENARIO_META)
    seed = f" --seed-list {m.group(1)}" if (m := SEED_DIR.match(path.name)) else ""
    retrain = f"rerun {train_command(scen, scenario.name, kdir)} --methods {kdir.parent.name}{seed}"
    why = stale_run_reason(path, meta, scen.get("inputs_id"))
    if why is None and (key_id(key) != kdir.name or key.get("method") != kdir.parent.name):
        why = f"its run key is not the one of directory {kdir.parent.name}/{kdir.name} (moved or edited by hand)"
    if why is not None:
        raise RunFormatError(f"{path}: stale run: {why}; not used: {retrain}")
    return meta


def read_scenario_meta(path: str | Path) -> dict:
    """A scenario directory's scenario.json (RunFormatError naming it when missing or unreadable)."""
    return _read_json(Path(path) / SCENARIO_META)


def read_key_file(path: str | Path) -> dict:
    """A key directory's key.json (see write_key_file)."""
    return _read_json(Path(path) / KEY_FILE)


@dataclasses.dataclass(frozen=True)
class RunDir:
    """One run directory found on disk (complete or not)."""

    method: str
    key_id: str | None  # None: the layout before run keys (<method>/seed=<s>/), always stale
    seed: int
    path: Path


def _seed_dirs(parent: Path) -> list[tuple[int, Path]]:
    found = ((SEED_DIR.match(p.name), p) for p in sorted(parent.iterdir()) if p.is_dir())
    return [(int(m.group(1)), p) for m, p in found if m is not None]


def list_run_dirs(runs: str | Path, scenario: str) -> list[RunDir]:
    """Every run directory under <runs>/<scenario>/, by method, key id and seed (sorted by path)."""
    d = scenario_dir(runs, scenario)
    if not d.is_dir():
        return []
    out: list[RunDir] = []
    for mdir in sorted(p for p in d.iterdir() if p.is_dir() and not p.name.startswith(".")):
        out += [RunDir(mdir.name, None, seed, p) for seed, p in _seed_dirs(mdir)]
        for kdir in sorted(p for p in mdir.iterdir() if p.is_dir() and KEY_DIR.match(p.name)):
            out += [RunDir(mdir.name, kdir.name, seed, p) for seed, p in _seed_dirs(kdir)]
    return out


def list_scenarios(runs: str | Path) -> list[str]:
    root = Path(runs)  # the scenario directories: those holding scenario.json
    if not root.is_dir():
        raise RunFormatError(f"runs directory {root} does not exist (run walla train first, or pass --runs)")
    return sorted(p.name for p in root.iterdir() if (p / SCENARIO_META).exists())
