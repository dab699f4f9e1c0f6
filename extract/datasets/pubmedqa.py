"""PubMedQA loader: yes/no questions whose context is the abstract ("maybe" rows dropped and counted).

Hub: qiaojin/PubMedQA (pqa_labeled / pqa_artificial). Local original: `ori_pqal.json`, an object
keyed by PubMed id.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

from walla.extract.datasets.files import hub_records, is_original, read_json_records
from walla.extract.datasets.rows import DatasetRequest, Loaded, canonical_row, need, source_name

DEFAULT_HUB = {"path": "qiaojin/PubMedQA", "name": "pqa_labeled", "split": "train"}


def pubmedqa_context(contexts: list[str], labels: list[str] | None, where: str) -> str:
    """Abstract sections joined by newlines, each prefixed "(Title-case label) " (SPEC §1.3)."""
    if labels is not None and len(labels) != len(contexts):
        raise ValueError(
            f"{where}: field 'labels' has {len(labels)} entries but 'contexts' has {len(contexts)}"
        )
    parts = []
    for i, text in enumerate(contexts):
        lab = labels[i] if labels else None
        parts.append(f"({str(lab).title()}) {text}" if lab else str(text))
    return "\n".join(parts)


def _row(qid, question, contexts, labels, decision, long_answer, where, dropped: Counter) -> dict | None:
    dec = str(decision).strip().lower()
    if dec not in ("yes", "no"):
        dropped[f"final_decision {dec!r}"] += 1
        return None
    if not str(question).strip() or (long_answer is not None and not str(long_answer).strip()):
        dropped["empty question or long_answer"] += 1
        return None
    if not isinstance(contexts, list) or not contexts:
        raise ValueError(f"{where}: field 'contexts' must be a non-empty list of abstract sections")
    return canonical_row(
        qid,
        str(question).strip(),
        ["yes", "no"],
        0 if dec == "yes" else 1,
        option_labels=["YES", "NO"],
        context=pubmedqa_context(contexts, labels, where),
    )


def _original_fields(path: Path) -> Iterator[tuple]:
    """(where, qid, question, contexts, labels, decision, long_answer) of an original `ori_pqal.json`."""
    for where, rec in read_json_records(path):
        qid = rec.get("_key") or rec.get("pubid") if isinstance(rec, dict) else None
        if qid is None:
            raise ValueError(f"{where}: missing field 'pubid' (or a PubMed id as the object key)")
        yield (
            where,
            qid,
            need(rec, "QUESTION", where, str),
            need(rec, "CONTEXTS", where, list),
            rec.get("LABELS"),
            need(rec, "final_decision", where, str),
            rec.get("LONG_ANSWER"),
        )


def _hub_fields(records: Iterable[dict], source: dict) -> Iterator[tuple]:
    """The same fields from hub-format rows (the abstract nested under `context`)."""
    for i, rec in enumerate(records):
        where = f"{source_name(source)}, row {i}"
        ctx = need(rec, "context", where, dict)
        yield (
            where,
            need(rec, "pubid", where, (int, str)),
            need(rec, "question", where, str),
            need(ctx, "contexts", where + " field 'context'", list),
            ctx.get("labels"),
            need(rec, "final_decision", where, str),
            rec.get("long_answer"),
        )


def load(req: DatasetRequest) -> Loaded:
    """PubMedQA yes/no questions; the context is the abstract. "maybe" rows are dropped and counted."""
    if is_original(req.data_file, req.local_format):
        source = {"data_file": str(req.data_file), "format": "original"}
        fields = _original_fields(Path(req.data_file))
    else:
        records, source = hub_records(req.hub or DEFAULT_HUB, req.data_file)
        fields = _hub_fields(records, source)
    rows, wheres, dropped = [], [], Counter()
    for where, *values in fields:
        row = _row(*values, where, dropped)
        if row is not None:
            rows.append(row)
            wheres.append(where)
    return Loaded(rows, wheres, source, dropped)
