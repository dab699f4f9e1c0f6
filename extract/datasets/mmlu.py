"""MMLU loader: hub `cais/mmlu` (config/split from the manifest) or the original CSV file(s).

The original CSVs (a file or a folder of them) have no header by default; a header row ending in
"answer" is skipped. The answer is a letter or a 0-based index.
"""

from __future__ import annotations

import csv
from pathlib import Path

from walla.extract.datasets.files import hub_records, is_original
from walla.extract.datasets.rows import DatasetRequest, Loaded, canonical_row, need, source_name
from walla.extract.prompts import LETTERS

DEFAULT_HUB = {"path": "cais/mmlu", "name": "all", "split": "auxiliary_train"}


def _answer(ans, n_opts: int, where: str) -> int:
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


def _subject(path: Path) -> str:
    stem = path.stem
    for suffix in ("_dev", "_val", "_test", "_train", "_auxiliary_train"):
        if stem.endswith(suffix):
            return stem[: -len(suffix)]
    return stem


def _read_csv(path: Path, rows: list, wheres: list) -> None:
    subject = _subject(path)
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        for i, rec in enumerate(reader):
            where = f"{path}, line {reader.line_num}"
            if not rec or all(not c.strip() for c in rec):
                continue
            if i == 0 and rec[-1].strip().lower() == "answer":
                continue  # header row (the no-header original starts with a question)
            if len(rec) < 4:
                raise ValueError(
                    f"{where}: expected question, >=2 choices and answer columns, got {len(rec)} columns"
                )
            question, options = rec[0].strip(), [c.strip() for c in rec[1:-1]]
            row = canonical_row(
                f"{path.stem}-{i}", question, options, _answer(rec[-1], len(options), where), subject=subject
            )
            rows.append(row)
            wheres.append(where)


def load(req: DatasetRequest) -> Loaded:
    """MMLU: hub `cais/mmlu` (config/split from the manifest) or the original CSV file(s)."""
    rows: list[dict] = []
    wheres: list[str] = []
    if is_original(req.data_file, req.local_format):
        path = Path(req.data_file)
        files = sorted(path.rglob("*.csv")) if path.is_dir() else [path]
        if not files:
            raise ValueError(f"{path}: no .csv files found")
        for f in files:
            _read_csv(f, rows, wheres)
        return Loaded(rows, wheres, {"data_file": str(path), "format": "original", "files": len(files)})
    records, source = hub_records(req.hub or DEFAULT_HUB, req.data_file)
    split = source.get("hub", {}).get("split", "local")
    for i, rec in enumerate(records):
        where = f"{source_name(source)}, row {i}"
        if isinstance(rec, dict) and set(rec) == {"train"} and isinstance(rec["train"], dict):
            rec = rec["train"]  # the `auxiliary_train` config nests each row under "train"
        options = [str(c).strip() for c in need(rec, "choices", where, list)]
        if len(options) < 2:
            raise ValueError(f"{where}: field 'choices' needs at least 2 options, got {len(options)}")
        label = _answer(need(rec, "answer", where, (int, str)), len(options), where)
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
