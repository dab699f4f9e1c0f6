"""Question intervals and significance marks of one table, from its cells' bootstrap resamples.

Every cell of a metric table carries the seed mean of its metric on the same B question resamples
(bootstrap.py). Here, per column:
* the cell's question interval: the percentile interval of those B values (a calibration error:
  `bootstrap.calibration_interval`, bias-corrected and reaching 0 where calibration cannot be ruled out);
* its paired difference to UniformAvg (mark †) and to the column's ‡ reference: the unadjusted 95%
  percentile interval of (row - reference) over the B resamples (kept in the CSV), and a simultaneous
  interval over the column's FAMILY, every (row, reference) pair compared in that column of that table:
  a max-statistic bootstrap (`bootstrap.max_t_critical`) keeps the chance of any false mark in the
  family at 5% or less. A mark is shown when both intervals exclude 0.
The ‡ reference is chosen without the test questions: the learning-free or learning-based row (no
individual agent, no WALLA row) with the best seed mean on the scenario's VALIDATION questions, in the
column's direction; a scenario without validation questions gets no ‡. Columns without a direction
(Inv. HHI) get intervals but no marks, and so do cells scored against other agent probabilities than the
rest of the column (`Cell.comparable`, the calibrated block) or not shown (UniformAvg's MRR). The marks'
error rates are checked by simulation (tests/evaluate/test_eval_simulation.py).
"""

from __future__ import annotations

import math

import numpy as np
from walla.evaluate.bootstrap import (
    DRAW_SEED,
    LEVEL,
    N_RESAMPLES,
    RESAMPLE_SEED,
    Interval,
    calibration_interval,
    difference_interval,
    max_t_critical,
    percentile_interval,
)
from walla.evaluate.metrics import METRICS
from walla.evaluate.tables import MARKS, Cell, Column, Table, cell_value

REFERENCE_METHOD = "uniform"  # the † reference (UniformAvg)
BASELINE_GROUPS = ("learning_free", "learning_based")  # candidates for the ‡ reference
MULTIPLICITY_RULE = (
    f"marks control the family-wise error at {100 * (1 - LEVEL):g}% per column of a table (the family: every "
    "row compared in that column, against UniformAvg and against the ‡ reference) by a max-statistic "
    "bootstrap over the rows' paired differences"
)
REFERENCE_RULE = (
    "per column, the learning-free or learning-based baseline with the best mean on the validation "
    "questions (never on the test questions); no ‡ without a validation split"
)


def _comparable(cell: Cell | None, col: Column) -> bool:
    """A cell that shows a number, has resamples and is scored like the rest of its column."""
    return (
        cell is not None
        and cell.comparable
        and cell.resamples is not None
        and cell_value(cell, col) is not None
    )


def reference_row(table: Table, col: Column) -> int | None:
    """Index of the UniformAvg row when its cell in `col` can be compared with."""
    for i, row in enumerate(table.rows):
        if row.method == REFERENCE_METHOD and _comparable(row.cells.get(col.key), col):
            return i
    return None


def best_baseline(table: Table, col: Column) -> int | None:
    """Index of the baseline row with the best VALIDATION seed mean in `col` (first one on ties); None
    without a baseline that has a finite validation value (no validation split)."""
    best, best_value = None, None
    for i, row in enumerate(table.rows):
        score = row.validation.get(col.key, math.nan)
        if row.group not in BASELINE_GROUPS or not _comparable(row.cells.get(col.key), col):
            continue
        if not math.isfinite(score):
            continue
        value = score if col.higher_is_better else -score
        if best_value is None or value > best_value:
            best, best_value = i, value
    return best


def question_interval(cell: Cell, col: Column) -> Interval | None:
    """The cell's interval over question resamples (see the module docstring)."""
    info = METRICS.get(col.key)
    if info is not None and info.calibrated_draws is not None:
        return calibration_interval(cell.resamples, cell.summary.mean, cell.draws)
    return percentile_interval(cell.resamples)


