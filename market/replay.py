"""Replay = offline: a trained scenario's test split through the live market, checked against walla train.

    result = replay(ReplayConfig(scenario="demo-homo-facts", runs="runs", store="walla-store"))

Per seed of one run key of the WALLA method (../train/runs/choice.py: the key the user names, or the method's only
one; every seed walla eval counts unless seeds are named): a fresh ledger and server on a
free loopback port; one agent per slot, each with its own token, its own head (its slot of the run's
state.pt, AgentHead) and its own features from the store (StoreFeatures: that agent's probabilities and
hidden state, nothing of the others'). Every test question becomes a round with the run's mechanism
settings; the agents report concurrently; the operator closes and resolves it (the label, or the gold
distribution for soft targets). Then the live pooled forecasts, wagers and payouts are compared with the
run's predictions.parquet (frozen heads: equal to float32 storage precision) and the live run's metrics
are computed exactly as walla eval computes the table's (evaluate/metrics.py), next to the offline ones.
With `learn`, heads keep updating from their own payouts (Agent.collect_payouts), so the live numbers
then differ from the offline ones by design: the report shows both.

Runs are found only through ../train/runs/choice.py, i.e. the runs walla eval counts (evaluate/load.py).
"""

from __future__ import annotations

import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from walla.evaluate.metrics import EvalArrays, compute_metrics
from walla.market.agent import Agent
from walla.market.client import MarketClient
from walla.market.head import AgentHead
from walla.market.ledger import Ledger
from walla.market.local import LocalServer
from walla.store.schema import VARIANT_CODE
from walla.train import mechanism
from walla.train.runs import RunFormatError, RunRecord, choose_runs, scenario_data

TOLERANCE = 1e-5  # live vs offline: the offline predictions are stored as float32 (relative 6e-8)
WAVE = 20  # rounds open at once with frozen heads
METRICS = ("accuracy", "d_regret", "brier", "auc", "ece", "mrr")


@dataclass
class ReplayConfig:
    scenario: str | None  # None with `run`
    runs: Path | None  # None with `run`
    store: Path
    method: str | None = None  # None: walla-i (or the method of `run`)
    seeds: list[int] | None = None  # None: every counted seed of the key
    learn: bool = False
    batch_size: int = 1  # with learn: resolved rounds per head update
    limit: int | None = None  # first N test questions only
    db: str | None = None  # a ledger path/URL (default: a temporary SQLite file per seed)
    key: str | None = None  # a run key id of the method (../train/runs/choice.py); None: its only key
    run: Path | None = None  # a key or seed directory: names scenario, method, key (and seed)


@dataclass
class SeedResult:
    seed: int
    n_rounds: int
    max_diff: dict[str, float]  # pool, wagers, payouts: max |live - offline|
    live: dict[str, float]  # metrics of the live pooled forecasts
    offline: dict[str, float]  # the same metrics of the run's predictions
    deficit: float
    deficit_bound: float
    seconds: float
    updates: int = 0


@dataclass
class ReplayResult:
    scenario: str
    method: str
    key_id: str
    label: str  # the table's row label of the key
    seeds: list[SeedResult] = field(default_factory=list)

    @property
    def max_diff(self) -> dict[str, float]:
        keys = self.seeds[0].max_diff if self.seeds else {}
        return {k: max(s.max_diff[k] for s in self.seeds) for k in keys}

    def mean(self, which: str) -> dict[str, float]:
        return {k: float(np.mean([getattr(s, which)[k] for s in self.seeds])) for k in METRICS}


class StoreFeatures:
    """One agent's own features for a round, from the assembled scenario (replay only)."""

    def __init__(self, data, slot: int, row_of: dict[str, int], k: int) -> None:
        self.data, self.slot, self.row_of, self.k = data, slot, row_of, k

    def relevant(self, rnd: dict) -> bool:
        """Whether this agent's stored prompt held the round's relevant context (a calibration role)."""
        row = self.row_of[rnd["question"].split("\n", 1)[0]]
        return bool(self.data.variant[row, self.slot] == VARIANT_CODE["relevant"])

    def __call__(self, rnd: dict) -> tuple[list[float], np.ndarray]:
        row = self.row_of[rnd["question"].split("\n", 1)[0]]
        n = len(rnd["options"])
        probs = np.asarray(self.data.probs[row, self.slot], dtype=np.float64)[:n]
        return probs.tolist(), np.asarray(self.data.hidden[self.slot][row])


def _metrics(agg: np.ndarray, weights: np.ndarray, table, rows: np.ndarray) -> dict[str, float]:
    arrays = EvalArrays(agg, table.probs[rows], weights, table.label[rows], table.target[rows])
    return compute_metrics(arrays, list(METRICS))


def _compare(live: dict, record, table, rows: np.ndarray) -> tuple[dict, dict, dict]:
    """max |live - offline| of pools, wagers and payouts; the metrics of both, computed the same way."""
    k_live = live["pool"].shape[1]
    diff = {
        "pool": float(np.abs(live["pool"] - record.agg_probs[rows, :k_live]).max()),
        "wagers": float(np.abs(live["wagers"] - record.extras["wagers"][rows]).max()),
        "payouts": float(np.abs(live["payouts"] - record.extras["payouts"][rows]).max()),
    }
    # the live numbers as walla train stores its predictions (float32, train/runs/_writer.py), then widened as the
    # reader widens them: an exact tie offline ([0.5, 0.5]) stays one live, so argmax-based metrics agree
    pad = np.zeros((len(rows), table.target.shape[1]))  # live pools have the question's options only
    pad[:, :k_live] = _stored(live["pool"])
    offline = _metrics(record.agg_probs[rows], record.weights[rows], table, rows)
    return diff, _metrics(pad, _stored(live["weights"]), table, rows), offline


