"""Paper-layout tables: a small table model and its Markdown, LaTeX (booktabs) and CSV renderings.

The report recipe (`report.py`, through `scenario_tables.py`) fills `Table`s with `Summary`s (mean, 95% CI
over seeds) and, from the bootstrap over questions (`intervals/significance.py`), a question interval and
paired-difference intervals per cell; this module only formats: the display scale (x100),
`mean ± CI [lo, hi]` with 2 decimals, the significance marks († ‡), bold for the best aggregation method
per column (individual agents are references, not candidates; the paper's tables bold nothing, we add
it), "–" plus a footnote for undefined cells, group separators in the paper's row order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from walla.evaluate.aggregate import Summary
from walla.evaluate.intervals.bootstrap import Interval

GROUP_TITLES = {
    "individual": "Individual agents",
    "learning_free": "Learning-free baselines",
    "learning_based": "Learning-based baselines",
    "walla": "WALLA",
    "calibrated": "Scored against its own recalibrated agents",
}
MARKS = {"uniform": "†", "best": "‡"}  # family-wise significant difference to UniformAvg / the ‡ reference
NOTES = {  # footnote per reason a cell shows "–" (or a marker)
    "undefined": "– : undefined on every seed (e.g. AUC when all test predictions are right, or all wrong).",
    "uniform": "– (MRR): equal weights rank the agents by slot order only (SPEC §10.10), so MRR is not shown.",
    "partial": "° : undefined on some seeds; mean and CI over the remaining seeds.",
    "empty": "– : no question in this subset.",
}
DASH = "–"


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    higher_is_better: bool | None = None
    scale: float = 100.0
    decimals: int = 2
    span: str | None = None  # header group above the column (wagers table: the method)


@dataclass
class Cell:
    summary: Summary | None = None  # None: not applicable (blank)
    note: str | None = None  # a NOTES key: the cell shows "–" and the footnote explains why
    resamples: np.ndarray | None = field(default=None, repr=False)  # [B] seed mean per question resample
    draws: np.ndarray | None = field(default=None, repr=False)  # [B] calibrated label draws (ECE only)
    boot: Interval | None = None  # interval over question resamples
    vs: dict[str, Interval] = field(default_factory=dict)  # MARKS key -> unadjusted 95% interval of the
    # paired difference
    sim: dict[str, Interval] = field(default_factory=dict)  # MARKS key -> simultaneous (family-wise) interval
    significant: set[str] = field(
        default_factory=set
    )  # MARKS keys whose mark is shown (intervals/significance.py)
    comparable: bool = True  # False: scored against other agents than the column's other rows

    @property
    def marks(self) -> str:
        return "".join(m for key, m in MARKS.items() if key in self.significant)


@dataclass
class Row:
    label: str
    group: str
    cells: dict[str, Cell]
    method: str | None = None  # registry method of the row's runs (None: an individual agent)
    validation: dict[str, float] = field(default_factory=dict)  # metric -> seed mean on the validation
    # questions (baseline rows of scenarios with a validation split: how the ‡ reference is chosen)


@dataclass
class Table:
    key: str  # "main" | "hard" | "other" | "wagers" (file/label suffix)
    scenario: str
    title: str
    caption: str  # what the table shows: scenario, dataset, agents, N, seeds, store fingerprints
    columns: list[Column]
    rows: list[Row]
    bold: bool = True
    group_rows: bool = True  # separator rows between method groups
    notes: list[str] = field(default_factory=list)  # fixed notes printed under the table
    baselines: dict[str, str] = field(default_factory=dict)  # column key -> label of its ‡ reference row
    power: dict[str, float] = field(default_factory=dict)  # column label -> difference found 80% of the time


# ----------------------------------------------------------------------------------------- cells


def _shown(cell: Cell | None) -> bool:
    return cell is not None and cell.summary is not None and cell.note is None and cell.summary.defined


def cell_value(cell: Cell | None, col: Column) -> float | None:
    """The mean as displayed (scaled and rounded), or None when the cell shows no number."""
    if not _shown(cell):
        return None
    return round(cell.summary.mean * col.scale, col.decimals)


@dataclass(frozen=True)
class CellText:
    mean: str  # "" (blank) or "–" (noted) when the cell shows no number
    ci: str | None = None  # seed interval half-width
    boot: str | None = None  # "[lo, hi]" question interval
    marks: str = ""  # † ‡ (significance) and ° (partial)


def cell_parts(cell: Cell | None, col: Column) -> CellText:
    """The texts one cell is drawn from, scaled and rounded for display."""
    if cell is None or (cell.summary is None and cell.note is None):
        return CellText("")
    if cell.note is not None or not cell.summary.defined:
        return CellText(DASH)
    s = cell.summary.scaled(col.scale)
    d = col.decimals
    ci = None if s.ci is None else f"{s.ci:.{d}f}"
    boot = (
        None if cell.boot is None else f"[{cell.boot.lo * col.scale:.{d}f}, {cell.boot.hi * col.scale:.{d}f}]"
    )
    return CellText(f"{s.mean:.{d}f}", ci, boot, cell.marks + ("°" if s.partial else ""))


def cell_note(cell: Cell | None) -> str | None:
    if cell is None or (cell.summary is None and cell.note is None):
        return None
    if cell.note is not None:
        return cell.note
    if not cell.summary.defined:
        return "undefined"
    return "partial" if cell.summary.partial else None


def best_rows(table: Table) -> dict[str, set[int]]:
    """Column key -> indices of rows holding the best displayed value (ties all bold).

    Candidates are aggregation methods only (group != individual) scored like the rest of the column
    (`Cell.comparable`), and a column needs at least two.
    """
    best: dict[str, set[int]] = {}
    if not table.bold:
        return best
    for col in table.columns:
        if col.higher_is_better is None:
            continue
        vals = {
            i: v
            for i, row in enumerate(table.rows)
            if row.group != "individual"
            and row.cells.get(col.key, Cell()).comparable
            and (v := cell_value(row.cells.get(col.key), col)) is not None
        }
        if len(vals) < 2:
            continue
        target = max(vals.values()) if col.higher_is_better else min(vals.values())
        best[col.key] = {i for i, v in vals.items() if v == target}
    return best


def used_notes(table: Table) -> list[str]:
    keys = {cell_note(row.cells.get(c.key)) for row in table.rows for c in table.columns}
    return [NOTES[k] for k in NOTES if k in keys]


def _arrow(col: Column, up: str, down: str) -> str:
    return "" if col.higher_is_better is None else (" " + (up if col.higher_is_better else down))


def _groups(table: Table):
    """Rows with a flag telling whether a new method group starts there."""
    prev = None
    for i, row in enumerate(table.rows):
        yield i, row, row.group != prev
        prev = row.group


# ----------------------------------------------------------------------------------------- markdown


def to_markdown(table: Table) -> str:
    """GitHub Markdown: title, caption, the table, footnotes."""
    best = best_rows(table)
    headers = ["Method"] + [
        (f"{c.span} {c.label}" if c.span else c.label) + _arrow(c, "↑", "↓") for c in table.columns
    ]
    lines = [f"### {table.title}", "", f"*{table.caption}*", ""]
    lines.append("| " + " | ".join(headers) + " |")
    lines.append("|:--" + "|--:" * len(table.columns) + "|")
    for i, row, new_group in _groups(table):
        if table.group_rows and new_group:
            title = GROUP_TITLES.get(row.group, row.group)
            lines.append(f"| *{title}* |" + " |" * len(table.columns))
        cells = []
        for c in table.columns:
            t = cell_parts(row.cells.get(c.key), c)
            text = t.mean if t.ci is None else f"{t.mean} ± {t.ci}"
            if i in best.get(c.key, ()):
                text = f"**{text}**"
            cells.append(text + ("" if t.boot is None else f" {t.boot}") + t.marks)
        lines.append(f"| {row.label} | " + " | ".join(cells) + " |")
    notes = table.notes + used_notes(table)
    if notes:
        lines.append("")
        lines.extend(f"{n}\\" for n in notes[:-1])  # trailing backslash: a hard line break
        lines.append(notes[-1])
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------- latex

_TEX_ESCAPES = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "–": "--",
    "±": r"$\pm$",
    "×": r"$\times$",
    "§": r"\S{}",
    "†": r"$^\dagger$",
    "‡": r"$^\ddagger$",
    "°": r"$^\circ$",
    "·": r"$\cdot$",
}


_TEX_MARKS = {"†": r"\dagger", "‡": r"\ddagger", "°": r"\circ"}


def _tex_marks(marks: str) -> str:
    r"""'†‡' -> one superscript $^{\dagger\ddagger}$ (two adjacent $...$ would read as $$)."""
    return rf"$^{{{''.join(_TEX_MARKS[m] for m in marks)}}}$" if marks else ""


def tex_escape(text: str) -> str:
    return "".join(_TEX_ESCAPES.get(ch, ch) for ch in text)


def to_latex(table: Table) -> str:
    """A booktabs table* like the paper's: \\tiny{$\\pm$CI}, \\midrule between method groups."""
    best = best_rows(table)
    n = len(table.columns)
    label = tex_escape(f"tab:{table.scenario}-{table.key}").replace(r"\_", "-")
    out = [
        r"\begin{table*}[ht]",
        r"\centering",
        rf"\caption{{{tex_escape(table.title)}. {tex_escape(table.caption)}}}\label{{{label}}}",
        r"\resizebox{1.0\linewidth}{!}{%",
        rf"\begin{{tabular}}{{l*{{{n}}}{{c}}}}",
        r"\toprule",
    ]
    spans: list[tuple[str, int, int]] = []  # (span, first col, last col), 1-based after the row label
    for j, c in enumerate(table.columns, start=2):
        if c.span and spans and spans[-1][0] == c.span and spans[-1][2] == j - 1:
            spans[-1] = (c.span, spans[-1][1], j)
        elif c.span:
            spans.append((c.span, j, j))
    if spans:
        parts, col = [], 2
        for span, a, b in spans:
            parts += [""] * (a - col) + [
                rf"\multicolumn{{{b - a + 1}}}{{c}}{{\textbf{{{tex_escape(span)}}}}}"
            ]
            col = b + 1
        parts += [""] * (n + 2 - col)
        out.append("& " + " & ".join(parts) + r" \\")
        out.append(" ".join(rf"\cmidrule(lr){{{a}-{b}}}" for _, a, b in spans))
    heads = [tex_escape(c.label) + _arrow(c, r"$\uparrow$", r"$\downarrow$") for c in table.columns]
    out.append(r"\textbf{Method} & " + " & ".join(heads) + r" \\")
    out.append(r"\midrule")
    for i, row, new_group in _groups(table):
        if new_group and i > 0:
            out.append(r"\midrule")
        cells = []
        for c in table.columns:
            t = cell_parts(row.cells.get(c.key), c)
            text = tex_escape(t.mean)
            if i in best.get(c.key, ()):
                text = rf"\textbf{{{text}}}"
            if t.ci is not None:
                text += rf"\tiny{{$\pm${t.ci}}}"
            if t.boot is not None:
                text += rf"\,\tiny{{{t.boot}}}"
            cells.append(text + _tex_marks(t.marks))
        out.append(tex_escape(row.label) + " & " + " & ".join(cells) + r" \\")
    out += [r"\bottomrule", r"\end{tabular}%", "}"]
    notes = table.notes + used_notes(table)
    if notes:
        out.append(r"\par\smallskip{\footnotesize " + r" \\ ".join(tex_escape(x) for x in notes) + "}")
    out.append(r"\end{table*}")
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------------------- csv

