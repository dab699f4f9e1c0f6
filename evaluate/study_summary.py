"""The reading of `walla study` (cli/study.py): study.md beside the report's tables.md.

    path, text = write_summary(out, scenarios, models, marks, result)   # result: evaluate.report.run's

What a researcher needs from the study, all computed from the report's own tables (the same cells, question
resamples and marks as tables.md):

* throughput: per feature set of the store, prompt tokens, extraction wall time, tokens/s, dtype and
  determinism tier (meta.json `compute` and inputs), and the study's wall time per phase;
* per scenario: test n; each model's own accuracy with its question interval, the chance level (the mean of
  1/K over the test questions) and whether the interval's lower end is above it;
* the rows UniformAvg, StackedGen, LENS, WALLA I, WALLA II (+ augmented): ACC, ECE, D-Regret, K-Tau with
  both intervals and the table's marks (†: vs UniformAvg, ‡: vs the column's validation-chosen reference),
  family-wise as in the report;
* WALLA I/II vs the best single model (best on the TEST questions: a bar no aggregator is told in advance)
  and vs StackedGen: the paired bootstrap interval of the accuracy difference over the same resamples
  (unadjusted 95%: one comparison each, outside the tables' families, so read them as such);
* the accuracy difference the table detects with 80% power (its legend's figure);
* a plain statement generated from those numbers: which differences the test questions show and which
  they do not, and what the study cannot show.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from walla.evaluate.intervals.bootstrap import difference_interval
from walla.evaluate.tables import Row, Table, cell_parts

ROWS = ("UniformAvg", "StackedGen", "LENS (beyond the paper)", "WALLA I", "WALLA II", "WALLA I (augmented)")
COLS = ("accuracy", "ece", "d_regret", "kendall_tau")


def _fmt(x: float, scale: float = 100.0) -> str:
    return f"{x * scale:.2f}"


def throughput_rows(store: Path) -> list[dict]:
    """One dict per complete feature set: model, dataset, variant, rows, prompt tokens, wall s, tok/s, dtype,
    tier."""
    from walla.store.listing import list_feature_sets

    out = []
    for info in list_feature_sets(store):
        if info.status != "complete":
            continue
        meta = json.loads((Path(info.path) / "meta.json").read_text())
        comp = meta.get("compute") or {}
        inputs = meta.get("inputs") or {}
        backend = inputs.get("backend") if isinstance(inputs.get("backend"), dict) else {}
        tokens, wall = comp.get("prompt_tokens"), comp.get("wall_s")
        out.append(
            {
                "model": info.model,
                "dataset": info.dataset,
                "variant": info.variant,
                "rows": info.n_rows,
                "prompt_tokens": tokens,
                "wall_s": wall,
                "tokens_per_s": (tokens / wall) if tokens and wall else None,
                "dtype": inputs.get("dtype") or backend.get("dtype"),
                "tier": info.tier,
            }
        )
    return out


def _row(table: Table, label: str) -> Row | None:
    return next((r for r in table.rows if r.label == label), None)


def _cell_text(table: Table, row: Row, key: str) -> str:
    col = next((c for c in table.columns if c.key == key), None)
    if col is None or key not in row.cells:
        return "–"
    p = cell_parts(row.cells[key], col)
    ci = f" ± {p.ci}" if p.ci else ""
    return f"{p.mean}{ci} {p.boot or ''}{p.marks}".strip()


def _chance(ev) -> float:
    s = ev.data.scenario
    k = np.asarray(s.option_mask, dtype=bool).sum(-1) if getattr(s, "option_mask", None) is not None else None
    if k is None:
        k = np.full(len(s.label), s.probs.shape[-1])
    return float(np.mean(1.0 / k))


def _diff(a: Row, b: Row, key: str = "accuracy") -> tuple[float, tuple[float, float] | None]:
    ca, cb = a.cells.get(key), b.cells.get(key)
    d = ca.summary.mean - cb.summary.mean
    iv = None
    if ca.resamples is not None and cb.resamples is not None:
        got = difference_interval(ca.resamples, cb.resamples)
        iv = (got.lo, got.hi) if got is not None else None
    return d, iv


def scenario_section(ev, main: Table) -> tuple[list[str], list[str]]:
    """(markdown lines, plain-statement sentences) of one scenario."""
    s = ev.data.scenario
    n = len(s.label)
    chance = _chance(ev)
    lines = [f"### `{s.name}` (dataset {s.dataset}, N = {n} test questions, chance {_fmt(chance)}%)", ""]
    agents = [r for r in main.rows if r.group == "individual"]
    lines += ["| Model | ACC [question interval] | above chance? |", "|:--|--:|:--|"]
    above = []
    for r in agents:
        c = r.cells["accuracy"]
        lo = c.boot.lo if c.boot is not None else float("nan")
        ok = bool(np.isfinite(lo) and lo > chance)
        above.append((r.label, ok))
        lines.append(f"| {r.label} | {_cell_text(main, r, 'accuracy')} | {'yes' if ok else 'no'} |")
    lines.append("")
    cols = [c for c in main.columns if c.key in COLS]
    lines += ["| Method | " + " | ".join(c.label for c in cols) + " |", "|:--|" + "--:|" * len(cols)]
    for label in ROWS:
        r = _row(main, label)
        if r is not None:
            lines.append(f"| {label} | " + " | ".join(_cell_text(main, r, c.key) for c in cols) + " |")
    power = main.power.get(next((c.label for c in main.columns if c.key == "accuracy"), "ACC"))
    lines += [
        "",
        f"Accuracy difference detected with 80% power on these {n} questions: {_power_text(power)}.",
        "",
    ]
    best = max(agents, key=lambda r: r.cells["accuracy"].summary.mean) if agents else None
    stacked = _row(main, "StackedGen")
    said = []
    for label in ("WALLA I", "WALLA II"):
        r = _row(main, label)
        if r is None:
            continue
        acc = r.cells["accuracy"]
        uni = "†" in acc.marks
        words = [f"{label} vs UniformAvg on ACC: {'differs (†)' if uni else 'no difference shown'}"]
        for name, other in (("the best single model", best), ("StackedGen", stacked)):
            if other is None:
                continue
            d, iv = _diff(r, other)
            shown = iv is not None and (iv[0] > 0 or iv[1] < 0)
            ivs = f"[{_fmt(iv[0])}, {_fmt(iv[1])}]" if iv else "[–]"
            named = name if other.label == name else f"{name} ({other.label})"
            words.append(
                f"vs {named}: {_fmt(d)} points {ivs} "
                + ("(the interval excludes 0)" if shown else "(not shown)")
            )
        lines.append("- " + "; ".join(words) + ".")
        said.append((label, uni))
    lines.append("")
    sentences = []
    strong = [a for a, ok in above if ok]
    sentences.append(
        f"`{s.name}`: {len(strong)} of {len(above)} models are above chance"
        + (f" ({', '.join(strong)})" if strong else "")
        + "; "
        + (
            "WALLA's accuracy differs from UniformAvg's"
            if any(u for _, u in said)
            else "the test questions show no accuracy difference between WALLA and UniformAvg"
        )
        + (f" (80% power only for differences of {_power_text(power)})" if power is not None else "")
        + "."
    )
    return lines, sentences


def _power_text(power: float | None) -> str:
    """The 80%-power difference in words: past 100 points no accuracy difference can be detected at all."""
    if power is None:
        return "not computed"
    if power > 100:
        return f"more than 100 points ({power:.0f} by the normal approximation): none can be detected"
    return f"about {power:g} points"


def write_summary(
    out: Path, scenario_names: list[str], models: list[str], marks: dict, result
) -> tuple[Path, str]:
    """study.md under `out` and the lines to print (throughput)."""
    tp = throughput_rows(out / "store")
    lines = ["# walla study: four embedded LLM families on real questions", ""]
    total = marks.get("done", 0) - marks.get("start", 0)
    ext = marks.get("extracted", marks.get("start", 0)) - marks.get("start", 0)
    lines += [
        f"Wall time: {total:.0f} s (extraction {ext:.0f} s, training + report {total - ext:.0f} s). Models: "
        + ", ".join(models)
        + ". Tables, intervals and marks: [tables.md](tables.md).",
        "",
        "## Extraction throughput",
        "",
        "| Model | Dataset | Variant | Rows | Prompt tokens | Wall s | Tokens/s | dtype | Tier |",
        "|:--|:--|:--|--:|--:|--:|--:|:--|:--|",
    ]
    printed = []
    for t in tp:
        rate = f"{t['tokens_per_s']:.1f}" if t["tokens_per_s"] else "–"
        wall = f"{t['wall_s']:.1f}" if t["wall_s"] else "–"
        lines.append(
            f"| {t['model']} | {t['dataset']} | {t['variant']} | {t['rows']} | {t['prompt_tokens']} | {wall} | "
            f"{rate} | {t['dtype']} | {t['tier']} |"
        )
        printed.append(
            f"walla study: {t['model']} {t['dataset']}/{t['variant']}: {t['prompt_tokens']} prompt tokens in "
            f"{wall} s = {rate} tokens/s ({t['dtype']}, {t['tier']})"
        )
    lines += ["", "## Per scenario", ""]
    statements = []
    by_name = {ev.data.scenario.name: ev for ev in result.scenarios}
    for name in scenario_names:
        ev = by_name.get(name)
        main = next((t for t in result.tables if t.scenario == name and t.key == "main"), None)
        if ev is None or main is None:
            lines += [f"### `{name}`: not in the report (see tables.md, Missing runs)", ""]
            continue
        more, said = scenario_section(ev, main)
        lines += more
        statements += said
    lines += [
        "## What the tables show and do not show",
        "",
        *[f"- {s}" for s in statements],
        "- A mark (†, ‡) says the test questions show the difference for these trained seeds, with at most a 5% "
        "chance of any false mark per column; no mark is not evidence of no difference: below the 80%-power "
        "figure of each table most true differences go unmarked.",
        "- The models are 135M to 1.5B parameters, far below the paper's 7-9B agents, on a few hundred "
        "questions drawn per dataset; the study tests whether the mechanism and its heads work on real "
        "features and questions, not the paper's effect sizes.",
        "- The best single model is picked on the test questions themselves (hindsight); UniformAvg, StackedGen "
        "and the routers are what an aggregator could have chosen without them.",
        "",
    ]
    path = out / "study.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path, "\n".join(printed)
