"""Dataset loaders: hub or local files -> the canonical question table (schema.QUESTION_COLUMNS).

Every loader returns canonical rows (question_id, question, options, option_labels, label,
gold_dist, context, subject); `load_dataset_table` then assigns splits (extract/splits.py), applies
`--limit` and builds the polars table. Registry (`LOADERS`, the manifest's `loader:` key):

| loader   | hub (real `datasets.load_dataset` code)      | local files (`--data-file`)                                   |
|----------|----------------------------------------------|---------------------------------------------------------------|
| pubmedqa | qiaojin/PubMedQA pqa_labeled / pqa_artificial | original `ori_pqal.json` (object keyed by PubMed id)          |
| medmcqa  | openlifescienceai/medmcqa (`cop` 0-based)     | original release JSON lines (`cop` 1-based)                   |
| mmlu     | cais/mmlu, any config / split                 | original CSVs (file or folder; header optional; letter or 0-based answer) |
| arc      | allenai/ai2_arc                              | original JSON lines {id, question: {stem, choices}, answerKey} |
| jsonl    | -                                            | generic JSON lines, see `load_jsonl`                          |
| bayesx   | generated (extract/bayesx.py)                | -                                                             |
| facts    | generated (extract/facts.py)                 | -                                                             |

Hub-format data can also be given locally (`--data-file`): a `.parquet` file (read with
`load_dataset("parquet", ...)`) or a folder written by `Dataset.save_to_disk`; both go through
the same row parser as the hub.

Malformed input raises ONE ValueError naming file, line/entry and field. Rows the reference
implementation drops (PubMedQA "maybe", MedMCQA rows without a valid answer) are dropped here too,
counted, logged and recorded in the question table's source metadata.
"""

from __future__ import annotations

import csv
import json
import logging
import string
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
from walla.extract import hub
from walla.extract.splits import SplitProtocol, assign_splits
from walla.store.schema import QUESTION_COLUMNS, SPLITS

log = logging.getLogger(__name__)

LETTERS = string.ascii_uppercase


@dataclass(frozen=True)
class DatasetRequest:
    """Everything a loader needs; built by run.py from a DatasetEntry plus CLI overrides."""

    name: str  # dataset short name (manifest key); names the store folder
    loader: str  # LOADERS key
    hub: dict | None = None  # {path, name, split}
    data_file: Path | None = None  # local file/folder instead of the hub
    local_format: str | None = None  # "hub" | "original" | None = detect from the path
    split_protocol: SplitProtocol = field(default_factory=SplitProtocol)
    generator: dict | None = None  # {n, seed, ...} for generated datasets
    limit: int | None = None  # keep the first N rows (after split assignment)


@dataclass
class Loaded:
    """A loader's output before split assignment."""

    rows: list[dict]
    wheres: list[str]  # per row: "file, line n" (for duplicate-id messages)
    source: dict  # provenance recorded in the question table's meta.json
    dropped: Counter = field(default_factory=Counter)  # reason -> rows dropped


# ----------------------------------------------------------------------------- small helpers


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


def read_json_records(path: Path) -> Iterator[tuple[str, object]]:
    """(where, record) for JSON lines, a JSON array, or a JSON object keyed by id (key kept as '_key')."""
    text = path.read_text(encoding="utf-8")
    head = text.lstrip()[:1]
    if head == "[":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from e
        for i, rec in enumerate(data):
            yield f"{path}, item {i}", rec
        return
    if head == "{":
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = None  # JSON lines (several objects)
        if isinstance(data, dict) and data and all(isinstance(v, dict) for v in data.values()):
            for key, rec in data.items():  # {id: record} (PubMedQA's ori_pqal.json)
                if isinstance(rec, dict):
                    rec = {"_key": key, **rec}
                yield f"{path}, entry {key!r}", rec
            return
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}, line {lineno}: not valid JSON ({e.msg})") from e
        yield f"{path}, line {lineno}", rec


def detect_format(path: Path, local_format: str | None) -> str:
    """'hub' for parquet files and `save_to_disk` folders (always), else `local_format` (default 'original').

    A manifest's `local_format: original` therefore applies to JSON/CSV files only; `hub` with a JSON
    lines file reads it as a hub export (one hub-format row per line).
    """
    if local_format not in (None, "hub", "original"):
        raise ValueError(f"local_format must be 'hub' or 'original', got {local_format!r}")
    if not path.exists():
        raise ValueError(f"data file {path} does not exist")
    if path.is_dir():
        markers = ("dataset_info.json", "dataset_dict.json", "state.json")
        if any((path / m).exists() for m in markers) or any(path.glob("*.parquet")):
            return "hub"
    elif path.suffix == ".parquet":
        return "hub"
    return local_format or "original"