CSV_FIELDS = [
    "scenario",
    "table",
    "row",
    "group",
    "column",
    "metric",
    "mean",
    "ci",
    "n",
    "n_seeds",
    "scale",
    "bold",
    "note",
    "boot_lo",
    "boot_hi",
    "vs_uniform_lo",
    "vs_uniform_hi",
    "vs_uniform_sim_lo",
    "vs_uniform_sim_hi",
    "vs_uniform_sig",
    "best_baseline",
    "vs_best_lo",
    "vs_best_hi",
    "vs_best_sim_lo",
    "vs_best_sim_hi",
    "vs_best_sig",
]


def _interval_fields(prefix: str, interval: Interval | None, scale: float) -> dict:
    if interval is None:
        return {f"{prefix}_lo": "", f"{prefix}_hi": ""}
    return {f"{prefix}_lo": repr(interval.lo * scale), f"{prefix}_hi": repr(interval.hi * scale)}


def _difference_fields(name: str, cell: Cell, scale: float) -> dict:
    interval = cell.vs.get(name)
    sig = "" if interval is None else int(name in cell.significant)
    return {
        **_interval_fields(f"vs_{name}", interval, scale),
        **_interval_fields(f"vs_{name}_sim", cell.sim.get(name), scale),
        f"vs_{name}_sig": sig,
    }


