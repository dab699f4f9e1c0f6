"""The backend registry: the one list of `--backend` names, each mapped to its `BackendKind`.

    backend_kind("hf").load(request)          # extract/run.py, extract/check.py
    register_backend(DUMMY)                   # tests/conftest.py: the seeded fake, for tests only

A new backend is a module with a kind object (extract/backends/__init__.py: `BackendKind`) and one
entry here: walla-extract asks the kind, never compares its name.
"""

from __future__ import annotations

import difflib

from walla.extract.backends import BackendKind
from walla.extract.backends.hf_kind import HF
from walla.extract.backends.vllm import VLLM

BACKEND_KINDS: dict[str, BackendKind] = {kind.name: kind for kind in (HF, VLLM)}
DEFAULT_BACKEND = HF.name  # a model without a backend hint, or whose hinted backend cannot run here


def backend_kind(name: str) -> BackendKind:
    """The registered kind called `name`.

    Raises:
        KeyError: unknown name; the message suggests close matches and lists the registered ones.
    """
    if name not in BACKEND_KINDS:
        close = difflib.get_close_matches(name, list(BACKEND_KINDS), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise KeyError(f"unknown backend {name!r}{hint} (available: {', '.join(BACKEND_KINDS)})")
    return BACKEND_KINDS[name]


def register_backend(kind: BackendKind) -> None:
    """Add a backend kind under its name (a second, different kind with the same name is an error)."""
    if BACKEND_KINDS.get(kind.name, kind) is not kind:
        raise ValueError(f"backend {kind.name!r} is registered already ({BACKEND_KINDS[kind.name]!r})")
    BACKEND_KINDS[kind.name] = kind
