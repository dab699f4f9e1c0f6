"""ARC loader: options shown as A, B, C, ... by POSITION whatever the source labels (A-E or 1-4).

Hub: allenai/ai2_arc. Local original: JSON lines {id, question: {stem, choices}, answerKey}.
The source labels are kept in `option_labels`; the label is the position of `answerKey`. Unlike
the reference (which drops them), 3- and 5-option and numeric-label rows are kept.
"""

from __future__ import annotations

from pathlib import Path

from walla.extract.datasets.files import hub_records, is_original, read_json_records
from walla.extract.datasets.rows import DatasetRequest, Loaded, canonical_row, need, source_name

DEFAULT_HUB = {"path": "allenai/ai2_arc", "name": "ARC-Challenge", "split": "test"}


def _row(qid, stem, texts, labels, answer_key, where) -> dict:
    if not texts:
        raise ValueError(f"{where}: field 'choices' is empty")
    if len(texts) != len(labels):
        raise ValueError(f"{where}: field 'choices' has {len(texts)} texts but {len(labels)} labels")
    labels = [str(x).strip() for x in labels]
    key = str(answer_key).strip()
    if key not in labels:
        raise ValueError(f"{where}: field 'answerKey' {key!r} is not one of the choice labels {labels}")
    return canonical_row(
        qid, str(stem).strip(), [str(t).strip() for t in texts], labels.index(key), option_labels=labels
    )


def load(req: DatasetRequest) -> Loaded:
    """ARC rows from the hub or the original JSON lines (see the module docstring)."""
    rows, wheres = [], []
    if is_original(req.data_file, req.local_format):
        path = Path(req.data_file)
        source = {"data_file": str(path), "format": "original"}
        for where, rec in read_json_records(path):
            q = need(rec, "question", where, dict)
            choices = need(q, "choices", where + " field 'question'", list)
            for c in choices:
                need(c, "text", where + " field 'choices'")
                need(c, "label", where + " field 'choices'")
            rows.append(
                _row(
                    need(rec, "id", where, str),
                    need(q, "stem", where + " field 'question'", str),
                    [c["text"] for c in choices],
                    [c["label"] for c in choices],
                    need(rec, "answerKey", where, (str, int)),
                    where,
                )
            )
            wheres.append(where)
        return Loaded(rows, wheres, source)
    records, source = hub_records(req.hub or DEFAULT_HUB, req.data_file)
    for i, rec in enumerate(records):
        where = f"{source_name(source)}, row {i}"
        ch = need(rec, "choices", where, dict)
        rows.append(
            _row(
                need(rec, "id", where, str),
                need(rec, "question", where, str),
                need(ch, "text", where + " field 'choices'", list),
                need(ch, "label", where + " field 'choices'", list),
                need(rec, "answerKey", where, (str, int)),
                where,
            )
        )
        wheres.append(where)
    return Loaded(rows, wheres, source)