def to_csv_rows(table: Table) -> list[dict]:
    """One record per (row, column): the scaled mean and CI as shown (unrounded), plus why a cell is blank;
    the question interval and the paired differences to UniformAvg and to the ‡ reference (scaled): their
    unadjusted 95% interval (`vs_*_lo/hi`), their simultaneous interval over the column's family
    (`vs_*_sim_lo/hi`) and 1 where the mark is shown (`vs_*_sig`); empty where not compared."""
    best = best_rows(table)
    records = []
    for i, row in enumerate(table.rows):
        for c in table.columns:
            cell = row.cells.get(c.key)
            if cell is None or cell.summary is None:
                continue
            s = cell.summary.scaled(c.scale)
            records.append(
                {
                    "scenario": table.scenario,
                    "table": table.key,
                    "row": row.label,
                    "group": row.group,
                    "column": f"{c.span} {c.label}" if c.span else c.label,
                    "metric": c.key,
                    "mean": "" if math.isnan(s.mean) else repr(s.mean),
                    "ci": "" if s.ci is None else repr(s.ci),
                    "n": s.n,
                    "n_seeds": s.n_total,
                    "scale": c.scale,
                    "bold": int(i in best.get(c.key, ())),
                    "note": cell_note(cell) or "",
                    **_interval_fields("boot", cell.boot, c.scale),
                    **_difference_fields("uniform", cell, c.scale),
                    "best_baseline": table.baselines.get(c.key, ""),
                    **_difference_fields("best", cell, c.scale),
                }
            )
    return records
