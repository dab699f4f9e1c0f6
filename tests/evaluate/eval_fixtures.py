"""Small runs with fixed numbers, written by TRAIN's writer (walla.train.runs._writer), for the evaluate tests.

    from eval_fixtures import write_scenario, write_run      # pytest puts tests/evaluate on sys.path

The scenario is a real `ScenarioData` written by `write_scenario_table`; a run is a real `MethodOutput`
written by `walla.train.runs._writer.write_run` with the run.json fields walla train records, its training curve
by train's CSV logger. Evaluation then reads them with its own reader, so the tests check that the one
writer and the one reader agree (issue 9: "a test writes runs with train's writer and reads them with
evaluate's reader").
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from walla.store.scenario import ScenarioData
from walla.train.methods import REGISTRY, MethodOutput
from walla.train.runs import (
    RUN_META,
    SCENARIO_META,
    key_id,
    run_dir,
    run_key,
    scenario_dir,
    write_key_file,
    write_scenario_table,
)
from walla.train.runs import write_run as train_write_run

SPEC = {"dataset": "toy", "context": "none"}  # a stand-in for the resolved scenario spec

# q0 is a train row (must be ignored); q1..q5 are test rows. Probabilities per agent (alpha, beta):
PROBS = np.array(
    [
        [[0.5, 0.5], [0.5, 0.5]],
        [[0.91, 0.09], [0.62, 0.38]],
        [[0.23, 0.77], [0.71, 0.29]],
        [[0.34, 0.66], [0.43, 0.57]],
        [[0.58, 0.42], [0.17, 0.83]],
        [[0.74, 0.26], [0.48, 0.52]],
    ]
)
LABEL = np.array([0, 0, 0, 1, 1, 0])
SPLIT = ["train"] + ["test"] * 5


def scenario_data(
    name: str,
    probs: np.ndarray,  # [N, M, K]
    label: np.ndarray,  # [N]
    split: list[str],
    agents: list[str],
    dataset: str = "toy",
    target: np.ndarray | None = None,  # [N, K]; one-hot(label) when None
    variant: np.ndarray | None = None,  # [N, M] int8
    soft_target: bool = False,
    fingerprints: dict[str, str] | None = None,  # default: "<agent>/none" -> 0..0<i>
    meta: dict | None = None,  # ScenarioData.meta (scenario.json "meta"), e.g. {"compute": ...}
) -> ScenarioData:
    n, m, k = probs.shape
    if fingerprints is None:
        fingerprints = {f"{a}/none": f"{i:016x}" for i, a in enumerate(dict.fromkeys(agents))}
    return ScenarioData(
        name=name,
        dataset=dataset,
        agents=list(agents),
        question_id=np.array([f"q{i}" for i in range(n)]),
        split=np.array(split),
        question=[f"question {i}" for i in range(n)],
        prompts=None,
        n_options=np.full(n, k),
        option_mask=np.ones((n, k), dtype=bool),
        probs=np.asarray(probs, dtype=np.float32),
        label=np.asarray(label, dtype=np.int64),
        target=np.asarray(np.eye(k)[label] if target is None else target, dtype=np.float32),
        soft_target=soft_target,
        prompt_nll=np.zeros((n, m), dtype=np.float32),
        variant=np.zeros((n, m), dtype=np.int8) if variant is None else np.asarray(variant, dtype=np.int8),
        hidden=[np.zeros((n, 4), dtype=np.float32) for _ in range(m)],
        fingerprints=fingerprints,
        meta=dict(meta or {}),
    )


def write_scenario(runs: Path, name: str, probs, label, split, agents, methods=(), seeds=(), **kw) -> dict:
    """scenario.parquet + scenario.json through train's writer; returns scenario.json.

    `kw` goes to `scenario_data` (dataset, target, variant, soft_target, fingerprints, meta).
    """
    return write_scenario_table(
        runs, scenario_data(name, probs, label, split, agents, **kw), SPEC, methods, seeds
    )


def write_run(
    runs: Path,
    scenario: str,
    method: str,
    seed: int,
    weights: np.ndarray,  # [N, M]
    agg_probs: np.ndarray,  # [N, K]
    split: list[str],
    extras: dict[str, np.ndarray] | None = None,  # wagers/payouts/advantage/pred_score/pred_baseline [N, M]
    agent_probs: np.ndarray | None = None,  # [N, M, K]
    train_log: dict[str, list] | None = None,  # column -> values, one per training batch
    run_meta: dict | None = None,  # overrides of run.json fields
    complete: bool = True,  # False: as if killed before run.json was written
    question_ids: list[str] | None = None,
    planned: list[int] | None = None,  # the seeds key.json plans for this run key (default: the scenario's)
) -> Path:
    """One run through train's writer, bound to the scenario's current inputs (scenario.json inputs_id), its
    run key built as walla train builds it (config from run_meta, else {}; 32-true on cpu), with key.json
    planning the scenario's seeds."""
    n = len(weights)
    scen = json.loads((scenario_dir(runs, scenario) / SCENARIO_META).read_text())
    config = (run_meta or {}).get("config", {})
    key = run_key(scen["inputs_id"], method, config, precision="32-true", device="cpu")
    write_key_file(runs, scenario, key, scen["seeds"] if planned is None else planned)
    path = run_dir(runs, scenario, method, key_id(key), seed)
    if train_log:
        from walla.train.loggers import RunLogger  # Lightning's CSVLogger: only the plot tests need it

        logs = RunLogger(path)
        for i in range(len(next(iter(train_log.values())))):
            logs({key: values[i] for key, values in train_log.items()})
        logs.finish()
    info = REGISTRY.get(method)
    meta = {
        "scenario": scenario,
        "method": method,
        "display_name": info.display if info else method,
        "group": info.group if info else "learning_based",
        "seed": seed,
        "config": config,
        "run_key": key,
        "key_id": key_id(key),
        "inputs_id": f"{scen['inputs_id']}-{method}-{seed}",
        "scenario_inputs_id": scen["inputs_id"],
        "fingerprints": scen["fingerprints"],
        "wall_time_s": 1.0,
        "device": "cpu",
        "precision": "32-true",
        **(run_meta or {}),
    }
    out_extras = dict(extras or {})
    if agent_probs is not None:
        out_extras["agent_probs"] = agent_probs
    output = MethodOutput(np.asarray(weights, np.float32), np.asarray(agg_probs, np.float32), out_extras)
    train_write_run(path, question_ids or [f"q{i}" for i in range(n)], split, output, meta)
    if not complete:
        (path / RUN_META).unlink()
    return path
