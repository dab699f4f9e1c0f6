"""Canonical question rows: the request a loader gets, what it returns, and the row builder/checker.

Every loader (one module each in this package) turns its source into rows built by `canonical_row`
(question_id, question, options, option_labels, label, gold_dist, context, subject) and reports
problems through `need`, so a malformed input is always ONE ValueError naming where and the field.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from walla.extract.prompts import LETTERS
from walla.extract.splits import SplitProtocol


@dataclass(frozen=True)
class DatasetRequest:
    """Everything a loader needs; built by run.py from a DatasetEntry plus CLI overrides."""

    name: str  # dataset short name (manifest key); names the store folder
    loader: str  # a registered loader (registry.py)
    hub: dict | None = None  # {path, name, split}
    data_file: Path | None = None  # local file/folder instead of the hub
    local_format: str | None = None  # "hub" | "original" | None = detect from the path
    split_protocol: SplitProtocol = field(default_factory=SplitProtocol)
    generator: dict | None = None  # {n, seed, ...} for generated datasets
    limit: int | None = None  # keep the first N rows (after split assignment)
    sample: int | None = None  # keep N rows drawn at random (split protocol's seed), file order kept


@dataclass
class Loaded:
    """A loader's output before split assignment."""

    rows: list[dict]
    wheres: list[str]  # per row: "file, line n" (for duplicate-id messages)
    source: dict  # provenance recorded in the question table's meta.json
    dropped: Counter = field(default_factory=Counter)  # reason -> rows dropped


def need(rec: dict, key: str, where: str, types: type | tuple = object):
    """rec[key], or a ValueError naming where and which field is missing / of the wrong type."""
    if not isinstance(rec, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    if key not in rec or rec[key] is None:
        raise ValueError(f"{where}: missing field {key!r}")
    val = rec[key]
    if not isinstance(val, types):
        raise ValueError(
            f"{where}: field {key!r} must be {_typename(types)}, got {type(val).__name__} {val!r:.60}"
        )
    return val


def _typename(types) -> str:
    if isinstance(types, tuple):
        return " or ".join(t.__name__ for t in types)
    return types.__name__


def canonical_row(
    qid, question, options, label, *, option_labels=None, context=None, subject=None, gold_dist=None
) -> dict:
    """One row of the question table (before its split is assigned)."""
    return {
        "question_id": str(qid),
        "question": question,
        "options": list(options),
        "option_labels": list(option_labels) if option_labels is not None else list(LETTERS[: len(options)]),
        "label": int(label),
        "gold_dist": None if gold_dist is None else [float(x) for x in gold_dist],
        "context": context,
        "subject": subject,
    }


def check_row(row: dict, where: str) -> None:
    """Validate one canonical row; the error names `where` and the field."""
    if not isinstance(row["question"], str) or not row["question"].strip():
        raise ValueError(f"{where}: field 'question' is empty")
    opts = row["options"]
    if len(opts) < 2:
        raise ValueError(f"{where}: field 'options' needs at least 2 options, got {len(opts)}")
    if len(opts) > len(LETTERS):
        raise ValueError(
            f"{where}: field 'options' has {len(opts)} options; at most {len(LETTERS)} are supported"
        )
    if any(not isinstance(o, str) for o in opts):
        raise ValueError(f"{where}: field 'options' must be a list of strings")
    if not 0 <= row["label"] < len(opts):
        raise ValueError(f"{where}: answer index {row['label']} is out of range for {len(opts)} options")
    gd = row["gold_dist"]
    if gd is not None:
        if len(gd) != len(opts) or any(x < 0 for x in gd) or abs(sum(gd) - 1) > 1e-6:
            raise ValueError(
                f"{where}: field 'gold_dist' must be {len(opts)} non-negative numbers summing to 1"
            )


def source_name(source: dict) -> str:
    """A short name of where rows came from ("path/to/file" or "hub org/name/config:split")."""
    if "data_file" in source:
        return source["data_file"]
    h = source["hub"]
    return f"hub {h['path']}" + (f"/{h['name']}" if h.get("name") else "") + f":{h['split']}"


def generator_params(req: DatasetRequest, defaults: dict) -> dict:
    """A generated dataset's parameters: `defaults` < the manifest's `generator:` block (+ --size).

    Raises:
        ValueError: a `--data-file` was given (a generated dataset reads no file), or an unknown key.
    """
    if req.data_file is not None:
        raise ValueError(
            f"dataset {req.name!r} is generated ({req.loader} generator) and reads no file; "
            f"drop --data-file {req.data_file} (use --size N to change its number of rows)"
        )
    params = {**defaults, **(req.generator or {})}
    unknown = set(params) - set(defaults)
    if unknown:
        raise ValueError(
            f"{req.loader} generator: unknown parameters {sorted(unknown)}; expected {sorted(defaults)}"
        )
    return params


def generated(req: DatasetRequest, defaults: dict, min_n: int, make) -> Loaded:
    """A generated dataset: parameters (generator_params), n checked, rows = make(n, seed, params)."""
    params = generator_params(req, defaults)
    n, seed = int(params["n"]), int(params["seed"])
    if n < min_n:
        raise ValueError(f"{req.loader} generator: n must be >= {min_n}, got {n}")
    record = {k: list(v) if isinstance(v, tuple) else v for k, v in params.items()}
    wheres = [f"{req.loader} generator row {i}" for i in range(n)]
    return Loaded(make(n, seed, params), wheres, {"generator": req.loader, "params": record})
