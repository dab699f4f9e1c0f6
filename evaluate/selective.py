"""Selective answers: answer only where the pooled forecast is confident, abstain (or escalate) elsewhere.

    table = selective_table(ev)        # accuracy–coverage per agent and method -> Table (tables.py formats it)
    curves = selective_curves(ev)      # method -> (coverage grid, seed-mean accuracy) for the plot

A forecast's confidence is its top probability max_k p_k (the pooled p for a method, the agent's own for an
agent). Two ways to abstain, each a pair of columns:

* a threshold t (THRESHOLDS): answer the questions with confidence >= t; the columns are the accuracy on
  those (undefined, "–", where none is answered) and the coverage, the share answered;
* a coverage c (COVERAGES): answer the ceil(c n) most confident questions (ties: the earlier question
  first); the column is their accuracy.

Each cell is the seed mean ± the 95% t-interval over seeds, then [lo, hi] the 95% percentile interval over
the same paired question resamples as every other table of the scenario (intervals/bootstrap.py: on a resample a
question counts as often as it is drawn; at a coverage c the ceil(c n) most confident draws are answered).
The thresholds and coverages are fixed here, before any result: they are not chosen per scenario.
"""

from __future__ import annotations

import math

import numpy as np
from walla.evaluate.aggregate import summarize
from walla.evaluate.intervals.bootstrap import percentile_interval, seed_mean
from walla.evaluate.scenario_eval import ScenarioEval
from walla.evaluate.tables import Cell, Column, Row, Table

THRESHOLDS = (0.5, 0.7, 0.9)
COVERAGES = (0.5, 0.8)
GRID = np.linspace(0.05, 1.0, 20)  # coverages of the plotted curve


def _answered_at(conf: np.ndarray, t: float) -> np.ndarray:
    return conf >= t - 1e-12  # [n] bool; a float32 0.7 reads 0.69999...


def threshold_values(conf: np.ndarray, correct: np.ndarray, t: float, counts: np.ndarray | None = None):
    """(accuracy, coverage) of answering where conf >= t: scalars, or [B] over resample counts [n, B]."""
    ans = _answered_at(conf, t).astype(np.float64)
    if counts is None:
        k = ans.sum()
        return (float((ans * correct).sum() / k) if k else float("nan")), float(ans.mean())
    k = ans @ counts  # [B]
    with np.errstate(invalid="ignore", divide="ignore"):
        acc = ((ans * correct) @ counts) / k
    return np.where(k > 0, acc, np.nan), k / counts.sum(0)


def coverage_values(conf: np.ndarray, correct: np.ndarray, c: float, counts: np.ndarray | None = None):
    """Accuracy of the ceil(c n) most confident answers: a scalar, or [B] over resample counts [n, B]."""
    n = len(conf)
    if n == 0:
        return float("nan") if counts is None else np.full(counts.shape[1], np.nan)
    order = np.argsort(-conf, kind="stable")  # most confident first, ties in question order
    if counts is None:
        return float(correct[order[: math.ceil(c * n - 1e-9)]].mean())
    cnt = counts[order]  # [n, B]
    k = np.ceil(c * cnt.sum(0) - 1e-9)  # [B] draws answered (a bootstrap resample has n draws)
    before = np.cumsum(cnt, axis=0) - cnt
    taken = np.clip(k - before, 0.0, cnt)  # how many draws of each question are answered
    return (correct[order] @ taken) / k


