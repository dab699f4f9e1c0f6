"""Generic JSON-lines loader: bring-your-own multiple-choice data (`--data-file`, no hub source).

Fields: `id` (str/int, unique), `question` (str), `options` (list of >= 2 str), `label`
(0-based int, or a string equal to one of `option_labels`); optional: `option_labels`
(list of str, default A, B, C, ...), `context` (str: enables the relevant/irrelevant
variants), `gold_dist` (list of floats summing to 1: soft ground truth), `subject` (str),
`split` (train/val/test; when every row has one they are used as given).
"""

from __future__ import annotations

from pathlib import Path

from walla.extract.datasets.files import read_json_records
from walla.extract.datasets.rows import DatasetRequest, Loaded, canonical_row, need
from walla.extract.prompts import LETTERS
from walla.store.schema import SPLITS


def _label(rec: dict, where: str, labels: list | None, n_options: int) -> int:
    label = need(rec, "label", where, (int, str))
    if isinstance(label, bool):
        raise ValueError(f"{where}: field 'label' must be an int index or an option label, got {label!r}")
    if isinstance(label, str):
        names = [str(x) for x in (labels or LETTERS[:n_options])]
        if label not in names:
            raise ValueError(f"{where}: field 'label' {label!r} is not one of the option labels {names}")
        label = names.index(label)
    return label


def load(req: DatasetRequest) -> Loaded:
    """Rows of a JSON-lines file (fields in the module docstring); each row may carry its split."""
    if req.data_file is None:
        raise ValueError(f"dataset {req.name!r} uses the generic jsonl loader: pass --data-file PATH")
    path = Path(req.data_file)
    if not path.exists():
        raise ValueError(f"data file {path} does not exist")
    rows, wheres = [], []
    for where, rec in read_json_records(path):
        qid = need(rec, "id", where, (str, int))
        options = need(rec, "options", where, list)
        labels = rec.get("option_labels")
        if labels is not None and (not isinstance(labels, list) or len(labels) != len(options)):
            raise ValueError(f"{where}: field 'option_labels' must be a list as long as 'options'")
        label = _label(rec, where, labels, len(options))
        ctx = rec.get("context")
        if ctx is not None and not isinstance(ctx, str):
            raise ValueError(f"{where}: field 'context' must be a string or null")
        gd = rec.get("gold_dist")
        if gd is not None and (not isinstance(gd, list) or not all(isinstance(x, (int, float)) for x in gd)):
            raise ValueError(f"{where}: field 'gold_dist' must be a list of numbers")
        split = rec.get("split")
        if split is not None and split not in SPLITS:
            raise ValueError(f"{where}: field 'split' is {split!r}; expected one of {SPLITS}")
        row = canonical_row(
            qid,
            need(rec, "question", where, str).strip(),
            [str(o) for o in options],
            label,
            option_labels=[str(x) for x in labels] if labels else None,
            context=ctx or None,
            subject=rec.get("subject"),
            gold_dist=gd,
        )
        row["_split"] = split
        rows.append(row)
        wheres.append(where)
    if not rows:
        raise ValueError(f"{path}: no rows")
    return Loaded(rows, wheres, {"data_file": str(path), "format": "jsonl"})
