"""The question table: a loader's rows -> validated, split, limited polars table (schema.QUESTION_COLUMNS).

`load_dataset_table(req)` runs the registered loader, then `build_table` checks every row, refuses
duplicate ids, assigns splits (extract/splits.py), applies `--limit` and refuses a table whose
val or test split is empty (except split mode `none`, an evaluation-only set).

Rows the reference implementation drops (PubMedQA "maybe", MedMCQA rows without a valid answer)
are dropped here too, counted, logged and recorded in the question table's source metadata.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import replace

import numpy as np
import polars as pl
from walla.extract.datasets.registry import get_loader
from walla.extract.datasets.rows import DatasetRequest, Loaded, check_row, source_name
from walla.extract.splits import SplitProtocol, assign_splits, split_counts
from walla.store.schema import QUESTION_COLUMNS, SPLITS

log = logging.getLogger(__name__)

TABLE_SCHEMA = {
    "question_id": pl.String,
    "split": pl.String,
    "question": pl.String,
    "options": pl.List(pl.String),
    "option_labels": pl.List(pl.String),
    "label": pl.Int64,
    "gold_dist": pl.List(pl.Float64),
    "context": pl.String,
    "subject": pl.String,
}
MAX_SIZE_SEARCH = 1_000  # largest --size tried when suggesting the minimum of a generated dataset


class SplitTooSmallError(ValueError):
    """The val or test split of a question table is empty."""

    def __init__(self, counts: dict[str, int], where: str):
        self.counts = counts
        super().__init__(
            f"{where}: the question table has {counts['train']} train / {counts['val']} val / "
            f"{counts['test']} test rows; need >= 1 val and >= 1 test row"
        )


def _check_rows(loaded: Loaded) -> None:
    seen: dict[str, str] = {}
    for row, where in zip(loaded.rows, loaded.wheres, strict=True):
        check_row(row, where)
        if row["question_id"] in seen:
            raise ValueError(
                f"{where}: duplicate id {row['question_id']!r} (first seen at {seen[row['question_id']]})"
            )
        seen[row["question_id"]] = where
    if not loaded.rows:
        raise ValueError(
            f"{source_name(loaded.source) if loaded.source else 'dataset'}: no usable rows "
            f"(dropped: {dict(loaded.dropped) or 'none'})"
        )


def _sample(keep: list, n: int, seed: int) -> list:
    """`n` of the rows drawn at random, the splits' shares kept (largest remainders: each split keeps at least
    what its share rounds to, and at least one row while n allows), each split's rows by one seeded
    permutation; file order kept."""
    splits = [s for s in SPLITS if any(k[1] == s for k in keep)]
    pos = {s: [i for i, k in enumerate(keep) if k[1] == s] for s in splits}
    want = split_counts(n, tuple(len(pos[s]) / len(keep) for s in splits))
    for j in range(len(want)):  # every split keeps a row where n allows: an empty val/test is refused later
        if want[j] == 0 and n >= len(want):
            big = int(np.argmax(want))
            want[big], want[j] = want[big] - 1, 1
    rng = np.random.RandomState(seed)
    chosen = [
        i
        for s, k in zip(splits, want, strict=True)
        for i in np.asarray(pos[s])[rng.permutation(len(pos[s]))[:k]]
    ]
    return [keep[i] for i in sorted(chosen)]


def build_table(
    loaded: Loaded,
    protocol: SplitProtocol,
    limit: int | None = None,
    where: str = "dataset",
    sample: int | None = None,
) -> tuple[pl.DataFrame, dict]:
    """Validate rows, assign splits, apply the limit; return (question table, source metadata).

    Raises:
        ValueError: a bad row (its place named), a duplicate id, or no usable rows.
        SplitTooSmallError: an empty val or test split (split modes other than `none`).
    """
    _check_rows(loaded)
    given = [r.get("_split") for r in loaded.rows]
    if any(s is not None for s in given):
        if any(s is None for s in given):
            missing = next(w for w, s in zip(loaded.wheres, given, strict=True) if s is None)
            raise ValueError(
                f"{missing}: missing field 'split' (some rows have one: give it on every row or on none)"
            )
        protocol = SplitProtocol(mode="given", ratios=protocol.ratios, seed=protocol.seed)
    res = assign_splits([r["label"] for r in loaded.rows], protocol, given)
    dropped = Counter(loaded.dropped)
    if res.dropped:
        dropped["balanced_binary majority surplus"] += res.dropped
    keep = [(r, s) for r, s in zip(loaded.rows, res.split, strict=True) if s is not None]
    if sample is not None and sample < len(keep):
        keep = _sample(keep, sample, protocol.seed)
    if limit is not None:
        keep = keep[:limit]
    counts = Counter(s for _, s in keep)
    if protocol.mode != "none" and (counts["val"] < 1 or counts["test"] < 1):
        raise SplitTooSmallError({s: counts[s] for s in ("train", "val", "test")}, where)
    for reason, n in dropped.items():
        log.info("dropped %d row(s): %s", n, reason)
    data = {c: [] for c in QUESTION_COLUMNS}
    for row, split in keep:
        for c in QUESTION_COLUMNS:
            data[c].append(split if c == "split" else row[c])
    df = pl.DataFrame(data, schema=TABLE_SCHEMA)
    source = dict(loaded.source)
    source.update(
        {
            "split_protocol": {"mode": protocol.mode, "ratios": list(protocol.ratios), "seed": protocol.seed},
            "dropped": dict(dropped),
            "limit": limit,
            **({"sample": sample} if sample is not None else {}),
        }
    )
    return df, source


def minimum_size(req: DatasetRequest) -> int | None:
    """The smallest generator size (--size) whose table has a val and a test row; None if none <= the cap."""
    load = get_loader(req.loader).load
    for n in range(2, MAX_SIZE_SEARCH + 1):
        trial = replace(req, generator={**(req.generator or {}), "n": n})
        loaded = load(trial)
        res = assign_splits([r["label"] for r in loaded.rows], req.split_protocol)
        kept = [s for s in res.split if s is not None][: req.limit]
        if "val" in kept and "test" in kept:
            return n
    return None


def load_dataset_table(req: DatasetRequest) -> tuple[pl.DataFrame, dict]:
    """Load a dataset through its registered loader into the canonical question table.

    Returns:
        (table with schema.QUESTION_COLUMNS, source metadata for the store).
    Raises:
        KeyError: unknown loader name. ValueError: malformed input (file, line and field named), or an
        empty val/test split (with the minimum --size of a generated dataset).
        hub.HubUnavailableError: hub dataset unreachable / gated / not cached.
    """
    loader = get_loader(req.loader)
    if loader.generated and not req.generator:
        raise ValueError(
            f"dataset {req.name!r}: loader {req.loader!r} generates its rows; its datasets.yaml entry "
            "needs a `generator: {n, seed}` block"
        )
    loaded = loader.load(req)
    try:
        return build_table(
            loaded, req.split_protocol, req.limit, where=f"dataset {req.name!r}", sample=req.sample
        )
    except SplitTooSmallError as e:
        if not loader.generated:
            hint = "raise --limit" if req.limit is not None else "add rows to the data"
            raise ValueError(f"{e} ({hint})") from None
        n_min = minimum_size(req)
        if n_min is None:
            raise ValueError(f"{e} (no --size up to {MAX_SIZE_SEARCH} gives one)") from None
        what = f"--size {n_min} is the minimum" + (f" with --limit {req.limit}" if req.limit else "")
        raise ValueError(f"{e} ({what})") from None
