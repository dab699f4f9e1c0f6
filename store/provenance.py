"""Provenance recorded (never hashed) in every store artifact's meta.json: when, and by which libraries."""

from __future__ import annotations

import datetime as _dt
import platform
from importlib import metadata


def now_iso() -> str:
    """The current UTC time, ISO 8601 with microseconds."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")


def library_versions() -> dict[str, str]:
    """Versions of the libraries that wrote an artifact (recorded, not hashed)."""
    out = {"python": platform.python_version()}
    for name in ("walla", "numpy", "polars", "pyarrow", "zarr"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "unknown"
    return out
