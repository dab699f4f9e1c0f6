"""Every metric of one scenario: each agent alone and each complete run, per seed, on all test questions
and on the hard subset, with the arrays behind them (the bootstrap over questions recomputes from those).

    ev = evaluate_scenario(load_scenario_runs(runs, "demo"))    # -> ScenarioEval
    ev.runs["walla-i"][18]["hard"]["accuracy"]                 # method -> seed -> subset -> metric

The hard subset is defined once per scenario from the agents' own (uncalibrated) probabilities, so every
row of a hard-subset table is computed on the same questions. A method that pooled modified agent
probabilities (calibrated WALLA writes them as agent_probs) is scored against those probabilities
(SPEC §9: calibrated logits feed every metric); every other run against the scenario's raw agents.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from walla.evaluate.compute import ScenarioCompute, scenario_compute
from walla.evaluate.intervals.bootstrap import calibrated_uniforms, counts_from_indices, resample_indices
from walla.evaluate.load import Problem, Run, ScenarioRuns
from walla.evaluate.metrics import EvalArrays, compute_metrics, hard_subset, per_agent_brier
from walla.evaluate.validation import Validation, validation_scores

UNIFORM_ATOL = 1e-6  # |w - 1/M| below which weights count as equal


Views = dict[str, EvalArrays]  # subset -> the arrays one agent / one run is scored on


@dataclass
class ScenarioEval:
    """Metric values of one scenario: per method, per seed, per subset; and the arrays behind them, which
    the bootstrap over questions recomputes the metrics from."""

    data: ScenarioRuns
    hard_mask: np.ndarray  # [N] bool
    individual: list[dict[str, dict[str, float]]]  # agent slot -> subset -> metric -> value
    runs: dict[str, dict[int, dict[str, dict[str, float]]]]  # method -> seed -> subset -> metric -> value
    uniform: set[str]  # methods with equal weights on every question of every seed
    agent_views: list[Views] = field(default_factory=list)  # agent slot -> subset -> arrays
    run_views: dict[str, dict[int, Views]] = field(default_factory=dict)  # method -> seed -> subset -> arrays
    counts: dict[str, np.ndarray] = field(default_factory=dict)  # subset -> [n, B] question resample counts
    uniforms: dict[str, np.ndarray] = field(default_factory=dict)  # subset -> [n, B] calibrated label draws
    validation: Validation = field(default_factory=lambda: Validation({}))  # the ‡ reference's choice
    compute: ScenarioCompute | str | None = None  # compute.py; a sentence when not recorded

    @property
    def own_agents(self) -> list[str]:
        """Methods scored against agent probabilities of their own (calibrated WALLA), not the scenario's."""
        return [mt for mt in self.runs if any(r.agent_probs is not None for r in self.data.runs[mt].values())]

    @property
    def seeds(self) -> list[int]:
        return sorted({s for by_seed in self.runs.values() for s in by_seed})


def _arrays(run: Run, data: ScenarioRuns, agent_brier: np.ndarray) -> EvalArrays:
    s = data.scenario
    if run.agent_probs is not None:  # the method pooled its own (e.g. calibrated) agent probabilities
        return EvalArrays(run.agg_probs, run.agent_probs, run.weights, s.label, s.target)
    return EvalArrays(run.agg_probs, s.probs, run.weights, s.label, s.target, agent_brier)


def _views(arrays: EvalArrays, mask: np.ndarray) -> Views:
    return {"all": arrays, "hard": arrays.subset(mask)}


def _scores(views: Views) -> dict[str, dict[str, float]]:
    return {subset: compute_metrics(arrays) for subset, arrays in views.items()}


def _resample_counts(n: int) -> np.ndarray:
    """[n, B] counts of the fixed question resamples of an n-question table (intervals/bootstrap.py)."""
    return counts_from_indices(resample_indices(n), n)


def evaluate_scenario(data: ScenarioRuns) -> ScenarioEval:
    """Every metric for every agent and every complete run; a run whose arrays fail validation is dropped
    and recorded as a problem."""
    s = data.scenario
    n, m, _ = s.probs.shape
    mask = hard_subset(s.probs, s.label)
    agent_brier = per_agent_brier(s.probs, s.target)  # [N, M], shared by every run that pooled s.probs
    ev = ScenarioEval(data, mask, [], {}, set())
    for i in range(m):
        onehot = np.zeros((n, m))
        onehot[:, i] = 1.0
        arrays = EvalArrays(s.probs[:, i], s.probs, onehot, s.label, s.target, agent_brier, agent_brier[:, i])
        ev.agent_views.append(_views(arrays, mask))
        ev.individual.append(_scores(ev.agent_views[-1]))
    for method, by_seed in data.runs.items():
        equal = True
        for seed, run in by_seed.items():
            try:
                views = _views(_arrays(run, data, agent_brier), mask)
                ev.runs.setdefault(method, {})[seed] = _scores(views)
            except ValueError as e:
                data.problems.append(Problem("unreadable", s.name, method, seed, str(e)))
                continue
            ev.run_views.setdefault(method, {})[seed] = views
            equal &= bool(np.all(np.abs(run.weights - 1.0 / m) < UNIFORM_ATOL))
        if method in ev.runs and equal:
            ev.uniform.add(method)
    ev.counts = {"all": _resample_counts(n), "hard": _resample_counts(int(mask.sum()))}
    ev.uniforms = {"all": calibrated_uniforms(n), "hard": calibrated_uniforms(int(mask.sum()))}
    ev.validation = validation_scores(data)
    data.problems += [Problem("unreadable", s.name, None, None, p) for p in ev.validation.problems]
    ev.compute = scenario_compute(data, ev.individual, ev.runs)
    return ev
