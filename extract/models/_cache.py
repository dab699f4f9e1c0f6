"""The per-user cache folder, `$WALLA_CACHE` (default ~/.cache/walla): the GGUF copies, the load-time checks'
verdicts and the model files' sha256 live under it. A module of its own so that what needs only the folder (a
model file's digest in `walla extract`'s inputs phase) imports neither torch nor transformers (gguf_cache does)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("WALLA_CACHE", Path.home() / ".cache" / "walla"))
