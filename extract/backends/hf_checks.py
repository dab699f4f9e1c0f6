"""The hf backend's one-time checks, cached so a model load reads weights instead of re-checking.

- the self-check (HFBackend.self_check: our head path against the model's own forward) depends on the
  architecture, the weights, the dtype and the library versions, so a pass is cached per model identity
  (the fingerprint's: GGUF sha256, hub commit, local file hash), dtype, device kind, forward path and
  versions; a failure is never cached;
- the GEMM row-invariance probe of batch-invariant scoring (hf_packed.linear_rows_invariant, ~3 s on the
  2-core CPU for SmolLM2 at 8,192 rows) depends on the kernels only: cached per machine (the dtype probe's
  machine key), dtype, layer shapes and classes, and row count.

Both live as small JSON files under `$WALLA_CACHE/hf-checks/`; deleting the folder re-runs them.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import torch
import transformers
from walla.extract import dtype_probe
from walla.extract.backends import hf_packed
from walla.extract.gguf_cache import cache_root
from walla.store import atomic
from walla.store.fingerprint import canonical

log = logging.getLogger(__name__)


def cache_dir() -> Path:
    return cache_root() / "hf-checks"


def _path(kind: str, key: dict, root: Path | None) -> Path:
    text = json.dumps(canonical({"check": kind, **key}), sort_keys=True)
    return (root or cache_dir()) / f"{kind}-{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # absent or unreadable: check again


def _write(path: Path, value: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_json(path, value)
    except OSError as e:  # a read-only cache costs a re-check next time, nothing else
        log.warning("could not cache %s: %s", path, e)


def self_check_once(backend, model_identity: dict, root: Path | None = None) -> bool:
    """Run `backend.self_check()` unless this model passed it before here; returns True when cached.

    Raises:
        RuntimeError: the self-check fails (never cached).
    """
    key = {
        "model": model_identity,
        "class": type(backend.model).__name__,
        "dtype": str(backend.dtype),
        "device": backend.device.type,
        "packed": bool(backend.batch_invariant),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    path = _path("self-check", key, root)
    if _read(path) is not None:
        return True
    err = backend.self_check()
    _write(path, {"max_abs_error": err, **canonical(key)})
    return False


def rows_invariant(model, max_rows: int, root: Path | None = None) -> tuple[bool, str]:
    """hf_packed.linear_rows_invariant, measured once per machine, dtype, layer shapes and row count."""
    w = next(model.parameters())
    linears = [m for m in model.get_decoder().modules() if isinstance(m, torch.nn.Linear)]
    key = {
        "machine": dtype_probe.machine_key(str(w.device)),
        "dtype": str(w.dtype),
        "shapes": sorted({(m.in_features, m.out_features) for m in linears}),
        "classes": sorted({f"{type(m).__module__}.{type(m).__qualname__}" for m in linears}),
        "max_rows": int(max_rows),
        "rows": list(hf_packed.PROBE_ROWS),
    }
    path = _path("rows", key, root)
    hit = _read(path)
    if hit is not None and isinstance(hit.get("invariant"), bool):
        return hit["invariant"], f"{hit.get('why', '')} (cached in {path})"
    ok, why = hf_packed.linear_rows_invariant(model, max_rows)
    _write(path, {"invariant": ok, "why": why})
    return ok, why