def hub_records(hub_spec: dict | None, data_file: Path | None) -> tuple[Iterable[dict], dict]:
    """Rows in hub format: from the hub itself, or from a local parquet file / save_to_disk folder.

    Returns (rows, source). The hub path uses `datasets.load_dataset(path, name, split=split)`.
    """
    import datasets  # lazy: importing datasets costs ~1 s

    if data_file is not None:
        p = Path(data_file)
        split = (hub_spec or {}).get("split") or "train"
        if p.is_dir() and not any(p.glob("*.parquet")):
            ds = datasets.load_from_disk(str(p))
            if isinstance(ds, datasets.DatasetDict):
                if split not in ds:
                    raise ValueError(f"{p}: no split {split!r} in the saved dataset (has {list(ds)})")
                ds = ds[split]
        elif p.is_dir() or p.suffix == ".parquet":
            files = sorted(str(f) for f in p.glob("*.parquet")) if p.is_dir() else [str(p)]
            ds = datasets.load_dataset("parquet", data_files=files, split="train")
        else:  # a hub export as JSON lines
            ds = datasets.load_dataset("json", data_files=[str(p)], split="train")
        return ds, {"data_file": str(p), "format": "hub"}
    if not hub_spec or not hub_spec.get("path"):
        raise ValueError("this dataset has no hub source in its manifest; pass --data-file PATH")
    path, name, split = hub_spec["path"], hub_spec.get("name"), hub_spec.get("split") or "train"
    why = hub.prepare_hub_access()
    try:
        ds = datasets.load_dataset(path, name, split=split)
    except Exception as e:  # offline, gated, missing config/split: all become one line
        reason = why or hub.describe_failure(e)
        if why:
            reason += " and it is not in the local cache"
        raise hub.unavailable(
            "dataset",
            f"{path}" + (f" ({name})" if name else ""),
            reason,
            "pass the dataset as a local file with --data-file PATH",
        ) from e
    return ds, {
        "hub": {"path": path, "name": name, "split": split},
        "fingerprint": getattr(ds, "_fingerprint", None),
    }


# ----------------------------------------------------------------------------- PubMedQA


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


def _pubmedqa_row(
    qid, question, contexts, labels, decision, long_answer, where, dropped: Counter
) -> dict | None:
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


def load_pubmedqa(req: DatasetRequest) -> Loaded:
    """PubMedQA yes/no questions; the context is the abstract. "maybe" rows are dropped and counted."""
    rows, wheres, dropped = [], [], Counter()
    if req.data_file is not None and detect_format(Path(req.data_file), req.local_format) == "original":
        path = Path(req.data_file)
        source = {"data_file": str(path), "format": "original"}
        for where, rec in read_json_records(path):
            qid = rec.get("_key") or rec.get("pubid") if isinstance(rec, dict) else None
            if qid is None:
                raise ValueError(f"{where}: missing field 'pubid' (or a PubMed id as the object key)")
            row = _pubmedqa_row(
                qid,
                need(rec, "QUESTION", where, str),
                need(rec, "CONTEXTS", where, list),
                rec.get("LABELS"),
                need(rec, "final_decision", where, str),
                rec.get("LONG_ANSWER"),
                where,
                dropped,
            )
            if row is not None:
                rows.append(row)
                wheres.append(where)
    else:
        records, source = hub_records(
            req.hub or {"path": "qiaojin/PubMedQA", "name": "pqa_labeled", "split": "train"}, req.data_file
        )
        for i, rec in enumerate(records):
            where = f"{_src(source)}, row {i}"
            ctx = need(rec, "context", where, dict)
            row = _pubmedqa_row(
                need(rec, "pubid", where, (int, str)),
                need(rec, "question", where, str),
                need(ctx, "contexts", where + " field 'context'", list),
                ctx.get("labels"),
                need(rec, "final_decision", where, str),
                rec.get("long_answer"),
                where,
                dropped,
            )
            if row is not None:
                rows.append(row)
                wheres.append(where)
    return Loaded(rows, wheres, source, dropped)


def _src(source: dict) -> str:
    if "data_file" in source:
        return source["data_file"]
    h = source["hub"]
    return f"hub {h['path']}" + (f"/{h['name']}" if h.get("name") else "") + f":{h['split']}"


# ----------------------------------------------------------------------------- MedMCQA


def _medmcqa_row(rec: dict, where: str, cop_base: int, fallback_id: str, dropped: Counter) -> dict | None:
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


