"""Question intervals and significance marks of one table, from its cells' bootstrap resamples.

Every cell of a metric table carries the seed mean of its metric on the same B question resamples
(bootstrap.py). Here, per column:
* the cell's question interval: the percentile interval of those B values;
* its paired difference to UniformAvg (mark †) and to the column's best baseline (mark ‡): the
  percentile interval of (row - reference) over the B resamples; the mark is shown when that interval
  excludes 0. A row compared with itself differs by exactly 0 on every resample and is never marked.
The best baseline of a column is the learning-free or learning-based row (no individual agent, no WALLA
row) with the best seed mean in the column's direction. Columns without a direction (Inv. HHI) get
intervals but no marks, and so do cells scored against other agent probabilities than the rest of the
column (`Cell.comparable`, the calibrated block) or not shown (UniformAvg's MRR).
"""

from __future__ import annotations

from walla.evaluate.bootstrap import (
    LEVEL,
    N_RESAMPLES,
    RESAMPLE_SEED,
    difference_interval,
    percentile_interval,
)
from walla.evaluate.tables import MARKS, Cell, Column, Table, cell_value

REFERENCE_METHOD = "uniform"  # the † reference (UniformAvg)
BASELINE_GROUPS = ("learning_free", "learning_based")  # candidates for the ‡ reference


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
    """Index of the baseline row with the best seed mean in `col` (first one on ties); None without one."""
    best, best_value = None, None
    for i, row in enumerate(table.rows):
        cell = row.cells.get(col.key)
        if row.group not in BASELINE_GROUPS or not _comparable(cell, col):
            continue
        value = cell.summary.mean if col.higher_is_better else -cell.summary.mean
        if best_value is None or value > best_value:
            best, best_value = i, value
    return best


def annotate(table: Table, questions: str) -> None:
    """Fill every cell's question interval and paired differences, record each column's best baseline,
    and add the note that explains the brackets and marks. `questions`: what was resampled
    ("the 140 test questions"). A table without resamples (an empty subset) is left as it is."""
    if not any(c.resamples is not None for row in table.rows for c in row.cells.values()):
        return
    for col in table.columns:
        for row in table.rows:
            cell = row.cells.get(col.key)
            if cell is not None and cell.resamples is not None and cell_value(cell, col) is not None:
                cell.boot = percentile_interval(cell.resamples)
        if col.higher_is_better is None:
            continue
        references = {"uniform": reference_row(table, col), "best": best_baseline(table, col)}
        if references["best"] is not None:
            table.baselines[col.key] = table.rows[references["best"]].label
        for row in table.rows:
            cell = row.cells.get(col.key)
            if not _comparable(cell, col):
                continue
            for key, j in references.items():
                if j is not None:
                    reference = table.rows[j].cells[col.key].resamples
                    interval = difference_interval(cell.resamples, reference)
                    if interval is not None:
                        cell.vs[key] = interval
    missing = any(
        c.resamples is not None and c.boot is None and cell_value(c, col) is not None
        for row in table.rows
        for col in table.columns
        if (c := row.cells.get(col.key)) is not None
    )
    table.notes.append(bootstrap_note(table, questions, missing))


def bootstrap_note(table: Table, questions: str, missing: bool = False) -> str:
    """What the brackets and the marks mean, with the resample count, seed and each column's baseline;
    `missing`: some shown cell has no brackets (its metric is undefined on some resample)."""
    pct = f"{100 * LEVEL:g}%"
    baselines = ", ".join(
        f"{c.label} {table.baselines[c.key]}" for c in table.columns if c.key in table.baselines
    )
    uniform = any(row.method == REFERENCE_METHOD for row in table.rows)
    return (
        f"[lo, hi]: {pct} percentile interval from a paired bootstrap over {questions} ({N_RESAMPLES} "
        f"resamples with replacement, numpy default_rng({RESAMPLE_SEED}); on each resample the metric is "
        "computed per seed and averaged over seeds; every row uses the same resamples). "
        f"{MARKS['uniform']} : the {pct} paired-bootstrap interval of the difference to UniformAvg excludes 0"
        + ("" if uniform else " (no UniformAvg row here)")
        + f"; {MARKS['best']} : the same vs the column's best baseline, the learning-free or learning-based "
        "row with the best mean in the column's direction"
        + (f" ({baselines})" if baselines else " (none here)")
        + ". A mark says the difference is larger than the questions' sampling noise, in either direction; it "
        "holds the trained seeds fixed, so a marked difference inside the seed intervals (±) is still within "
        "training noise."
        + (
            " No brackets: the metric is undefined on some resample (e.g. AUC when every drawn prediction is "
            "right), so neither an interval nor a mark is given."
            if missing
            else ""
        )
    )
