"""The baselines' scores on the validation questions: what the ‡ reference of a column is chosen on.

Choosing the "best baseline" by its test mean picks, among several equally good baselines, the one the
test questions happened to favour, and then tests the other rows against that lucky draw on the same
questions (issue 28: 13% false ‡ marks at a nominal 5%). Every run's predictions.parquet holds every
split, so the same runs are read back on the scenario's validation questions (through walla.train.runs._reader,
the one reader) and the metrics computed there, per seed, averaged over seeds as the table does.
Only baseline rows (learning-free, learning-based) are read: they are the only candidates. Methods that
early-stop on the validation questions (the routers, StackedGen) see them during training, so their
validation score is slightly optimistic; that can only favour them as the reference, never mark a test
difference that is not there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from walla.evaluate.aggregate import summarize
from walla.evaluate.intervals.significance import BASELINE_GROUPS
from walla.evaluate.load import ScenarioRuns
from walla.evaluate.metrics import EvalArrays, compute_metrics, hard_subset
from walla.train.runs import RunFormatError, read_run, read_scenario_table

Means = dict[str, float]  # metric -> seed mean


@dataclass
class Validation:
    """Validation seed means of the baseline rows, per subset ("all", "hard"), and what they are on."""

    questions: dict[str, str]  # subset -> "the 60 validation questions" (absent: no validation questions)
    means: dict[str, dict[str, Means]] = field(default_factory=dict)  # row key -> subset -> metric -> mean
    problems: list[str] = field(default_factory=list)  # runs that could not be read on validation


def validation_scores(data: ScenarioRuns) -> Validation:
    """Read every baseline row's runs on the scenario's validation questions and score them there; the
    hard subset is defined on validation as on test (questions some agent gets wrong)."""
    s = data.scenario
    try:
        val = read_scenario_table(s.path.parent, s.name, split="val")
    except RunFormatError:
        return Validation({})  # no validation rows (or an unreadable table: the test table would fail too)
    hard = hard_subset(val.probs, val.label)
    questions = {"all": f"the {len(val.label)} validation questions"}
    if hard.any():
        questions["hard"] = f"the {int(hard.sum())} validation questions of the hard subset"
    out = Validation(questions)
    for key, by_seed in data.runs.items():
        first = next(iter(by_seed.values()))
        if first.group not in BASELINE_GROUPS:
            continue
        per_seed: dict[str, list[dict[str, float]]] = {"all": [], "hard": []}
        for run in by_seed.values():
            try:
                rec = read_run(run.path, val)
            except RunFormatError as e:
                out.problems.append(str(e))
                continue
            probs = val.probs if rec.agent_probs is None else rec.agent_probs
            arrays = EvalArrays(rec.agg_probs, probs, rec.weights, val.label, val.target)
            per_seed["all"].append(compute_metrics(arrays))
            if hard.any():
                per_seed["hard"].append(compute_metrics(arrays.subset(hard)))
        out.means[key] = {
            subset: {m: summarize([v[m] for v in values]).mean for m in values[0]}
            for subset, values in per_seed.items()
            if values
        }
    return out


def row_validation(v: Validation, key: str, subset: str) -> Means:
    """The validation means of one table row (empty: not a baseline, or no validation questions)."""
    if subset not in v.questions:
        return {}
    return dict(v.means.get(key, {}).get(subset, {}))
