"""`walla serve --check`: serve = offline, within what each feature set's tier promises. Every test question of
the run, asked by `question_id` through the served pool (the LLMs scoring live, batched as the server
batches), against the store and the run:

    result = check_served(forecaster)
    # {"n": 20, "pool": 3.0e-08, "wagers": 1.2e-08, "path_pool": 0.0, "agents": [...], "problems": []}

- features: each agent's served option probabilities and hidden state against its feature set's, held to its
  tier's promise (serve/loading.py `feature_promise`): bitwise, the same bits; tolerance, the bound the set
  recorded (option log-probs absolute: a renormalized log-probability within twice it; hidden states relative
  to the row's largest value, plus the float16 rounding both sides share); batch-recorded, none (printed);
- the path: the heads and the pool applied to the STORED features give walla train's stored wagers and pool
  (predictions.parquet, train/runs/_reader.py) within POOL_ROUNDING, whatever the tier;
- the pool served live against walla train's: within POOL_ROUNDING where every agent is bitwise (equal
  features, so only the float32 storage of the offline numbers differs); otherwise printed beside the bound
  its features held to.

The rounds go to the forecaster's ledger (the CLI gives it a temporary one).
"""

from __future__ import annotations

import numpy as np
from walla.market.payouts import pooled_forecast
from walla.serve.forecast import Forecaster
from walla.serve.loading import FLOAT16_ROUNDING

POOL_ROUNDING = (
    1e-6  # the offline pool and wagers are stored as float32: equal features differ by its rounding
)
TOLERANCE = POOL_ROUNDING  # the name the tests and the CLI knew


def _log_gap(served: np.ndarray, stored: np.ndarray) -> float:
    """max |log served - log stored| over the options (inf where one is 0 and the other is not)."""
    a, b = served.astype(np.float64), stored.astype(np.float64)
    both = (a > 0) & (b > 0)
    if np.any((a > 0) != (b > 0)):
        return float("inf")
    return float(np.abs(np.log(a[both]) - np.log(b[both])).max(initial=0.0))


def _hidden_gap(served: np.ndarray, stored: np.ndarray) -> float:
    a, b = served.astype(np.float64), stored.astype(np.float64)
    return float(np.abs(a - b).max(initial=0.0) / max(np.abs(b).max(initial=0.0), 1e-30))


def check_served(fc: Forecaster, limit: int | None = None, caller: str = "check") -> dict:
    """Serve against the store and the run on the run's test questions (module docstring)."""
    pool = fc.pool
    table = pool.choice.table
    record = pool.choice.seeds[pool.seed]
    rows = np.arange(len(table.question_id))[:limit]
    jobs = [fc.prepare(question_id=str(table.question_id[r])) for r in rows]
    futs = [fc.submit(j) for j in jobs]  # all queued at once: the batchers coalesce them
    answers = [fc.finish(j, f, caller) for j, f in zip(jobs, futs, strict=True)]
    stats = {a.slot: {"equal": True, "logprobs": 0.0, "hidden": 0.0} for a in pool.agents}
    pool_diff = wager_diff = path_pool = path_wagers = 0.0
    for r, job, fs, ans in zip(rows, jobs, futs, answers, strict=True):
        if ans["failed_agents"]:
            raise RuntimeError(f"question {table.question_id[r]}: agents failed: {ans['failed_agents']}")
        k = len(ans["probabilities"])
        row = pool.row_of[str(table.question_id[r])]
        stored_probs, stored_wagers = [], []
        for a in pool.agents:
            served = dict(zip(job.per_model[id(a.llm)], fs[id(a.llm)].result(), strict=True))
            p, h, _ = served[job.prompts[a.slot]]
            sp, sh = pool.data.probs[row, a.slot, :k], np.asarray(pool.data.hidden[a.slot][row])
            st = stats[a.slot]
            st["equal"] &= bool(np.array_equal(p, sp) and np.array_equal(h, sh.astype(h.dtype)))
            st["logprobs"] = max(st["logprobs"], _log_gap(p, sp))
            st["hidden"] = max(st["hidden"], _hidden_gap(h, sh))
            with fc.head_lock:
                stored_wagers.append(float(a.head.wager(sh)))
                if (
                    a.head.calibrate is not None
                ):  # walla-i-cal: the stored probabilities calibrated, as offline
                    sp = a.head.calibrate(sp, sh, job.relevant[a.slot])
            stored_probs.append([float(x) for x in sp])
        offline = record.agg_probs[r, :k]
        pool_diff = max(pool_diff, float(np.abs(np.array(ans["probabilities"]) - offline).max()))
        wagers = np.array([x["wager"] for x in ans["agents"]])
        wager_diff = max(wager_diff, float(np.abs(wagers - record.extras["wagers"][r]).max()))
        path = pooled_forecast(stored_probs, stored_wagers, pool.settings.pooling, k)
        path_pool = max(path_pool, float(np.abs(np.array(path["probabilities"]) - offline).max()))
        path_wagers = max(
            path_wagers, float(np.abs(np.array(stored_wagers) - record.extras["wagers"][r]).max())
        )
    agents, problems = [], []
    for a in pool.agents:
        promise, st = a.llm.promise, stats[a.slot]
        bound = promise["bound"]
        if promise["tier"] == "bitwise":
            holds, limits = st["equal"], "equal"
        elif isinstance(bound, dict):
            lp, hid = (
                2 * bound.get("option_logprobs", 0.0),
                bound.get("hidden_relative", 0.0) + FLOAT16_ROUNDING,
            )
            holds, limits = st["logprobs"] <= lp and st["hidden"] <= hid, f"<= {lp:.1e} / {hid:.1e}"
        else:
            holds, limits = True, "no bound"
        agents.append({"name": a.name, "tier": promise["tier"], **st, "bound": limits, "holds": holds})
        if not holds:
            problems.append(
                f"{a.name} ({promise['tier']}): features differ from the store's by log-probs "
                f"{st['logprobs']:.3e}, hidden {st['hidden']:.3e} (promise: {limits})"
            )
    if max(path_pool, path_wagers) > POOL_ROUNDING:
        problems.append(f"heads and pool on the stored features differ from walla train's by {path_pool:.3e}")
    bitwise = all(a.llm.tier == "bitwise" for a in pool.agents)
    if bitwise and pool_diff > POOL_ROUNDING:
        problems.append(f"served differs from offline by {pool_diff:.3e} > {POOL_ROUNDING:g} (bitwise)")
    return {
        "n": len(rows),
        "pool": pool_diff,
        "wagers": wager_diff,
        "path_pool": path_pool,
        "path_wagers": path_wagers,
        "pool_bound": POOL_ROUNDING if bitwise else None,
        "agents": agents,
        "problems": problems,
    }
