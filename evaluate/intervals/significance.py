"""Question intervals and significance marks of one table, from its cells' bootstrap resamples.

Every cell of a metric table carries the seed mean of its metric on the same B question resamples
(bootstrap.py). Here, per column:
* the cell's question interval: the percentile interval of those B values (a calibration error:
  `bootstrap.calibration_interval`, which allows for the estimator's bias and reaches 0 where
  calibration cannot be ruled out);
* its paired difference to UniformAvg (mark †) and to the column's ‡ reference: the unadjusted 95%
  percentile interval of (row - reference) over the B resamples (kept in the CSV), and a simultaneous
  interval over the column's FAMILY, every (row, reference) pair compared in that column of that table:
  a max-statistic bootstrap read on Student's t, with standard errors taken about 0
  (`bootstrap.simultaneous_bounds`), keeps the chance of any false mark in the family at 5% or less.
  A mark is shown when both intervals exclude 0 (`family_marks`, which the simulations call too).
The ‡ reference is chosen without the test questions: the learning-free or learning-based row (no
individual agent, no WALLA row) with the best seed mean on the scenario's VALIDATION questions, in the
column's direction; a scenario without validation questions gets no ‡. Columns without a direction
(Inv. HHI) get intervals but no marks, and so do cells scored against other agent probabilities than the
rest of the column (`Cell.comparable`, the calibrated block) or not shown (UniformAvg's MRR). The marks'
error rate, their power and the ECE interval's coverage are checked by simulation (evaluate/intervals/simulate.py:
tests/evaluate/test_eval_simulation.py, benchmarks/marks_coverage.py).
"""

from __future__ import annotations

import math

import numpy as np
from walla.evaluate.intervals.bootstrap import (
    DRAW_SEED,
    LEVEL,
    N_RESAMPLES,
    RESAMPLE_SEED,
    Interval,
    calibration_interval,
    difference_interval,
    percentile_bounds,
    percentile_interval,
    power_difference,
    simultaneous_bounds,
)
from walla.evaluate.metrics import METRICS
from walla.evaluate.tables import MARKS, Cell, Column, Table, cell_value

