"""A run's identity: its run key, the key's directory name (key id) and the inputs ids it holds.

A run's identity is its RUN KEY (`run_key`): everything that changes its result except the seed -- the
training code's schema version (TRAIN_SCHEMA), the scenario's inputs id, the method, its resolved config,
the calibration config, the precision and device kind (for methods that compute with them) and where
its initial parameters came from (a joined run: the base key, and the base scenario's inputs id as a
third validity field, `base_inputs_id`). Its validity fields say whether a run is still valid (a run of
other inputs or of another schema is stale and is retrained in place; a joined run counts only while the
base run it continued is current: lineage_reason); the rest are what the user chose, and
their hash is the directory `<key-id>`: a second configuration of a method lives beside the first, never
over it, and walla eval never averages seeds of different keys. `inputs_id` (the run key and the seed)
tells walla train whether a finished run can be kept.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

# The training code's version: runs of another schema are stale, never counted. Bump it whenever training
# numbers change -- tests/train/test_golden.py fails until you do (train/golden/_check.py, train/golden/golden.json).
# 2: one optimizer path through the engine (f370f1e: MasterAdam C kernel and hand-written backward removed)
TRAIN_SCHEMA = 2
# run-key fields whose change makes a run stale (same key_id); base_inputs_id: a joined run's only
VALIDITY = ("schema", "scenario_inputs_id", "base_inputs_id")


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
