"""Did a head learn its advantage? The augmented WALLA heads' diagnostics as a table (SPEC §5.3).

    table = diagnostics_table(ev)     # None unless a run saved pred_score / pred_baseline (walla-i-aug)

`walla_v1_augmented` trains, beside each agent's wager head, two heads of the same shape that predict the
agent's own score s_i and its leave-one-out baseline b_-i; they never touch a wager. On the test questions
each row (one agent of one such method) shows, as mean ± 95% t-interval over seeds:

* r(ŝ, s): Pearson r of the predicted and realized own score;
* r(b̂, b): the same for the baseline (realized b_-i = s_i - realized advantage, under the eval wagers);
* r(ŝ - b̂, d): predicted advantage vs realized advantage d_i = s_i - b_-i;
* r(w, d): the learned wager vs the realized advantage (what the wager head itself learned);
* MAE(ŝ - b̂, d): mean absolute error of the predicted advantage (score units).

A head that learned nothing reads r ≈ 0; the realized advantage is noisy per question, so r well below 1
is expected even for a good head.
"""

from __future__ import annotations

import numpy as np
import torch
from walla.evaluate.aggregate import summarize
from walla.evaluate.plots import _consts, pearson
from walla.evaluate.scenario_eval import ScenarioEval
from walla.evaluate.tables import Cell, Column, Row, Table
from walla.train.mechanism import brier_score

NEED = ("wagers", "advantage", "pred_score", "pred_baseline")
COLUMNS = (
    ("r_score", "r(ŝ, s)", 1.0, 3),
    ("r_baseline", "r(b̂, b)", 1.0, 3),
    ("r_adv", "r(ŝ−b̂, d)", 1.0, 3),
    ("r_wager", "r(w, d)", 1.0, 3),
    ("mae_adv", "MAE(ŝ−b̂, d)", 100.0, 2),
)


def _own_scores(run, s) -> np.ndarray:
    probs = run.agent_probs if run.agent_probs is not None else s.probs  # [N, M, K]
    c1, c2 = _consts(run)
    target = np.broadcast_to(s.target[:, None, :], probs.shape)
    return brier_score(
        torch.from_numpy(np.ascontiguousarray(probs, dtype=np.float64)),
        torch.from_numpy(np.ascontiguousarray(target, dtype=np.float64)),
        c1=c1,
        c2=c2,
    ).numpy()  # [N, M]


def run_diagnostics(run, s) -> dict[str, np.ndarray]:
    """Per agent [M] values of every column for one seed's run."""
    own = _own_scores(run, s)
    ex = {k: np.asarray(run.extras[k], dtype=np.float64) for k in NEED}
    adv, ps, pb, w = ex["advantage"], ex["pred_score"], ex["pred_baseline"], ex["wagers"]
    base = own - adv
    m = own.shape[1]
    return {
        "r_score": np.array([pearson(ps[:, i], own[:, i]) for i in range(m)]),
        "r_baseline": np.array([pearson(pb[:, i], base[:, i]) for i in range(m)]),
        "r_adv": np.array([pearson(ps[:, i] - pb[:, i], adv[:, i]) for i in range(m)]),
        "r_wager": np.array([pearson(w[:, i], adv[:, i]) for i in range(m)]),
        "mae_adv": np.abs((ps - pb) - adv).mean(0),
    }


def diagnostics_table(ev: ScenarioEval) -> Table | None:
    s = ev.data.scenario
    cols = [Column(k, label, None, scale, dec) for k, label, scale, dec in COLUMNS]
    rows = []
    for method, by_seed in ev.data.runs.items():
        seeds = [r for seed, r in sorted(by_seed.items()) if seed in ev.runs.get(method, {})]
        if not seeds or not all(all(k in r.extras for k in NEED) for r in seeds):
            continue
        per_seed = [run_diagnostics(r, s) for r in seeds]
        for i, model in enumerate(s.agents):
            cells = {k: Cell(summarize([d[k][i] for d in per_seed])) for k, *_ in COLUMNS}
            rows.append(Row(f"{seeds[0].display} · agent {i + 1}: {model}", "walla", cells, method))
    if not rows:
        return None
    title = f"{s.name}: augmented heads' diagnostics (did each head learn its advantage?)"
    caption = f"Scenario {s.name} · N = {len(s.label)} test questions · seeds: " + ", ".join(
        str(x) for x in ev.seeds
    )
    note = (
        "Per agent, test questions, mean ± 95% CI over seeds: Pearson r of the diagnostic heads' predicted own "
        "score ŝ and baseline b̂ with the realized s and b (under the eval wagers), of their difference with the "
        "realized advantage d = s − b, and of the learned wager w with d; MAE ×100 in score units. The "
        "diagnostic heads never influence a wager (SPEC §5.3)."
    )
    return Table(
        "diagnostics", s.name, title, caption, cols, rows, bold=False, group_rows=False, notes=[note]
    )