def load_medmcqa(req: DatasetRequest) -> Loaded:
    """MedMCQA 4-option questions. Hub `cop` is 0-based, the original release's is 1-based."""
    rows, wheres, dropped = [], [], Counter()
    if req.data_file is not None and detect_format(Path(req.data_file), req.local_format) == "original":
        path = Path(req.data_file)
        source = {"data_file": str(path), "format": "original"}
        it: Iterable = ((w, r, 1) for w, r in read_json_records(path))
    else:
        records, source = hub_records(
            req.hub or {"path": "openlifescienceai/medmcqa", "split": "train"}, req.data_file
        )
        it = ((f"{_src(source)}, row {i}", r, 0) for i, r in enumerate(records))
    for n, (where, rec, base) in enumerate(it):
        row = _medmcqa_row(rec, where, base, f"row{n}", dropped)
        if row is not None:
            rows.append(row)
            wheres.append(where)
    return Loaded(rows, wheres, source, dropped)


# ----------------------------------------------------------------------------- MMLU


def _mmlu_answer(ans, n_opts: int, where: str) -> int:
    s = str(ans).strip()
    if len(s) == 1 and s.upper() in LETTERS[:n_opts] and not s.isdigit():
        return LETTERS.index(s.upper())
    try:
        idx = int(s)
    except ValueError:
        raise ValueError(
            f"{where}: field 'answer' must be a letter A-{LETTERS[n_opts - 1]} or a 0-based index, got {s!r}"
        ) from None
    if not 0 <= idx < n_opts:
        raise ValueError(f"{where}: answer index {idx} is out of range for {n_opts} options")
    return idx


def _mmlu_subject(path: Path) -> str:
    stem = path.stem
    for suffix in ("_dev", "_val", "_test", "_train", "_auxiliary_train"):
        if stem.endswith(suffix):
            return stem[: -len(suffix)]
    return stem


def _read_mmlu_csv(path: Path, rows: list, wheres: list) -> None:
    subject = _mmlu_subject(path)
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        for i, rec in enumerate(reader):
            where = f"{path}, line {reader.line_num}"
            if not rec or all(not c.strip() for c in rec):
                continue
            if (
                i == 0 and rec[-1].strip().lower() == "answer"
            ):  # header row (the no-header original starts with a question)
                continue
            if len(rec) < 4:
                raise ValueError(
                    f"{where}: expected question, >=2 choices and answer columns, got {len(rec)} columns"
                )
            question, options = rec[0].strip(), [c.strip() for c in rec[1:-1]]
            row = canonical_row(
                f"{path.stem}-{i}",
                question,
                options,
                _mmlu_answer(rec[-1], len(options), where),
                subject=subject,
            )
            rows.append(row)
            wheres.append(where)


def load_mmlu(req: DatasetRequest) -> Loaded:
    """MMLU: hub `cais/mmlu` (config/split from the manifest) or the original CSV file(s)."""
    rows: list[dict] = []
    wheres: list[str] = []
    if req.data_file is not None and detect_format(Path(req.data_file), req.local_format) == "original":
        path = Path(req.data_file)
        files = sorted(path.rglob("*.csv")) if path.is_dir() else [path]
        if not files:
            raise ValueError(f"{path}: no .csv files found")
        for f in files:
            _read_mmlu_csv(f, rows, wheres)
        return Loaded(rows, wheres, {"data_file": str(path), "format": "original", "files": len(files)})
    records, source = hub_records(
        req.hub or {"path": "cais/mmlu", "name": "all", "split": "auxiliary_train"}, req.data_file
    )
    split = source.get("hub", {}).get("split", "local")
    for i, rec in enumerate(records):
        where = f"{_src(source)}, row {i}"
        if isinstance(rec, dict) and set(rec) == {"train"} and isinstance(rec["train"], dict):
            rec = rec["train"]  # the `auxiliary_train` config nests each row under "train"
        options = [str(c).strip() for c in need(rec, "choices", where, list)]
        if len(options) < 2:
            raise ValueError(f"{where}: field 'choices' needs at least 2 options, got {len(options)}")
        label = _mmlu_answer(need(rec, "answer", where, (int, str)), len(options), where)
        rows.append(
            canonical_row(
                f"{split}-{i}",
                need(rec, "question", where, str).strip(),
                options,
                label,
                subject=rec.get("subject") or None,
            )
        )
        wheres.append(where)
    return Loaded(rows, wheres, source)


# ----------------------------------------------------------------------------- ARC


def _arc_row(qid, stem, texts, labels, answer_key, where) -> dict:
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


