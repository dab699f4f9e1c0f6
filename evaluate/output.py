"""Writing one report file (tables, PNGs): atomically, with one clear line when it fails."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from walla.store.atomic import write_atomic


def write_file(path: Path, write: Callable[[Path], None]) -> Path:
    """Atomically write one output file (walla.store.atomic); an OSError becomes one line naming `path`."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return write_atomic(path, write)
    except OSError as e:
        raise ValueError(f"cannot write {path}: {e.strerror or e}") from None
