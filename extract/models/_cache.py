"""The per-user cache folder, `$WALLA_CACHE` (default ~/.cache/walla): the GGUF copies, the load-time checks'
verdicts and the model files' sha256 (`file_sha256`, memoized per version of the file) live under it. A module
of its own so that what needs only the folder (a model file's digest in `walla extract`'s inputs phase) imports
neither torch nor transformers (`_gguf` does)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("WALLA_CACHE", Path.home() / ".cache" / "walla"))


def sha256_file(path: Path, block: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    """sha256 of a weights file, read once per version of the file (module docstring); a cache that cannot be
    read or written only costs the hash."""
    from walla.store import atomic

    st = path.stat()
    key = {
        "path": str(path.resolve()),
        "dev": st.st_dev,
        "inode": st.st_ino,
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "ctime_ns": st.st_ctime_ns,
    }
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    memo = cache_root() / "sha256" / f"{name}.json"
    try:
        hit = json.loads(memo.read_text())
        if hit.get("key") == key and len(str(hit.get("sha256", ""))) == 64:
            return hit["sha256"]
    except (OSError, ValueError, AttributeError):
        pass  # absent or unreadable: hash the file
    digest = sha256_file(path)
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_json(memo, {"key": key, "sha256": digest})
    except OSError:
        pass
    return digest
