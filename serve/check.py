"""`walla serve --check`: serve = offline. Every test question of the run, asked by `question_id` through the
served pool (the LLMs scoring live, batched as the server batches), against the pooled probabilities and
wagers `walla train` stored for that run and seed (predictions.parquet, read by train/runs/_reader.py).

    result = check_served(forecaster)      # {"n": 20, "pool": 3.0e-08, "wagers": 1.2e-08}

The rounds go to the forecaster's ledger (the CLI gives it a temporary one). The offline numbers are stored
as float32, so equal features give differences of float32 rounding (< 1e-7); TOLERANCE is the issue's bound.
"""

from __future__ import annotations

import numpy as np
from walla.serve.forecast import Forecaster

TOLERANCE = 1e-6


def check_served(fc: Forecaster, limit: int | None = None, caller: str = "check") -> dict:
    pool = fc.pool
    table = pool.choice.table
    record = pool.choice.seeds[pool.seed]
    rows = np.arange(len(table.question_id))[:limit]
    jobs = [fc.prepare(question_id=str(table.question_id[r])) for r in rows]
    futs = [fc.submit(j) for j in jobs]  # all queued at once: the batchers coalesce them
    answers = [fc.finish(j, f, caller) for j, f in zip(jobs, futs, strict=True)]
    pool_diff, wager_diff = 0.0, 0.0
    for r, a in zip(rows, answers, strict=True):
        if a["failed_agents"]:
            raise RuntimeError(f"question {table.question_id[r]}: agents failed: {a['failed_agents']}")
        k = len(a["probabilities"])
        pool_diff = max(
            pool_diff, float(np.abs(np.array(a["probabilities"]) - record.agg_probs[r, :k]).max())
        )
        wagers = np.array([x["wager"] for x in a["agents"]])
        wager_diff = max(wager_diff, float(np.abs(wagers - record.extras["wagers"][r]).max()))
    return {"n": len(rows), "pool": pool_diff, "wagers": wager_diff}