def _stored(values: np.ndarray) -> np.ndarray:
    return np.asarray(values).astype(np.float32).astype(np.float64)


def replay_seed(cfg: ReplayConfig, record: RunRecord, table, data, out=print) -> SeedResult:
    """One seed's market (module docstring)."""
    t0 = time.perf_counter()
    seed = record.seed
    m = len(table.agents)
    rows = np.arange(len(table.question_id))[: cfg.limit]
    heads = [AgentHead.from_run(record.path, i) for i in range(m)]
    settings = heads[0].cfg  # the run's resolved config: mechanism settings of every round
    mech = {k: getattr(settings, k) for k in ("variant", "c1", "c2", "c3", "pooling")}
    pos = {q: i for i, q in enumerate(data.question_id)}
    row_of = {str(q): pos[q] for q in table.question_id}
    with tempfile.TemporaryDirectory(prefix="walla-replay-") as tmp:
        ledger = Ledger.open(cfg.db or str(Path(tmp) / "market.db"))
        op_token = ledger.ensure_operator()
        with LocalServer(ledger) as srv, MarketClient(srv.url, op_token) as op:
            agents = [
                Agent(
                    MarketClient(srv.url, op.add_agent(f"agent{i + 1}-{name}")),
                    heads[i],
                    StoreFeatures(data, i, row_of, table.target.shape[1]),
                    cfg.learn,
                    cfg.batch_size,
                )
                for i, name in enumerate(table.agents)
            ]
            live = _stream(op, agents, table, rows, mech, 1 if cfg.learn else WAVE)
            deficit = float(sum(live["totals"]))
            bound = len(rows) * mechanism.deficit_bound(settings.c2, settings.c3)
            for a in agents:
                a.client.close()
        ledger.close()
    diff, live_metrics, offline_metrics = _compare(live, record, table, rows)
    updates = sum(len(a.losses) for a in agents)
    res = SeedResult(
        seed,
        len(rows),
        diff,
        live_metrics,
        offline_metrics,
        deficit,
        bound,
        time.perf_counter() - t0,
        updates,
    )
    out(
        f"  seed {seed}: {len(rows)} rounds x {m} agents in {res.seconds:.1f} s; max |live - offline|: "
        + ", ".join(f"{k} {v:.2e}" for k, v in diff.items())
        + (f"; {res.updates} head updates" if cfg.learn else "")
    )
    return res


def _stream(op: MarketClient, agents: list[Agent], table, rows: np.ndarray, mech: dict, wave: int) -> dict:
    """The test questions as rounds, `wave` open at a time: every agent reports on each (its own thread),
    then the operator reads the pools and resolves them. Learning agents need wave 1 (a head update after
    each resolution, before the next report)."""
    soft = table.soft_target
    pool_p, wagers, payouts, weights, totals = [], [], [], [], []

    def agent_reports(a: Agent, rounds: list[dict]) -> list[dict]:
        return [a.report(rnd) for rnd in rounds]

    with ThreadPoolExecutor(len(agents)) as pool:
        for start in range(0, len(rows), wave):
            part = rows[start : start + wave]
            rounds = [
                op.open_round(
                    f"{table.question_id[r]}\nquestion {table.question_id[r]} of scenario {table.name}",
                    [chr(65 + j) for j in range(int(table.option_mask[r].sum()))],
                    **mech,
                )
                for r in part
            ]
            reports = list(pool.map(agent_reports, agents, [rounds] * len(agents)))  # [M][wave]
            for j, (r, rnd) in enumerate(zip(part, rounds, strict=True)):
                forecast = op.pool(rnd["id"])
                op.close_round(rnd["id"])
                n = len(rnd["options"])
                if soft:
                    res = op.resolve(rnd["id"], target=table.target[r, :n].tolist())
                else:
                    res = op.resolve(rnd["id"], label=int(table.label[r]))
                pool_p.append(forecast["probabilities"])
                weights.append(forecast["weights"])
                wagers.append([reports[i][j]["wager"] for i in range(len(agents))])
                payouts.append([res["payouts"][reports[i][j]["agent"]] for i in range(len(agents))])
                totals.append(res["total_payout"])
            if any(a.learn for a in agents):
                list(pool.map(lambda a: a.collect_payouts(), agents))
    return {
        "pool": np.array(pool_p),
        "wagers": np.array(wagers),
        "payouts": np.array(payouts),
        "weights": np.array(weights),
        "totals": totals,
    }


def replay(cfg: ReplayConfig, out=print) -> ReplayResult:
    """Replay every selected seed of the chosen run key; prints one line per seed (see module docstring)."""
    choice = choose_runs(cfg.runs, cfg.scenario, cfg.method, cfg.key, cfg.run, cfg.seeds)
    table = choice.table
    data = scenario_data(table, Path(cfg.store))
    missing = [q for q in table.question_id if q not in set(data.question_id)]
    if missing:
        raise RunFormatError(
            f"--store {cfg.store}: {len(missing)} test questions of {choice.scenario} are not in it"
        )
    n = len(table.question_id) if cfg.limit is None else min(cfg.limit, len(table.question_id))
    out(
        f"walla market replay: {choice.scenario}, {choice.label} (run key {choice.method}/{choice.key_id}), "
        f"seeds {list(choice.seeds)}, {len(table.agents)} agents, {n} test questions"
        + (" (heads learning)" if cfg.learn else " (frozen heads)")
    )
    result = ReplayResult(choice.scenario, choice.method, choice.key_id, choice.label)
    for record in choice.seeds.values():
        result.seeds.append(replay_seed(cfg, record, table, data, out))
    return result
