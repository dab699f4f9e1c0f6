"""Write small runs in the documented layout (walla.train.runs) with fixed numbers, for evaluate tests.

    from eval_fixtures import write_scenario, write_run      # pytest puts tests/evaluate on sys.path

Independent of the training code on purpose: the files are what the layout contract says, written with
pyarrow, so evaluation is tested against the contract and not against one writer.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from walla.train.runs import PREDICTIONS, RUN_META, SCENARIO_META, SCENARIO_TABLE, TRAIN_LOG


def _lists(a: np.ndarray | None, n: int, dtype=pa.float32()) -> pa.Array:
    if a is None:
        return pa.array([None] * n, type=pa.list_(dtype))
    return pa.array([list(map(float, row)) if dtype != pa.bool_() else list(map(bool, row)) for row in a],
                    type=pa.list_(dtype))  # fmt: skip


def write_scenario(
    runs: Path,
    name: str,
    probs: np.ndarray,  # [N, M, K]
    label: np.ndarray,  # [N]
    split: list[str],
    agents: list[str],
    dataset: str = "toy",
    target: np.ndarray | None = None,  # [N, K]; one-hot(label) when None
    variant: np.ndarray | None = None,  # [N, M] int8
    soft_target: bool = False,
    meta: dict | None = None,
) -> Path:
    n, m, k = probs.shape
    target = np.eye(k)[label] if target is None else target
    variant = np.zeros((n, m), dtype=np.int8) if variant is None else variant
    table = pa.table(
        {
            "question_id": [f"q{i}" for i in range(n)],
            "split": split,
            "label": pa.array(label, type=pa.int64()),
            "target": _lists(target, n),
            "option_mask": _lists(np.ones((n, k), dtype=bool), n, pa.bool_()),
            "agent_probs": _lists(probs.reshape(n, m * k), n),
            "variant": _lists(variant, n, pa.int8()),
        }
    )
    d = runs / name
    d.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, d / SCENARIO_TABLE)
    info = {"name": name, "agents": agents, "dataset": dataset, "soft_target": soft_target, "K": k, "M": m,
            "fingerprints": {f"{a}/none": f"{i:016x}" for i, a in enumerate(dict.fromkeys(agents))}}  # fmt: skip
    info.update(meta or {})
    (d / SCENARIO_META).write_text(json.dumps(info))
    return d


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
    train_log: dict[str, list] | None = None,
    run_meta: dict | None = None,
    complete: bool = True,
    question_ids: list[str] | None = None,
) -> Path:
    n, m = weights.shape
    extras = extras or {}
    cols = {
        "question_id": question_ids or [f"q{i}" for i in range(n)],
        "split": split,
        "weights": _lists(weights, n),
        "agg_probs": _lists(agg_probs, n),
    }
    for key in ("wagers", "payouts", "advantage", "pred_score", "pred_baseline"):
        cols[key] = _lists(extras.get(key), n)
    cols["agent_probs"] = _lists(None if agent_probs is None else agent_probs.reshape(n, -1), n)
    d = runs / scenario / method / f"seed={seed}"
    d.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(cols), d / PREDICTIONS)
    log = train_log or {"step": [], "epoch": [], "n_seen": []}
    pq.write_table(pa.table(log), d / TRAIN_LOG)
    if complete:
        meta = {"method": method, "seed": seed, "wall_time_s": 1.0}
        meta.update(run_meta or {})
        (d / RUN_META).write_text(json.dumps(meta))
    return d
