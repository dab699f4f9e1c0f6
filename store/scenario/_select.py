"""Choosing the feature sets a scenario reads: one complete set per (model, dataset, variant).

A missing set is reported with the exact `walla extract ...` command that creates it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from walla.store.features import StaleSchemaError, StoreError, extract_command, list_feature_sets

if TYPE_CHECKING:  # types only: the store reads no manifest
    from walla.manifests.scenario import ScenarioSpec


def _extract_cmd(model: str, dataset: str, variants: list[str], store: Path) -> str:
    cmd = extract_command(model, dataset, variants)
    return cmd if str(store) == "walla-store" else f"{cmd} --store {store}"


def select_feature_sets(
    store: Path, dataset: str, models: list[str], variants: tuple[str, ...], missing: list, notes: list
) -> dict:
    """Pick one complete feature set per (model, variant), all cut from the same question table.

    Several complete candidates (e.g. re-extracted with another backend): prefer the question table
    shared by all keys whose feature sets are newest, then the newest feature set per key; noted in meta.
    """
    cands = {}
    for m in models:
        for v in variants:
            infos = list_feature_sets(store, m, dataset, v)
            complete = sorted(
                (i for i in infos if i.status == "complete"), key=lambda i: i.created_at or "", reverse=True
            )
            if complete:
                cands[(m, v)] = complete
            else:
                missing.append((m, dataset, v, infos))
    if len(cands) < len(models) * len(variants):
        return {}
    common = set.intersection(*({i.questions_fp for i in c} for c in cands.values()))
    if not common:
        seen = ", ".join(f"{m}/{v}: {sorted({i.questions_fp for i in c})}" for (m, v), c in cands.items())
        raise StoreError(
            f"the feature sets of dataset {dataset!r} were extracted from different question tables ({seen}); "
            f"re-extract them from one table, e.g. `{_extract_cmd(models[0], dataset, list(variants), store)}` per model"
        )
    newest = {
        q: max(i.created_at or "" for c in cands.values() for i in c if i.questions_fp == q) for q in common
    }
    qfp = max(common, key=lambda q: newest[q])
    chosen = {}
    for key, c in cands.items():
        pick = next(i for i in c if i.questions_fp == qfp)
        if len(c) > 1:
            notes.append(
                f"{key[0]}/{dataset}/{key[1]}: {len(c)} complete feature sets; using {pick.fingerprint} "
                f"(newest on question table {qfp}); others: {', '.join(i.fingerprint for i in c if i is not pick)}"
            )
        chosen[key] = pick.path
    return chosen


def raise_missing(entry: ScenarioSpec, store: Path, missing: list) -> None:
    by: dict[tuple[str, str], list] = {}
    for m, d, v, infos in missing:
        by.setdefault((m, d), []).append((v, infos))
    lines, stale = [], True
    for (m, d), items in by.items():
        states = []
        for v, infos in items:
            for i in infos:
                if i.status == "stale":
                    states.append(
                        f"{v}: only schema v{i.schema_version} ({i.fingerprint}) exists, re-extract"
                    )
                elif i.status in ("incomplete", "writing"):
                    states.append(
                        f"{v}: {i.status}, {i.done_rows}/{i.n_rows} rows ({i.fingerprint}); this resumes it"
                    )
            stale &= any(i.status == "stale" for i in infos)
        lines.append(
            f"  {_extract_cmd(m, d, [v for v, _ in items], store)}"
            + (f"   # {'; '.join(states)}" if states else "")
        )
    cls = StaleSchemaError if stale else StoreError
    raise cls(
        f"scenario {entry.name!r} needs feature sets that store {store} does not hold complete; run:\n"
        + "\n".join(lines)
    )
