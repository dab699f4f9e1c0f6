"""LLM compute per question next to quality: what each method needs the agents to run (issue 13).

Input: scenario.json's "meta" holds, from the extraction records of the scenario's feature sets,

    compute = {"agents": [{"model": ..., "tokens_per_question": ..., "flops_per_question": ...}, ...]}

one entry per agent slot (or per model, for agents that share a model); FLOPs are forward FLOPs,
2 x non-embedding parameters x prompt tokens. Without it the report says "compute not recorded".

What a method needs per (test) question:
* an individual agent: its own forward pass;
* WALLA and the pooling baselines (UniformAvg, SelfCertainty, PackLLM, StackedGen): every agent, since they
  pool (or wager on) every agent's prediction;
* the routers (RouteLLM, RouterDC, NIRTRouter, with or without context): the agents they route the
  question to, i.e. every agent with a non-zero weight, read from the saved weights. A hard router would
  run one agent; walla's routers output soft weights over all agents and pool them, so they run all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from walla.evaluate.aggregate import Summary, summarize
from walla.evaluate.load import ScenarioRuns
from walla.evaluate.metrics import METRICS
from walla.evaluate.tables import Cell, Column, Row, Table
from walla.train.methods import REGISTRY
from walla.train.runs import SCENARIO_META

NOT_RECORDED = (
    "LLM compute per question: compute not recorded (scenario.json has no meta.compute, which scenario "
    "assembly takes from the feature sets' extraction records)."
)


@dataclass(frozen=True)
class ComputePoint:
    label: str  # table row label (agent or method display name)
    group: str  # individual | learning_free | learning_based | walla
    agents: float  # agents run per question (mean over test questions and seeds)
    tokens: float  # prompt tokens per question
    flops: float  # forward FLOPs per question
    quality: Summary  # accuracy (hard labels) or Brier (soft targets) over seeds


@dataclass
class ScenarioCompute:
    metric: str  # "accuracy" | "brier"
    points: list[ComputePoint]
    routers: dict[str, bool]  # display name of each router present -> it ran every agent on every question


def agent_costs(meta: dict, agents: list[str], where: str) -> tuple[np.ndarray, np.ndarray] | str:
    """(tokens [M], flops [M]) per agent slot from scenario.json's meta.compute, or why there are none."""
    compute = (meta.get("meta") or {}).get("compute")
    if compute is None:
        return NOT_RECORDED
    entries = compute.get("agents") if isinstance(compute, dict) else None
    rows = []
    for i, e in enumerate(entries if isinstance(entries, list) else [None]):
        try:
            tokens, flops = float(e["tokens_per_question"]), float(e["flops_per_question"])
        except (TypeError, KeyError, ValueError):
            return (
                f"LLM compute per question: not shown ({where}: meta.compute.agents[{i}] should be "
                '{"model", "tokens_per_question", "flops_per_question"} with numbers).'
            )
        rows.append((str(e.get("model")), tokens, flops))
    if [r[0] for r in rows] != list(agents):  # one entry per model: look agents up by model
        by_model = {r[0]: r for r in rows}
        if not set(agents) <= set(by_model):
            missing = ", ".join(sorted(set(agents) - set(by_model)))
            return f"LLM compute per question: not recorded for agent model(s) {missing} ({where})."
        rows = [by_model[a] for a in agents]
    return np.array([r[1] for r in rows]), np.array([r[2] for r in rows])


def is_router(method: str) -> bool:
    info = REGISTRY.get(method)
    return info is not None and info.router  # the registry marks the methods that run only routed agents


def needed(method: str, weights: np.ndarray) -> np.ndarray:
    """[N, M] bool: the agents a method must run on each question (see the module docstring)."""
    if is_router(method):
        return weights > 0
    return np.ones(weights.shape, dtype=bool)


Scores = dict[str, dict[str, float]]  # subset -> metric -> value (scenario_eval.evaluate_scenario)


def scenario_compute(
    data: ScenarioRuns, individual: list[Scores], runs: dict[str, dict[int, Scores]]
) -> ScenarioCompute | str:
    """Compute and quality of every agent (`individual`, by slot) and every counted method (`runs`:
    method -> seed -> scores); a sentence when not recorded."""
    s = data.scenario
    costs = agent_costs(s.meta, s.agents, str(s.path / SCENARIO_META))
    if isinstance(costs, str):
        return costs
    tokens, flops = costs
    metric = "brier" if s.soft_target else "accuracy"
    points = [
        ComputePoint(
            f"Agent {i + 1}: {a}",
            "individual",
            1.0,
            float(tokens[i]),
            float(flops[i]),
            summarize([individual[i]["all"][metric]]),
        )
        for i, a in enumerate(s.agents)
    ]
    routers = {}
    for method, by_seed in runs.items():
        records = [data.runs[method][seed] for seed in sorted(by_seed)]
        need = [needed(r.method, r.weights) for r in records]  # each [N, M]; r.method: the registry name
        first = records[0]
        if is_router(first.method):
            routers[first.display] = all(n.all() for n in need)
        points.append(
            ComputePoint(
                first.display,
                first.group,
                float(np.mean([n.sum(1).mean() for n in need])),
                float(np.mean([(n @ tokens).mean() for n in need])),
                float(np.mean([(n @ flops).mean() for n in need])),
                summarize([by_seed[seed]["all"][metric] for seed in sorted(by_seed)]),
            )
        )
    return ScenarioCompute(metric, points, routers)


def compute_table(sc: ScenarioCompute, scenario: str, caption: str) -> Table:
    """Rows: agents and methods; columns: agents run, tokens, GFLOPs per question, then ACC or Brier."""
    q = METRICS[sc.metric]
    cols = [
        Column("agents_run", "Agents run", None, 1.0, 2),
        Column("tokens", "Tokens / question", None, 1.0, 1),
        Column("gflops", "GFLOPs / question", None, 1e-9, 3),
        Column(sc.metric, q.label, q.higher_is_better, q.scale, q.decimals),
    ]
    rows = [
        Row(
            p.label,
            p.group,
            {
                "agents_run": _one(p.agents),
                "tokens": _one(p.tokens),
                "gflops": _one(p.flops),
                sc.metric: Cell(p.quality),
            },
        )
        for p in sc.points
    ]
    notes = [
        "LLM compute each row needs per test question: prompt tokens and forward FLOPs (2 × non-embedding "
        "parameters × tokens) of the agents it runs, from the extraction records. WALLA and the pooling "
        "baselines run every agent."
    ]
    if sc.routers:
        soft = [name for name, every in sc.routers.items() if every]
        pooled = (
            f"; {', '.join(soft)} output soft weights over every agent and pool them, so they run all agents."
        )
        notes.append(
            f"Routers ({', '.join(sc.routers)}) run only the agents with a non-zero routing weight on a question "
            "(a hard router runs one)" + (pooled if soft else ".")
        )
    scale = "×100" if q.scale == 100.0 else f"×{q.scale:g}"
    notes.append(f"{q.label} {scale}: mean ± 95% CI over seeds; compute: mean over test questions and seeds.")
    title = f"{scenario}: LLM compute per question vs {q.label}"
    return Table("compute", scenario, title, caption, cols, rows, notes=notes)


def _one(value: float) -> Cell:
    """A single number (no interval)."""
    return Cell(Summary(value, None, 1, 1) if math.isfinite(value) else summarize([]))