def load_arc(req: DatasetRequest) -> Loaded:
    """ARC: options shown as A, B, C, ... by POSITION whatever the source labels (A-E or 1-4).

    The source labels are kept in `option_labels`; the label is the position of `answerKey`.
    Unlike the reference (which drops them), 3- and 5-option and numeric-label rows are kept.
    """
    rows, wheres = [], []
    if req.data_file is not None and detect_format(Path(req.data_file), req.local_format) == "original":
        path = Path(req.data_file)
        source = {"data_file": str(path), "format": "original"}
        for where, rec in read_json_records(path):
            q = need(rec, "question", where, dict)
            choices = need(q, "choices", where + " field 'question'", list)
            for c in choices:
                need(c, "text", where + " field 'choices'")
                need(c, "label", where + " field 'choices'")
            rows.append(
                _arc_row(
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
    records, source = hub_records(
        req.hub or {"path": "allenai/ai2_arc", "name": "ARC-Challenge", "split": "test"}, req.data_file
    )
    for i, rec in enumerate(records):
        where = f"{_src(source)}, row {i}"
        ch = need(rec, "choices", where, dict)
        rows.append(
            _arc_row(
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


# ----------------------------------------------------------------------------- generic JSON lines


def load_jsonl(req: DatasetRequest) -> Loaded:
    """Bring-your-own data: one JSON object per line.

    Fields: `id` (str/int, unique), `question` (str), `options` (list of >= 2 str), `label`
    (0-based int, or a string equal to one of `option_labels`); optional: `option_labels`
    (list of str, default A, B, C, ...), `context` (str: enables the relevant/irrelevant
    variants), `gold_dist` (list of floats summing to 1: soft ground truth), `subject` (str),
    `split` (train/val/test; when every row has one they are used as given).
    """
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
        label = need(rec, "label", where, (int, str))
        if isinstance(label, bool):
            raise ValueError(f"{where}: field 'label' must be an int index or an option label, got {label!r}")
        if isinstance(label, str):
            names = [str(x) for x in (labels or LETTERS[: len(options)])]
            if label not in names:
                raise ValueError(f"{where}: field 'label' {label!r} is not one of the option labels {names}")
            label = names.index(label)
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


# ----------------------------------------------------------------------------- registry + table


def _load_bayesx(req: DatasetRequest) -> Loaded:
    from walla.extract import bayesx

    return bayesx.load(req)


def _load_facts(req: DatasetRequest) -> Loaded:
    from walla.extract import facts

    return facts.load(req)


LOADERS: dict[str, Callable[..., Loaded]] = {
    "pubmedqa": load_pubmedqa,
    "medmcqa": load_medmcqa,
    "mmlu": load_mmlu,
    "arc": load_arc,
    "jsonl": load_jsonl,
    "bayesx": _load_bayesx,
    "facts": _load_facts,
}


def build_table(
    loaded: Loaded, protocol: SplitProtocol, limit: int | None = None
) -> tuple[pl.DataFrame, dict]:
    """Validate rows, assign splits, apply the limit; return (question table, source metadata)."""
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
            f"{_src(loaded.source) if loaded.source else 'dataset'}: no usable rows "
            f"(dropped: {dict(loaded.dropped) or 'none'})"
        )
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
    if limit is not None:
        keep = keep[:limit]
    for reason, n in dropped.items():
        log.info("dropped %d row(s): %s", n, reason)
    data = {c: [] for c in QUESTION_COLUMNS}
    for row, split in keep:
        for c in QUESTION_COLUMNS:
            data[c].append(split if c == "split" else row[c])
    df = pl.DataFrame(
        data,
        schema={
            "question_id": pl.String,
            "split": pl.String,
            "question": pl.String,
            "options": pl.List(pl.String),
            "option_labels": pl.List(pl.String),
            "label": pl.Int64,
            "gold_dist": pl.List(pl.Float64),
            "context": pl.String,
            "subject": pl.String,
        },
    )
    source = dict(loaded.source)
    source.update(
        {
            "split_protocol": {"mode": protocol.mode, "ratios": list(protocol.ratios), "seed": protocol.seed},
            "dropped": dict(dropped),
            "limit": limit,
        }
    )
    return df, source


def load_dataset_table(req: DatasetRequest) -> tuple[pl.DataFrame, dict]:
    """Load a dataset through its registered loader into the canonical question table.

    Returns:
        (table with schema.QUESTION_COLUMNS, source metadata for the store).
    Raises:
        KeyError: unknown loader name. ValueError: malformed input (file, line and field named).
        hub.HubUnavailableError: hub dataset unreachable / gated / not cached.
    """
    if req.loader not in LOADERS:
        raise KeyError(f"unknown dataset loader {req.loader!r}; available: {sorted(LOADERS)}")
    loaded = LOADERS[req.loader](req)
    return build_table(loaded, req.split_protocol, req.limit)
