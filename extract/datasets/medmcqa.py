"""MedMCQA loader: 4-option medical questions. Hub `cop` is 0-based, the original release's is 1-based.

Hub: openlifescienceai/medmcqa. Local original: the release's JSON lines. Rows without a valid
answer (or whose correct option text is empty) are dropped and counted, as the reference does.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from walla.extract.datasets.files import hub_records, is_original, read_json_records
from walla.extract.datasets.rows import DatasetRequest, Loaded, canonical_row, need, source_name
from walla.extract.prompts import LETTERS

DEFAULT_HUB = {"path": "openlifescienceai/medmcqa", "split": "train"}


def _row(rec: dict, where: str, cop_base: int, fallback_id: str, dropped: Counter) -> dict | None:
    question = need(rec, "question", where, str).strip()
    texts = [str(need(rec, k, where)).strip() for k in ("opa", "opb", "opc", "opd")]
    cop = rec.get("cop", "missing")
    if cop == "missing":
        raise ValueError(f"{where}: missing field 'cop'")
    try:
        answer = int(cop) - cop_base
    except (TypeError, ValueError):
        answer = -1
    if not 0 <= answer < 4 or (isinstance(cop, float) and not cop.is_integer()):
        dropped[f"cop {cop!r} not a valid {cop_base}-based answer"] += 1
        return None
    if not question:
        dropped["empty question"] += 1
        return None
    keep = [i for i, t in enumerate(texts) if t]  # empty options are not shown and not scored
    if answer not in keep:
        dropped["correct option text empty"] += 1
        return None
    if len(keep) < 2:
        dropped["fewer than 2 non-empty options"] += 1
        return None
    qid = rec.get("id") or fallback_id
    return canonical_row(
        qid,
        question,
        [texts[i] for i in keep],
        keep.index(answer),
        option_labels=[LETTERS[i] for i in keep],
        subject=rec.get("subject_name"),
    )


def load(req: DatasetRequest) -> Loaded:
    """MedMCQA 4-option questions. Hub `cop` is 0-based, the original release's is 1-based."""
    rows, wheres, dropped = [], [], Counter()
    if is_original(req.data_file, req.local_format):
        path = Path(req.data_file)
        source = {"data_file": str(path), "format": "original"}
        it: Iterable = ((w, r, 1) for w, r in read_json_records(path))
    else:
        records, source = hub_records(req.hub or DEFAULT_HUB, req.data_file)
        it = ((f"{source_name(source)}, row {i}", r, 0) for i, r in enumerate(records))
    for n, (where, rec, base) in enumerate(it):
        row = _row(rec, where, base, f"row{n}", dropped)
        if row is not None:
            rows.append(row)
            wheres.append(where)
    return Loaded(rows, wheres, source, dropped)