def _confidence_correct(agg: np.ndarray, label: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    agg = np.asarray(agg, dtype=np.float64)
    return agg.max(-1), (agg.argmax(-1) == np.asarray(label)).astype(np.float64)


def _columns() -> list[Column]:
    cols = []
    for t in THRESHOLDS:
        cols.append(Column(f"acc@p>={t:g}", f"ACC p≥{t:g}", True, 100.0, 2))
        cols.append(Column(f"cov@p>={t:g}", f"Cov p≥{t:g}", None, 100.0, 1))
    cols += [Column(f"acc@cov={c:g}", f"ACC @{c:.0%}", True, 100.0, 2) for c in COVERAGES]
    return cols


def _cells(forecasts: list[tuple[np.ndarray, np.ndarray]], counts: np.ndarray) -> dict[str, Cell]:
    """Cells of one row from its per-seed (confidence, correct) pairs."""
    out: dict[str, Cell] = {}
    for t in THRESHOLDS:
        point = [threshold_values(cf, ok, t) for cf, ok in forecasts]
        res = [threshold_values(cf, ok, t, counts) for cf, ok in forecasts]
        for j, key in enumerate((f"acc@p>={t:g}", f"cov@p>={t:g}")):
            draws = seed_mean(np.stack([r[j] for r in res]))
            out[key] = Cell(summarize([p[j] for p in point]), boot=percentile_interval(draws))
    for c in COVERAGES:
        point = [coverage_values(cf, ok, c) for cf, ok in forecasts]
        draws = seed_mean(np.stack([coverage_values(cf, ok, c, counts) for cf, ok in forecasts]))
        out[f"acc@cov={c:g}"] = Cell(summarize(point), boot=percentile_interval(draws))
    return out


def selective_table(ev: ScenarioEval) -> Table | None:
    """Accuracy–coverage of every agent and every method of one scenario (None without test questions)."""
    s = ev.data.scenario
    counts = ev.counts["all"]
    if len(s.label) == 0 or s.soft_target:
        return None  # soft targets (BayesX) have no right answer to count
    rows = []
    for i, model in enumerate(s.agents):
        cells = _cells([_confidence_correct(s.probs[:, i], s.label)], counts)
        rows.append(Row(f"Agent {i + 1}: {model}", "individual", cells))
    own = set(ev.own_agents)
    for method, by_seed in ev.runs.items():
        seeds = sorted(by_seed)
        runs = ev.data.runs[method]
        forecasts = [_confidence_correct(runs[seed].agg_probs, s.label) for seed in seeds]
        group = "calibrated" if method in own else runs[seeds[0]].group
        rows.append(Row(runs[seeds[0]].display, group, _cells(forecasts, counts), method))
    n = len(s.label)
    title = f"{s.name}: selective answers (accuracy–coverage, all test questions)"
    caption = f"Scenario {s.name} · dataset {s.dataset} · N = {n} test questions · seeds: " + (
        ", ".join(str(x) for x in ev.seeds) or "none"
    )
    notes = [
        "Confidence = the forecast's top probability (the pooled one for a method). ACC p≥t: accuracy on the "
        "questions answered at confidence ≥ t (– where none is); Cov p≥t: the share answered; ACC @c: "
        "accuracy of the ceil(c·N) most confident answers. Values ×100: mean ± 95% CI over seeds, then "
        "[lo, hi] the 95% interval over the test questions (the scenario's paired resamples). Thresholds "
        f"{', '.join(f'{t:g}' for t in THRESHOLDS)} and coverages "
        f"{', '.join(f'{c:.0%}' for c in COVERAGES)} are fixed in evaluate/selective.py; no marks. A question "
        "interval is shown where every resample answers a question (at a high t some answer none)."
    ]
    return Table("selective", s.name, title, caption, _columns(), rows, bold=False, notes=notes)


def selective_curves(ev: ScenarioEval) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Display label -> (coverage grid, seed-mean accuracy of the most confident answers at each)."""
    s = ev.data.scenario
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    if len(s.label) == 0 or s.soft_target:
        return out
    for method, by_seed in ev.runs.items():
        runs = ev.data.runs[method]
        seeds = sorted(by_seed)
        accs = [
            [coverage_values(*_confidence_correct(runs[seed].agg_probs, s.label), c) for c in GRID]
            for seed in seeds
        ]
        out[runs[seeds[0]].display] = (GRID, np.mean(np.asarray(accs), axis=0))
    return out