def mark_column(table: Table, col: Column, references: dict[str, int | None]) -> None:
    """Unadjusted and simultaneous difference intervals of every comparable row to each reference, and
    the marks that survive the column's family-wise control."""
    family: list[tuple[Cell, str, float, np.ndarray]] = []  # (cell, reference key, observed, resamples)
    for row in table.rows:
        cell = row.cells.get(col.key)
        if not _comparable(cell, col):
            continue
        for key, j in references.items():
            if j is None:
                continue
            ref = table.rows[j].cells[col.key]
            interval = difference_interval(cell.resamples, ref.resamples)
            if interval is None:
                continue
            cell.vs[key] = interval
            diff = cell.resamples - ref.resamples
            if np.ptp(diff) > 0:  # a difference equal on every resample (a row vs itself) is not tested
                family.append((cell, key, cell.summary.mean - ref.summary.mean, diff))
    if not family:
        return
    observed = np.array([f[2] for f in family])
    diffs = np.stack([f[3] for f in family])
    crit = max_t_critical(observed, diffs)
    se = diffs.std(axis=1, ddof=1)
    for (cell, key, d, _), s in zip(family, se, strict=True):
        cell.sim[key] = simultaneous = Interval(float(d - crit * s), float(d + crit * s))
        if simultaneous.excludes_zero and cell.vs[key].excludes_zero:
            cell.significant.add(key)


def annotate(table: Table, questions: str, validation: str | None = None) -> None:
    """Fill every cell's question interval and paired differences, record each column's ‡ reference,
    and add the note that explains the brackets and marks. `questions`: what was resampled ("the 140 test
    questions"); `validation`: the questions the ‡ reference is chosen on ("the 60 validation questions"),
    or why there is none. A table without resamples (an empty subset) is left as it is."""
    if not any(c.resamples is not None for row in table.rows for c in row.cells.values()):
        return
    for col in table.columns:
        for row in table.rows:
            cell = row.cells.get(col.key)
            if cell is not None and cell.resamples is not None and cell_value(cell, col) is not None:
                cell.boot = question_interval(cell, col)
        if col.higher_is_better is None:
            continue
        references = {"uniform": reference_row(table, col), "best": best_baseline(table, col)}
        if references["best"] is not None:
            table.baselines[col.key] = table.rows[references["best"]].label
        mark_column(table, col, references)
    missing = any(
        c.resamples is not None and c.boot is None and cell_value(c, col) is not None
        for row in table.rows
        for col in table.columns
        if (c := row.cells.get(col.key)) is not None
    )
    table.notes.append(bootstrap_note(table, questions, validation, missing))


def bootstrap_note(table: Table, questions: str, validation: str | None, missing: bool = False) -> str:
    """What the brackets and the marks mean: the resample count and seed, the family each mark controls
    and how each column's ‡ reference was chosen (and which it is); `missing`: some shown cell has no
    brackets (its metric is undefined on some resample)."""
    pct = f"{100 * LEVEL:g}%"
    references = ", ".join(
        f"{c.label} {table.baselines[c.key]}" for c in table.columns if c.key in table.baselines
    )
    uniform = any(row.method == REFERENCE_METHOD for row in table.rows)
    calibration = [c.label for c in table.columns if (i := METRICS.get(c.key)) and i.calibrated_draws]
    if validation is None:
        chosen = "no ‡: this scenario has no validation questions to choose the reference on"
    else:
        chosen = (
            f"{MARKS['best']} : the same against the column's reference, the learning-free or learning-based "
            f"baseline with the best mean on {validation} (chosen without the test questions)"
            + (f": {references}" if references else ": none here")
        )
    return (
        f"[lo, hi]: {pct} percentile interval from a paired bootstrap over {questions} ({N_RESAMPLES} "
        f"resamples with replacement, numpy default_rng({RESAMPLE_SEED}); on each resample the metric is "
        "computed per seed and averaged over seeds; every row uses the same resamples)"
        + (
            f"; {', '.join(calibration)} is the debiased binned estimator (Kumar et al. 2019), its interval "
            "the resamples centred on the estimate, with lower end 0 when the estimate is within what a "
            "perfectly calibrated predictor with the same confidences shows in 95% of label draws "
            f"({N_RESAMPLES} draws, numpy default_rng({DRAW_SEED}))"
            if calibration
            else ""
        )
        + f". {MARKS['uniform']} : the row differs from UniformAvg"
        + ("" if uniform else " (no UniformAvg row here)")
        + f"; {chosen}. A mark is shown when the difference's simultaneous {pct} interval over the column's "
        "family excludes 0 (max-statistic bootstrap over the paired differences), and so does its "
        "unadjusted interval (in the CSV); the family is every row compared in this column against either "
        "reference, so the chance of any false mark in a column is at most 5%. Direction is either way; "
        "the marks hold the trained seeds fixed, so a marked difference inside the seed intervals (±) is "
        "still within training noise."
        + (
            " No brackets: the metric is undefined on some resample (e.g. AUC when every drawn prediction is "
            "right), so neither an interval nor a mark is given."
            if missing
            else ""
        )
    )