REFERENCE_METHOD = "uniform"  # the † reference (UniformAvg)
BASELINE_GROUPS = ("learning_free", "learning_based")  # candidates for the ‡ reference
MULTIPLICITY_RULE = (
    f"marks control the family-wise error at {100 * (1 - LEVEL):g}% per column of a table (the family: every "
    "row compared in that column, against UniformAvg and against the ‡ reference) by a max-statistic "
    "bootstrap over the rows' paired differences, read on Student's t with standard errors taken about 0"
)
FWER_CLAIM = (  # what benchmarks/marks_coverage.py and tests/evaluate/test_eval_simulation.py check
    "5% (simulated on null tables of 140 and 1000 questions, independent and correlated rows)"
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


def family_marks(
    observed: np.ndarray, differences: np.ndarray, n: int, valid: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The marks of one column's family, or of a batch of families: observed [..., H] differences,
    their resamples [..., H, B], n questions, valid [..., H] (False: not in the family) -> (marked,
    sim_lo, sim_hi) [..., H]; a difference equal on every resample (a row against itself) is not tested
    (NaN bounds, never marked). A difference is marked when its simultaneous interval
    (`bootstrap.simultaneous_bounds`) and its unadjusted percentile interval both exclude 0. The tables
    (`mark_column`) and the simulations of benchmarks/marks_coverage.py both call this."""
    lo, hi = simultaneous_bounds(observed, differences, n, valid)  # NaN: not tested (never marked)
    marked = (lo > 0) | (hi < 0)
    plo, phi = percentile_bounds(differences[marked])  # the unadjusted interval, where it can matter
    marked[marked] = (plo > 0) | (phi < 0)
    return marked, lo, hi


def mark_column(table: Table, col: Column, references: dict[str, int | None], n: int) -> float | None:
    """Unadjusted and simultaneous difference intervals of every comparable row to each reference, and
    the marks that survive the column's family-wise control; -> the difference the family detects with
    80% power (`bootstrap.power_difference`), None without a family."""
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
        return None
    observed = np.array([f[2] for f in family])
    diffs = np.stack([f[3] for f in family])
    marked, lo, hi = family_marks(observed, diffs, n)
    for (cell, key, _, _), m, a, b in zip(family, marked, lo, hi, strict=True):
        cell.sim[key] = Interval(float(a), float(b))
        if m:
            cell.significant.add(key)
    return power_difference(observed, diffs, n)


def annotate(table: Table, questions: str, validation: str | None = None, *, n: int) -> None:
    """Fill every cell's question interval and paired differences, record each column's ‡ reference,
    and add the note that explains the brackets and marks. `questions`: what was resampled ("the 140 test
    questions"); `validation`: the questions the ‡ reference is chosen on ("the 60 validation questions"),
    or why there is none; `n`: how many questions were resampled (the marks' small-sample correction).
    A table without resamples (an empty subset) is left as it is."""
    if not any(c.resamples is not None for row in table.rows for c in row.cells.values()):
        return
    power: dict[str, float] = {}  # column label -> the difference its family detects 80% of the time
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
        detectable = mark_column(table, col, references, n)
        if detectable is not None and math.isfinite(detectable):
            power[col.label] = round(detectable * col.scale, col.decimals)
    missing = any(
        c.resamples is not None and c.boot is None and cell_value(c, col) is not None
        for row in table.rows
        for col in table.columns
        if (c := row.cells.get(col.key)) is not None
    )
    table.power = power
    table.notes.append(bootstrap_note(table, questions, validation, missing, power))


def bootstrap_note(
    table: Table,
    questions: str,
    validation: str | None,
    missing: bool = False,
    power: dict[str, float] | None = None,
) -> str:
    """What the brackets and the marks mean: the resample count and seed, the family each mark controls
    and how each column's ‡ reference was chosen (and which it is); `missing`: some shown cell has no
    brackets (its metric is undefined on some resample); `power`: column label -> the difference (display
    scale) its family detects 80% of the time."""
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
            f"; {', '.join(calibration)} is the debiased binned estimator (Kumar et al. 2019), which still "
            "reads high on few questions (a perfectly calibrated predictor reads about 5 with 2 options and 7 "
            "with 4 on 140 questions, 2 on 1000); its interval runs from the estimate less what a perfectly "
            "calibrated predictor with the same confidences reads in 97.5% of label draws (0 when the "
            f"estimate is within that; {N_RESAMPLES} draws, numpy default_rng({DRAW_SEED})) to the "
            "resamples' 99th percentile centred on the estimate"
            if calibration
            else ""
        )
        + f". {MARKS['uniform']} : the row differs from UniformAvg"
        + ("" if uniform else " (no UniformAvg row here)")
        + f"; {chosen}. A mark is shown when the difference's simultaneous {pct} interval over the column's "
        "family excludes 0 (max-statistic bootstrap over the paired differences, its critical value read on "
        "Student's t, each standard error taken about 0), "
        "and so does its unadjusted interval (in the CSV); the family is every row compared in this column "
        f"against either reference, so the chance of any false mark in a column is at most {FWER_CLAIM}. "
        + (
            f"Power: with {questions} a true difference of about "
            + ", ".join(f"{label} {value:g}" for label, value in power.items())
            + " is marked 80% of the time or more (the column's median standard error x (critical value + "
            "0.84)); smaller ones mostly go unmarked. "
            if power
            else ""
        )
        + "Direction is either way; "
        "the marks hold the trained seeds fixed, so a marked difference inside the seed intervals (±) is "
        "still within training noise."
        + (
            " No brackets: the metric is undefined on some resample (e.g. AUC when every drawn prediction is "
            "right), so neither an interval nor a mark is given."
            if missing
            else ""
        )
    )
