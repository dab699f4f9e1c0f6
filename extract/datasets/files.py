"""Reading a loader's source: JSON records from a local file, and hub-format rows (hub or local copy).

`read_json_records` accepts JSON lines, a JSON array, or a JSON object keyed by id; `detect_format`
decides whether a `--data-file` is a hub export (parquet, `save_to_disk` folder) or the original
release; `hub_records` returns hub-format rows from `datasets.load_dataset` or a local copy.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from walla.extract.models import _hub as hub


def read_json_records(path: Path) -> Iterator[tuple[str, object]]:
    """(where, record) for JSON lines, a JSON array, or a JSON object keyed by id (key kept as '_key')."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (byte {e.start}); expected JSON records") from None
    except IsADirectoryError:
        raise ValueError(f"{path} is a directory; expected a JSON / JSON lines file") from None
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


def is_original(data_file: Path | None, local_format: str | None) -> bool:
    """True when a local `--data-file` is given in the original release's format (not a hub export)."""
    return data_file is not None and detect_format(Path(data_file), local_format) == "original"


def hub_records(hub_spec: dict | None, data_file: Path | None) -> tuple[Iterable[dict], dict]:
    """Rows in hub format: from the hub itself, or from a local parquet file / save_to_disk folder.

    Returns (rows, source). The hub path uses `datasets.load_dataset(path, name, split=split, revision=...)`
    and records the commit sha it loaded in `source["hub"]["revision"]` (a feature set fingerprint input).
    """
    import datasets  # ~1 s of imports, needed only for hub-format rows (not for original release files)

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
    revision = hub_spec.get("revision") or "main"
    label = f"{path}" + (f" ({name})" if name else "")
    hint = "pass the dataset as a local file with --data-file PATH"
    why = hub.prepare_hub_access()
    want = hub.resolve_revision(
        "dataset", path, revision, hint
    )  # offline: None when refs/<rev> is not cached
    try:
        ds = datasets.load_dataset(path, name, split=split, revision=want or revision)
    except Exception as e:  # offline, gated, missing config/split: all become one line
        reason = why or hub.describe_failure(e)
        if why:
            reason += " and it is not in the local cache"
        raise hub.unavailable("dataset", label, reason, hint) from e
    sha = _loaded_commit(ds)
    also = f"{why} and " if why else ""
    if want and sha and sha != want:  # offline, `datasets` loads its newest cached build, whatever revision
        reason = f"{also}the cached copy is commit {sha}, not revision {revision!r} ({want})"
        raise hub.unavailable("dataset", label, reason, hint)
    if not want and (not sha or revision != "main"):
        reason = f"{also}the local cache does not tell which commit revision {revision!r} is"
        raise hub.unavailable("dataset", label, reason, hint)
    return ds, {
        "hub": {"path": path, "name": name, "split": split, "revision": sha or want},
        "fingerprint": getattr(ds, "_fingerprint", None),
    }


def _loaded_commit(ds) -> str | None:
    """The commit sha a hub dataset was built from: `datasets` names its cache folder after it."""
    files = getattr(ds, "cache_files", None) or []
    sha = Path(files[0]["filename"]).parent.name if files else None
    return sha if hub.is_commit_sha(sha) else None
